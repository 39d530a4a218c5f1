"""``rag bench serve --engines N``: one service through vLLM's router over
N llama-server workers, for each router policy in turn (``cache_aware``
against ``round_robin`` by default), each over fresh workers, asked by
concurrent clients through the real HTTP service on 127.0.0.1.

Each client holds a conversation of its own (a session: every prompt
begins with the one before, so where a turn is routed decides what is
cached) and asks its turns as streamed ``/v1/ask`` requests, one after
another (closed loop, :func:`rag.bench.serve.run_clients`); client ``c``
asks the bundled conversation ``c`` modulo their number. A turn refused
with a 429 is asked again after its Retry-After (at most 5 asks), so a
conversation goes on from its answers. TTFT is measured by the client,
beside the service's own figure and its prediction.

Per policy: the router (name, version, policy); asks served and refused,
as ``rag bench serve`` counts requests; questions answered, lost (no final
answer) and told by an error; client-side TTFT percentiles against the
target; the cached share of prompt tokens,
from each answer's cost figures; the budget's prediction error and
adherence (as ``rag bench serve`` reports them for one engine); and per
worker, from the worker itself, the requests it started (its log) and
the prompt tokens it evaluated and found cached (its Prometheus
``/metrics``). With ``kill_at``: the worker that had started most requests
is killed (SIGKILL) just before the first client asks its turn
``kill_at``, and the questions lost are set against those that were in
flight on it (nothing in a response names the worker that answered, so
this is counted, not traced).

:func:`run` is the whole of it: the corpus indexed, llama-server found or
built (as the tests do), and for each policy fresh workers, the router and
the service started, measured by :func:`bench_router` (which starts
nothing itself) and stopped.

Does not: assert anything, or measure throughput scaling (on one small
machine the workers share its cores).
"""

from __future__ import annotations

import math
import os
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional, Protocol, Sequence

import httpx

from engine.remote.router import POLICIES, ROUTER_FLAGS

from ..errors import RagError
from ..evaluation.stats import percentile
from . import setup
from .chat import load_conversations
from .setup import Harness
from .serve import GOOD_FACTOR, run_clients, summarise_run

DEFAULT_POLICIES = ("cache_aware", "round_robin")
ENGINE_SLOT_CTX = 4096
MIN_SLOTS = 2  # a conversation's fold, in the background, needs a slot beside the questions
MAX_ASKS = 5  # a turn refused (429) this many times is given up and the conversation goes on
# A line llama-server logs (at its default verbosity) each time a slot takes a request.
STARTED = re.compile(r"launch_slot_: .*processing task")
COUNTERS = {"prompt_tokens": "llamacpp:prompt_tokens_total", "cached_tokens": "llamacpp:prompt_tokens_cached_total",
            "processing": "llamacpp:requests_processing", "deferred": "llamacpp:requests_deferred"}


class Worker(Protocol):
    """A running llama-server the bench may kill: its ``url``, its
    ``log_path``, ``kill()``, ``stop()``, and ``died()``: None while it runs
    or after it was killed on purpose, else one line saying how it ended."""

    url: str
    log_path: Path

    def kill(self) -> None: ...

    def died(self) -> str | None: ...

    def stop(self) -> None: ...


class Router(Protocol):
    """A running router: its ``url``, ``died()`` (as a worker's) and ``stop()``."""

    url: str

    def died(self) -> str | None: ...

    def stop(self) -> None: ...


def router_version() -> str:
    """The installed ``vllm-router``'s version ("unknown" when it cannot be read)."""
    try:
        from vllm_router.version import __version__

        return str(__version__)
    except Exception:  # noqa: BLE001 - a launcher that moved its version: the package's metadata says it
        import importlib.metadata as md

        try:
            return md.version("vllm-router")
        except md.PackageNotFoundError:
            return "unknown"


def worker_metrics(url: str) -> dict[str, float]:
    """A worker's counters from its Prometheus ``/metrics`` (llama-server
    started with ``--metrics``), under the names of :data:`COUNTERS`; empty
    when it does not answer."""
    try:
        text = httpx.get(f"{url}/metrics", timeout=10).text
    except httpx.HTTPError:
        return {}
    values = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#") and " " in line)
    return {name: float(values[key]) for name, key in COUNTERS.items() if key in values}


def requests_started(worker: Worker) -> int:
    """How many requests ``worker`` has taken into a slot, by its log."""
    try:
        text = Path(worker.log_path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return 0
    return sum(1 for line in text.splitlines() if STARTED.search(line))


def worker_reading(worker: Worker) -> dict[str, float]:
    """What a worker says of itself now: requests started, and its counters."""
    return {"requests": requests_started(worker), **worker_metrics(worker.url)}


class Conversations:
    """The clients' work: client ``c`` asks ``turns`` turns of conversation
    ``c`` modulo their number in its own session. A turn refused with a 429
    is asked again (after its Retry-After), at most :data:`MAX_ASKS` times
    in all, as a person would ask again: a conversation goes on from its
    answers. Just before the first client first asks turn ``kill_at`` (if
    given), ``kill()`` is called, once, and what it returns kept
    (``kill``)."""

    def __init__(self, conversations: Sequence[Sequence[str]], turns: int, body: dict, session_prefix: str,
                 kill_at: int | None, kill: Callable[[], dict]) -> None:
        self.conversations, self.turns, self.body = conversations, turns, body
        self.session_prefix, self.kill_at, self._kill = session_prefix, kill_at, kill
        self._lock = threading.Lock()
        self.kill: dict | None = None

    def next_request(self, client: int, last: dict | None) -> tuple[dict, dict] | None:
        """The body and tags of ``client``'s next question after ``last``
        (its previous row; None: none yet), or None when it has asked all
        its turns; a worker is killed first where that turn is due."""
        turn, attempt = 1, 1
        if last is not None:
            again = last["status"] == 429 and last["attempt"] < MAX_ASKS
            turn, attempt = (last["turn"], last["attempt"] + 1) if again else (last["turn"] + 1, 1)
        if turn > self.turns:
            return None
        if turn == self.kill_at:
            with self._lock:
                if self.kill is None:
                    self.kill = self._kill()
        conversation = client % len(self.conversations)
        body = self.body | {"question": self.conversations[conversation][turn - 1],
                            "session": f"{self.session_prefix}-{client}"}
        return body, {"conversation": conversation, "turn": turn, "attempt": attempt}


def bench_router(
    start_workers: Callable[[], list[Worker]],
    start_router: Callable[[list[str], str], Router],
    serve: Callable[[str, Path], tuple[str, Callable[[], None]]],
    conversations: Sequence[Sequence[str]],
    *,
    policies: Sequence[str] = DEFAULT_POLICIES,
    clients: int = 8,
    turns: int = 10,
    kill_at: int | None = None,
    target_ttft: float = 2.0,
    max_tokens: int = 32,
    workdir: Path,
    progress: Callable[[str], None] | None = None,
) -> dict[str, object]:
    """For each policy: ``start_workers()``, ``start_router(urls, policy)``
    over them, ``serve(router_url, folder)`` (the service's URL and a
    function stopping it), then ``clients`` concurrent clients each asking
    ``turns`` turns of a conversation (:class:`Conversations`); everything
    stopped after. The bench object of ``rag bench serve --engines``: a row
    per question, a run per policy, and the comparison of the first two
    policies' cached shares (``cache_aware`` over ``round_robin``)."""
    rows: list[dict[str, object]] = []
    runs: list[dict[str, object]] = []
    version = router_version()
    for policy in policies:
        mine, summary = _one_policy(start_workers, start_router, serve, conversations, policy, clients, turns,
                                    kill_at, target_ttft, max_tokens, workdir / policy, progress)
        rows.extend(mine)
        runs.append({"router": "vllm-router", "router_version": version} | summary)
    by = {r["policy"]: r for r in runs}
    return {
        "bench": "serve",
        "config": {"mode": "router", "router": "vllm-router", "router_version": version,
                   "router_flags": list(ROUTER_FLAGS), "policies": list(policies), "clients": clients,
                   "turns": turns, "conversations": len(conversations), "kill_one_at": kill_at,
                   "target_ttft_s": target_ttft, "max_tokens": max_tokens,
                   "schedule": "each client its own session through one conversation, closed loop"},
        "rows": rows,
        "summary": {  # each policy's figures are in its run; the cached shares side by side
            "router": f"vllm-router {version}",
            "cached_share": {p: by[p]["cached_share"] for p in by},
            "cache_aware_over_round_robin": cached_ratio(by, "cache_aware", "round_robin"),
            "runs": runs,
        },
    }


def cached_ratio(by: dict[str, dict], a: str, b: str) -> float | None:
    """Policy ``a``'s cached share over ``b``'s (None without both, or when ``b``'s is 0)."""
    if a not in by or b not in by or not by[b]["cached_share"]:
        return None
    return round(by[a]["cached_share"] / by[b]["cached_share"], 2)


def _one_policy(start_workers, start_router, serve, conversations, policy: str, clients: int, turns: int,
                kill_at: int | None, target_ttft: float, max_tokens: int, folder: Path,
                progress) -> tuple[list[dict], dict]:
    """One policy over fresh workers: its rows and its figures."""
    workers = start_workers()
    try:
        router = start_router([w.url for w in workers], policy)
        try:
            url, stop = serve(router.url, folder)
            try:
                if progress:
                    progress(f"{policy}: {clients} clients x {turns} turns through {router.url}")
                rows, wall, kill, before, after = _ask(url, workers, conversations, policy, clients, turns, kill_at,
                                                       target_ttft, max_tokens)
            finally:
                stop()
            _check_alive(workers, router, policy)
        finally:
            router.stop()
    finally:
        for worker in workers:
            worker.stop()
    rows = [r | {"policy": policy} for r in rows]
    summary = policy_summary(rows, wall, clients, target_ttft, workers, before, after, kill)
    if progress:
        progress(f"{policy}: {summary['answered']} of {summary['questions']} questions answered "
                 f"({summary['rejected_429']} asks refused), {summary['lost']} lost")
    return rows, {"policy": policy} | summary


def _ask(url: str, workers: list[Worker], conversations, policy: str, clients: int, turns: int, kill_at: int | None,
         target_ttft: float, max_tokens: int):
    """The clients' run: rows, wall time, the kill (None without one), and
    each worker's reading before and after (the killed one's just before it
    died)."""
    before = {w.url: worker_reading(w) for w in workers}
    after: dict[str, dict] = {}

    def kill() -> dict:
        started = {w.url: requests_started(w) - before[w.url]["requests"] for w in workers}
        victim = max(workers, key=lambda w: started[w.url])  # the first of those tied
        reading = worker_reading(victim)
        after[victim.url] = reading
        at = time.perf_counter()  # before it dies: what ends from here on ended with it
        victim.kill()
        return {"worker": victim.url, "chosen_by": "most requests started since the run began (its log)",
                "requests_started": started, "at_s": round(at - origin, 4),
                "in_flight_on_it": int(reading.get("processing", 0) + reading.get("deferred", 0))}

    body = {"max_tokens": max_tokens, "target_ttft_s": target_ttft, "stream": True}
    work = Conversations(conversations, turns, body, f"bench-{policy}-{int(time.time() * 1000) % 10**8}",
                         kill_at, kill)
    origin = time.perf_counter()
    rows, wall = run_clients(url, clients, work.next_request, origin=origin)
    for w in workers:
        after.setdefault(w.url, worker_reading(w))
    killed = work.kill | {"before_turn": kill_at} if work.kill is not None else None
    return sorted(rows, key=lambda r: r["sent_s"]), wall, killed, before, after


def _check_alive(workers: list[Worker], router: Router | None, policy: str) -> None:
    """RagError naming the worker (or the router) that ended without being
    killed: a run over a crashed engine measures nothing it claims to."""
    for process in [*workers, *([router] if router is not None else [])]:
        how = process.died()
        if how:
            raise RagError(f"{policy}: {how}; the bench stopped (its figures would measure a crashed engine)")


def is_lost(row: dict) -> bool:
    """No final answer, and not refused with a 429 (a refusal is counted apart)."""
    return row["status"] not in (200, 429)


def is_told(row: dict) -> bool:
    """Lost with a clear error: an error event, or an HTTP error status."""
    return isinstance(row["status"], int) or str(row["status"]).startswith("error event")


def cached_share(rows: Sequence[dict]) -> float | None:
    """Cached prompt tokens over prompt tokens, summed over ``rows`` that
    carry both (None when none does)."""
    counted = [r for r in rows if r.get("prompt_tokens")]
    if not counted:
        return None
    return round(sum(int(r["cached_tokens"] or 0) for r in counted) / sum(int(r["prompt_tokens"]) for r in counted), 3)


def kill_figures(rows: Sequence[dict], kill: dict) -> dict[str, object]:
    """What the kill cost: the questions lost, split by where they stood
    when it came (in flight, sent after it, ended before it), and how many
    of them cannot have been in flight on the killed worker: every one sent
    after the kill, and those in flight beyond the requests the worker
    itself had in flight."""
    at = kill["at_s"]
    in_flight = [r for r in rows if r["sent_s"] < at < r["done_s"]]
    lost = [r for r in rows if is_lost(r)]
    lost_in_flight = sum(1 for r in lost if r["sent_s"] < at < r["done_s"])
    lost_after = sum(1 for r in lost if r["sent_s"] >= at)
    return kill | {
        "questions_in_flight": len(in_flight),
        "lost_in_flight": lost_in_flight,
        "lost_sent_after": lost_after,
        "lost_before": sum(1 for r in lost if r["done_s"] <= at),
        "lost_not_in_flight_on_it": lost_after + max(0, lost_in_flight - int(kill["in_flight_on_it"])),
    }


def worker_figures(workers: list[Worker], before: dict, after: dict) -> list[dict[str, object]]:
    """Per worker, over the run: requests started, prompt tokens evaluated
    and found cached (its own counters: questions, folds and their
    prefills alike)."""
    figures = []
    for w in workers:
        b, a = before[w.url], after[w.url]
        figures.append({"url": w.url, "requests": int(a.get("requests", 0) - b.get("requests", 0)),
                        "prompt_tokens_evaluated": int(a.get("prompt_tokens", 0) - b.get("prompt_tokens", 0)),
                        "prompt_tokens_cached": int(a.get("cached_tokens", 0) - b.get("cached_tokens", 0))})
    return figures


def question_figures(rows: Sequence[dict]) -> dict[str, object]:
    """Per question (a client's turn, however often it was asked): how many
    there were, answered (at the first ask, or at all), lost, given up
    after :data:`MAX_ASKS` refusals, and the wait from its first ask to its
    answer's first text (the person's wait, refusals included)."""
    asks: dict[tuple[int, int], list[dict]] = {}
    for r in rows:
        asks.setdefault((r["client"], r["turn"]), []).append(r)
    answered = {key: next(r for r in mine if r["status"] == 200) for key, mine in asks.items()
                if any(r["status"] == 200 for r in mine)}
    waits = [a["sent_s"] + float(a["ttft_s"]) - min(r["sent_s"] for r in asks[key]) for key, a in answered.items()]
    return {
        "questions": len(asks), "answered": len(answered),
        "answered_share": round(len(answered) / len(asks), 3) if asks else 0.0,
        "answered_first_ask": sum(1 for a in answered.values() if a["attempt"] == 1),
        "given_up": sum(1 for mine in asks.values() if all(r["status"] == 429 for r in mine)),
        "p95_wait_to_first_text_s": percentile(waits, 0.95),
    }


def policy_summary(rows: list[dict], wall: float, clients: int, target_ttft: float, workers: list[Worker],
                   before: dict, after: dict, kill: dict | None) -> dict[str, object]:
    """One policy's figures. Over requests (each ask), as ``rag bench
    serve`` counts them: served and refused, client-side TTFT against the
    target, goodput, the budget's prediction error and adherence. Over
    questions (:func:`question_figures`): answered, lost (no final answer)
    and told by an error, given up. The cached shares (answers' and
    workers'), per-worker figures, and the kill's."""
    served = [r for r in rows if r["status"] == 200]
    base = summarise_run(rows, wall, clients, "router", target_ttft)
    per_worker = worker_figures(workers, before, after)
    evaluated = sum(w["prompt_tokens_evaluated"] for w in per_worker)
    cached = sum(w["prompt_tokens_cached"] for w in per_worker)
    lost = [r for r in rows if is_lost(r)]
    p95 = base["p95_ttft_s"]
    return {
        "requests": len(rows), "served": base["served"], "served_share": base["served_share"],
        "rejected_429": base["rejected_429"], **question_figures(rows),
        "lost": len(lost), "errors": sum(1 for r in lost if is_told(r)),
        "lost_silently": sum(1 for r in lost if not is_told(r)),
        "p50_ttft_s": base["p50_ttft_s"], "p95_ttft_s": p95,
        "p95_over_target": round(p95 / target_ttft, 3) if p95 is not None else None,
        "within_1_2_target_share": round(sum(1 for r in served if float(r["ttft_s"]) <= GOOD_FACTOR * target_ttft)
                                         / len(served), 3) if served else None,
        "engine_p50_ttft_s": percentile([float(r["engine_ttft_s"]) for r in served if r.get("engine_ttft_s")], 0.5),
        "cached_share": cached_share(served),
        "cached_share_workers": round(cached / (cached + evaluated), 3) if cached + evaluated else None,
        "pred_err_p50": base["pred_err_p50"], "pred_err_p95": base["pred_err_p95"],
        "adherence_p50": base["adherence_p50"], "adherence_p95": base["adherence_p95"],
        "goodput_rps": base["goodput_rps"], "mean_chunks": base["mean_chunks"],
        "degraded_share": base["degraded_share"], "wall_s": base["wall_s"],
        "requests_per_worker": {w["url"]: w["requests"] for w in per_worker},
        "workers": per_worker,
        "kill": kill_figures(rows, kill) if kill else None,
    }


def run(h: Harness, corpus: Path, include: Sequence[str], *, engines: int,
        policies: Sequence[str] = DEFAULT_POLICIES, clients: int = 8, turns: int = 10,
        kill_at: Optional[int] = None, target_ttft: float = 2.0, max_tokens: int = 32,
        index: Optional[Path] = None, model: Optional[Path] = None) -> dict[str, object]:
    """``rag bench serve --engines N``: ``corpus`` indexed once, then for
    each router policy ``engines`` fresh llama-server workers (sharing this
    machine's cores), ``vllm-router`` over them and a service through the
    router on 127.0.0.1 (as ``rag serve --engine-url ROUTER_URL``), asked by
    ``clients`` concurrent clients the bundled Python-docs conversations
    (:func:`bench_router`). A RagError, before anything starts, for values
    out of range or without ``vllm-router``."""
    from engine.models import default_model_path
    from engine.remote.router import RouterProcess, how_to_start, router_binary

    from engine.remote.llama_server import LlamaServer, server_binary
    from .serve import bench_service_settings

    conversations = load_conversations(setup.BENCH_DATA / "python_docs_chat.json")
    _check_values(engines, policies, clients, turns, kill_at, min(len(c) for c in conversations))
    if router_binary() is None:
        raise RagError(how_to_start([f"http://127.0.0.1:{8080 + i}" for i in range(engines)]))
    p = setup.bench_pipeline(h, corpus, include, index, model)  # the index, brought up to date once
    p.close()
    gguf = model or default_model_path()
    server_binary()  # built once, before anything is timed
    threads = max(1, (os.cpu_count() or 2) // engines)  # the workers share this machine's cores
    slots = max(MIN_SLOTS, math.ceil(clients / engines))  # room for each worker's share of the conversations
    s = p.settings  # the bench pipeline's: its index, and every question asked of the model

    def start_workers() -> list[LlamaServer]:
        started: list[LlamaServer] = []
        try:
            for _ in range(engines):
                started.append(LlamaServer(gguf, n_ctx=slots * ENGINE_SLOT_CTX, slots=slots, threads=threads,
                                           extra=("--metrics",)))
        except BaseException:
            for worker in started:
                worker.stop()
            raise
        return started

    def serve(router_url: str, folder: Path):
        from ..service import LoopbackServer, create_app

        folder.mkdir(parents=True, exist_ok=True)
        # As `rag serve --engine-url ROUTER_URL` would open it; its own profile folder, so each policy
        # starts from the same quick calibration and the user's profiles are left alone.
        pipeline = h.open(s.model_copy(update={"engine": s.engine.changed(engine_url=router_url)}), conversations=folder / "conversations.sqlite",
                          kv_dir=False, profile_dir=folder / "profiles")
        try:
            pipeline.prepare()
            server = LoopbackServer(create_app(pipeline, bench_service_settings("off")))
        except BaseException:
            pipeline.close()  # and the engine it opened: the router's client
            raise

        def stop() -> None:
            server.stop()
            pipeline.close()

        return server.url, stop

    with tempfile.TemporaryDirectory(prefix="rag-bench-router-") as tmp:
        result = bench_router(start_workers, lambda urls, policy: RouterProcess(urls, policy=policy), serve,
                              conversations, policies=policies, clients=clients, turns=turns, kill_at=kill_at,
                              target_ttft=target_ttft, max_tokens=max_tokens, workdir=Path(tmp), progress=h.line)
    result["config"] |= {"engines": engines, "engine_threads": threads, "engine_slots": slots,
                         "engine_slot_ctx": ENGINE_SLOT_CTX, "model": str(gguf)}
    return result


def _check_values(engines: int, policies: Sequence[str], clients: int, turns: int, kill_at: int | None,
                  longest: int) -> None:
    """A RagError saying which value is out of range, if one is."""
    if not 1 <= engines <= 8 or not 1 <= clients <= 64 or not 1 <= turns <= longest:
        raise RagError(f"--engines: 1 to 8; --clients: one number, 1 to 64; --turns: 1 to {longest}")
    if kill_at is not None and not 1 <= kill_at <= turns:
        raise RagError("--kill-one-at: a turn between 1 and --turns")
    if kill_at is not None and engines < 2:
        raise RagError("--kill-one-at needs at least two engines: one must be left to answer")
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        raise RagError(f"--policies: unknown {', '.join(unknown) or '(none given)'}; use {', '.join(POLICIES)}")

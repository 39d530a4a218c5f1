"""``rag bench serve``: closed-loop clients on 127.0.0.1 against real
servers of one model, for each number of clients and each server set-up.

TTFT is measured by the clients, from the request leaving to the first
streamed piece. A client told 429 waits its Retry-After (at most 2 s) and
counts the request as rejected, by the refusal's type (``rate_limited``:
the caller's limits; ``overloaded``: admission); a stream that ends without
its answer (or with an error event) counts as an error. All clients come
from one address (127.0.0.1), as a team behind a NAT or a proxy does.

An upload may go beside the first run (``during``: ingested while it is
answered) or just before it (``before``: posted and the documents listed
again, as the page does, then the run starts).

Each run also reports the engine's side where the system has one: its
decode tokens per decode step (the batch size) from the engine's counters.

:func:`run` is the whole of ``rag bench serve``: the corpus indexed, the
servers started over it (the deadline scheduler, and one request at a time
as before), measured by :func:`bench_serve` (which starts nothing: it is
given their URLs), and stopped; with ``engines``, :func:`rag.bench.pool.run`;
with ``url``, a server already running measured as it is.

Does not: assert anything.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import httpx

from engine.backend import StepCounters

from ..errors import RagError
from ..evaluation.stats import percentile
from . import setup
from .setup import Harness

if TYPE_CHECKING:
    from ..qa.pipeline import Pipeline


GOOD_FACTOR = 1.2  # an answer counts as good within this many times its target
RETRY_WAIT_CAP_S = 2.0  # a client told 429 waits its Retry-After, at most this long, before its next request
UPLOAD_AT = ("during", "before")
LIMITS = ("off", "default")  # the servers' caller limits: none, or as `rag serve` starts


def physical_bound(pipeline, question: str, target_ttft: float) -> dict[str, float]:
    """How many questions with no passages this machine can start within one
    target window: the calibrated prefill rate x the target / the tokens such
    a question must prefill (its prompt less the cached system prefix)."""
    from prompt_budget import PromptShape, build_messages

    backend, cost = pipeline.backend, pipeline.cost_model
    tokens = backend.tokenize(backend.render(build_messages(question, [])))
    cached = backend.cached_prefix(tokens)
    new = len(tokens) - cached
    rate = new / cost.predict(PromptShape(new, cached))
    return {"bare_prompt_tokens": len(tokens), "bare_new_tokens": new, "prefill_tok_s": round(rate, 1),
            "requests_per_window": round(rate * target_ttft / new, 2)}


def warm_store(pipeline, questions: Sequence[str], target_ttft: float) -> float | None:
    """With passage KV reuse on, answer each question once, one at a time,
    and wait until the engine has stored the passages they used or wished
    for: the seconds that took (None when the engine does not splice)."""
    from ..qa.passages import splicing
    from .ttft import settle

    if splicing(pipeline.backend) is None:
        return None
    began = time.perf_counter()
    for question in questions:
        pipeline.ask(question, target_ttft=target_ttft, max_tokens=1)
    settle(pipeline)
    return round(time.perf_counter() - began, 1)


def ask_streamed(http: httpx.Client, body: dict) -> dict[str, object]:
    """One streamed ``/v1/ask``: status, client-side TTFT (the first text,
    not the evidence event before it, whose time is ``evidence_s``) and the
    final answer (or what went wrong)."""
    sent = time.perf_counter()
    ttft, evidence, answer, status, retry, detail, refusal = None, None, None, None, 0.0, None, None
    try:
        with http.stream("POST", "/v1/ask", json=body) as r:
            status = r.status_code
            if status == 429:
                retry = float(r.headers.get("retry-after", "1"))
                r.read()
                detail, refusal = _message(r), _error_type(r)
            elif status == 200:
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    event = json.loads(line[6:])
                    if "evidence" in event:  # before the first token: shown, but not the answer's text
                        evidence = time.perf_counter() - sent if evidence is None else evidence
                        continue
                    if ttft is None:
                        ttft = time.perf_counter() - sent
                    if "answer" in event:
                        answer = event["answer"]
                    elif "error" in event:
                        status = f"error event: {event['error'].get('message', '')[:80]}"
                if status == 200 and answer is None:
                    status = "error: the stream ended without its answer"
            else:
                r.read()
    except (httpx.HTTPError, ValueError) as exc:
        status = f"error: {type(exc).__name__}"
    return {"status": status, "ttft_s": round(ttft, 4) if ttft is not None else None,
            "evidence_s": round(evidence, 4) if evidence is not None else None,
            "total_s": round(time.perf_counter() - sent, 4), "answer": answer, "retry_after_s": retry,
            "detail": detail, "refusal": refusal}


def _message(response: httpx.Response) -> str | None:
    """The error message of a JSON error body, if it has one."""
    try:
        return str(response.json()["error"]["message"])[:160]
    except (ValueError, KeyError, TypeError):
        return None


def _error_type(response: httpx.Response) -> str | None:
    """The error type of a JSON error body (``rate_limited``, ``overloaded``, ...), if it has one."""
    try:
        return str(response.json()["error"]["type"])
    except (ValueError, KeyError, TypeError):
        return None


def _answer_figures(answer: dict | None) -> dict[str, object]:
    """What a row keeps of an answer: the passages, the plan under load,
    the engine's side of the wait (its measured TTFT beside the predicted
    one) and the prompt's tokens, cached and not."""
    if not answer:
        return {"chunks": None, "cut_for_load": None, "decode_tokens": 0}
    budget, timings = answer["budget"], answer["timings"]
    return {"chunks": budget["chosen"], "cut_for_load": budget.get("cut_for_load", 0),
            "decode_tokens": timings["decode_tokens"], "predicted_ttft_s": budget.get("predicted_ttft_s"),
            "load_wait_s": budget.get("load_wait_s"), "engine_ttft_s": timings.get("ttft_s"),
            "queue_s": timings.get("queue_s"), "prompt_tokens": timings.get("prompt_tokens"),
            "cached_tokens": timings.get("cached_tokens"), "prefill_tokens": timings.get("prefill_tokens")}


def run_clients(url: str, clients: int, next_request: Callable[[int, dict | None], tuple[dict, dict] | None], *,
                origin: float | None = None, headers_of: Callable[[int], dict] | None = None
                ) -> tuple[list[dict], float]:
    """``clients`` closed-loop clients against ``url``: client ``c`` sends
    the streamed ``/v1/ask`` body of ``next_request(c, its last row or
    None)`` (called just before it is sent) as soon as its previous answer
    is out (after a 429, once its Retry-After, at most
    :data:`RETRY_WAIT_CAP_S`, has passed), until that gives None. Each
    row: :func:`ask_streamed`'s outcome, the answer's figures, the tags
    given beside the body, and when it was sent and done (seconds from
    ``origin``, a perf_counter instant; default: when the clients start).
    ``headers_of(c)``: client ``c``'s HTTP headers (its key). Returns the
    rows and the wall time."""
    results: list[dict[str, object]] = []
    lock = threading.Lock()
    started = time.perf_counter() if origin is None else origin

    def client(number: int) -> None:
        row = None
        with httpx.Client(base_url=url, timeout=300, headers=headers_of(number) if headers_of else None) as http:
            while True:
                request = next_request(number, row)
                if request is None:
                    return
                body, tags = request
                sent = time.perf_counter() - started
                outcome = ask_streamed(http, body)
                answer = outcome.pop("answer")
                row = outcome | {"client": number} | tags | _answer_figures(answer) | {
                    "sent_s": round(sent, 4), "done_s": round(sent + float(outcome["total_s"]), 4)}
                with lock:
                    results.append(row)
                if row["status"] == 429:
                    time.sleep(min(float(row["retry_after_s"]), RETRY_WAIT_CAP_S))

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.perf_counter() - started


def _run(url: str, questions: Sequence[str], clients: int, requests: int, body: dict,
         lanes: Sequence[tuple[str, str]] = ()) -> tuple[list[dict], float]:
    """``requests`` requests from ``clients`` closed-loop clients, the
    questions in turn; their rows and the wall time. ``lanes``: ``(key,
    collection)`` pairs, client ``c`` asking with the ``c``-th (in turn) in
    its collection, each row tagged with it."""
    lock = threading.Lock()
    counter = iter(range(requests))

    def next_request(number: int, last: dict | None) -> tuple[dict, dict] | None:
        with lock:
            i = next(counter, None)
        if i is None:
            return None
        lane = {"collection": lanes[number % len(lanes)][1]} if lanes else {}
        return body | {"question": questions[i % len(questions)]} | lane, lane

    headers = (lambda c: {"Authorization": f"Bearer {lanes[c % len(lanes)][0]}"}) if lanes else None
    return run_clients(url, clients, next_request, headers_of=headers)


def bench_serve(
    systems: Sequence[tuple[str, str, Callable[[], dict] | None]],
    questions: Sequence[str],
    *,
    clients: Sequence[int] = (1, 4, 8),
    requests: int = 24,
    target_ttft: float = 2.0,
    max_tokens: int = 32,
    bound: dict[str, float] | None = None,
    progress: Callable[[str], None] | None = None,
    store_warmed_s: dict[str, float | None] | None = None,
    upload: tuple[str, bytes] | None = None,
    ready_s: dict[str, float] | None = None,
    upload_at: str = "during",
    limits: str | None = None,
    lanes: Sequence[tuple[str, str]] = (),
) -> dict[str, object]:
    """For each client count and each ``(name, url, engine counters)`` in
    ``systems``, ``requests`` requests in all: client-side TTFT percentiles,
    goodput (answers within 1.2 x target per second), served, degraded (cut
    for load), refused and failed shares, decode tokens per second, and the
    mean batch size of the engine's decode steps. ``store_warmed_s``: the
    seconds each system spent storing passages before the runs, if it did.
    ``upload``: a ``(name, bytes)`` document posted to each server as its
    first run starts, ingested while that run's questions are answered
    (``upload_at="during"``), or just before it, answered and the documents
    listed before the first question (``"before"``). ``ready_s``: each
    freshly started server's seconds until /healthz said ok. ``limits``:
    the servers' caller limits, as a label for the report. ``lanes``: each
    client's key and collection (see :func:`_run`)."""
    if upload_at not in UPLOAD_AT:
        raise ValueError(f"upload_at: one of {', '.join(UPLOAD_AT)}, not {upload_at!r}")
    runs: list[dict[str, object]] = []
    rows: list[dict[str, object]] = []
    body = {"max_tokens": max_tokens, "target_ttft_s": target_ttft, "stream": True}
    for n in clients:
        for name, url, counters in systems:
            before = counters() if counters else None
            uploading = _Upload(url, upload) if upload is not None and n == clients[0] else None
            if uploading is not None and upload_at == "before":
                uploading.result()  # answered, and the list read again, before the first question
            results, wall = _run(url, questions, n, requests, body, lanes)
            after = counters() if counters else None
            run = summarise_run(results, wall, n, name, target_ttft, before, after)
            if uploading is not None:
                run |= uploading.result()
            runs.append(run)
            rows.extend(r | {"clients": n, "system": name} for r in results)
            if progress:
                progress(f"{n} clients, {name}: done")
    return {
        "bench": "serve",
        "config": {"clients": list(clients), "requests": requests, "target_ttft_s": target_ttft,
                   "max_tokens": max_tokens, "systems": [name for name, _, _ in systems],
                   "store_warmed_s": store_warmed_s or {}, "upload": upload[0] if upload else None,
                   "upload_at": upload_at if upload else None, "limits": limits, "fresh_ready_s": ready_s or {},
                   "collections": sorted({c for _, c in lanes})},
        "rows": rows,
        "summary": {"runs": runs, "bound": bound},
    }


class _Upload:
    """A document posted to a server on a thread of its own, beside a run."""

    def __init__(self, url: str, document: tuple[str, bytes]) -> None:
        self._found: dict[str, object] = {}
        self._thread = threading.Thread(target=self._post, args=(url, document))
        self._thread.start()

    def _post(self, url: str, document: tuple[str, bytes]) -> None:
        began = time.perf_counter()
        try:
            r = httpx.post(f"{url}/v1/documents", files={"file": document}, timeout=900)
            self._found = {"upload_status": r.status_code}
            if r.status_code == 200:  # the page lists the documents again after each upload
                self._found["list_status"] = httpx.get(f"{url}/v1/documents", timeout=300).status_code
        except httpx.HTTPError as exc:
            self._found = {"upload_status": None, "upload_error": str(exc)}
        self._found["upload_s"] = round(time.perf_counter() - began, 2)

    def result(self) -> dict[str, object]:
        """The upload's HTTP status and seconds, once it has ended."""
        self._thread.join()
        return self._found


def wait_ready(url: str, started: float, timeout_s: float = 900) -> float:
    """Seconds from ``started`` (a perf_counter instant) until ``url``'s
    /healthz says ok, polled as a client would."""
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=5).status_code == 200:
                return time.perf_counter() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} was not ready after {timeout_s:g} s")


def summarise_run(results: list[dict], wall: float, clients: int, name: str, target_ttft: float,
                  before: dict | None = None, after: dict | None = None) -> dict[str, object]:
    """One run's figures: client-side TTFT percentiles and goodput, served,
    refused and failed counts, decode tokens per second, the engine's decode
    batch (from its counters ``before`` and ``after``, where it has them),
    and the budget's side: how far the service's measured TTFT was from the
    predicted one (``pred_err``: |measured - predicted| / measured) and from
    the target (``adherence``: measured / target), over the served answers."""
    served = [r for r in results if r["status"] == 200]
    ttfts = [float(r["ttft_s"]) for r in served]
    good = sum(1 for x in ttfts if x <= GOOD_FACTOR * target_ttft)
    steps = (after["decode_steps"] - before["decode_steps"]) if before and after else 0
    decoded = (after["decode_tokens"] - before["decode_tokens"]) if before and after else 0
    return {
        "clients": clients, "system": name, "target_s": target_ttft,
        "p50_ttft_s": percentile(ttfts, 0.5), "p95_ttft_s": percentile(ttfts, 0.95),
        "goodput_rps": round(good / wall, 3),
        "tok_s": round(sum(int(r["decode_tokens"]) for r in served) / wall, 2),
        "errors": sum(1 for r in results if r["status"] not in (200, 429)),
        "rejected_429": sum(1 for r in results if r["status"] == 429),
        "refused": dict(Counter(str(r.get("refusal")) for r in results if r["status"] == 429)),
        "over_share": round(sum(1 for x in ttfts if x > target_ttft) / len(ttfts), 3) if ttfts else None,
        "served": len(served),
        "served_share": round(len(served) / len(results), 3) if results else 0.0,
        "degraded_share": round(sum(1 for r in served if r["cut_for_load"]) / len(served), 3) if served else None,
        "mean_chunks": round(sum(int(r["chunks"]) for r in served) / len(served), 2) if served else None,
        "mean_decode_batch": round(decoded / steps, 2) if steps else None,
        "wall_s": round(wall, 2),
        **prediction_figures(served, target_ttft),
    }


def prediction_figures(served: Sequence[dict], target_ttft: float) -> dict[str, float | None]:
    """How the budget did on ``served`` rows that carry the service's
    measured TTFT (``engine_ttft_s``) and its prediction: the prediction
    error's median and 95th percentile, and the measured TTFT over the
    target at both (None where no row carries both figures)."""
    pairs = [(float(r["engine_ttft_s"]), float(r["predicted_ttft_s"])) for r in served
             if r.get("engine_ttft_s") and r.get("predicted_ttft_s") is not None]
    errors = [abs(measured - predicted) / measured for measured, predicted in pairs]
    ratios = [measured / target_ttft for measured, _ in pairs]
    return {"pred_err_p50": percentile(errors, 0.5), "pred_err_p95": percentile(errors, 0.95),
            "adherence_p50": percentile(ratios, 0.5), "adherence_p95": percentile(ratios, 0.95)}


def run(h: Harness, corpus: Path, include: Sequence[str], *, clients: Sequence[int] = (1, 4, 8), requests: int = 24,
        target_ttft: float = 2.0, max_tokens: int = 32, slots: int = 8, index: Optional[Path] = None,
        model: Optional[Path] = None, only: Sequence[str] = (), warm_passages: bool = False, fresh: bool = False,
        upload: Optional[Path] = None, upload_at: str = "during", limits: str = "off",
        collections: int = 0, url: Optional[str] = None) -> dict[str, object]:
    """``rag bench serve``: ``corpus`` indexed, two servers over it on
    127.0.0.1 (or those of ``only``, see :func:`serving`), the bundled
    Python-docs conversations' questions asked by ``clients`` concurrent
    clients (:func:`bench_serve`), the servers stopped. ``warm_passages``:
    each system answers the questions once and stores their passages first;
    ``fresh``: each server starts cold and its first run begins as soon as
    /healthz says ok; ``upload``: that document posted beside (or, with
    ``upload_at="before"``, just before) the first run; ``limits``: the
    servers' caller limits. ``collections`` (1 or 2): a team on one
    service: the corpus in that many collections (the second ingested as
    "second", removed again at the end), each with a key that may read it
    alone, the clients taking them in turn. ``url``: instead, the server
    already running there (one that asks no key) is measured as it is:
    nothing indexed or started, no bound, its own limits. A RagError,
    before anything starts, for values out of range."""
    from .chat import load_conversations

    if max(clients) > 64 or not 1 <= requests <= 10_000 or target_ttft <= 0:
        raise RagError("--clients: at most 64; --requests: 1 to 10000; --target-ttft: positive seconds")
    if limits not in LIMITS:
        raise RagError(f"--limits: {' or '.join(LIMITS)}, not {limits!r}")
    if upload_at not in UPLOAD_AT or (upload_at != "during" and upload is None):
        raise RagError(f"--upload-at: {' or '.join(UPLOAD_AT)}, with --upload FILE")
    if collections not in (0, 1, 2):
        raise RagError("--collections: 1 or 2")
    if url is not None and (collections or fresh or warm_passages or only or limits != "off"
                            or not url.startswith(("http://", "https://"))):
        raise RagError("--url: an http(s) URL of a server already running, measured as it is (no --system, --fresh, "
                       "--warm-store, --limits or --collections)")
    questions = [q for c in load_conversations(setup.BENCH_DATA / "python_docs_chat.json") for q in c]
    warmed: dict[str, float | None] = {}
    document = (upload.name, read_upload(upload)) if upload is not None else None
    if url is not None:
        result = bench_serve([(url, url.rstrip("/"), None)], questions, clients=clients, requests=requests,
                             target_ttft=target_ttft, max_tokens=max_tokens, progress=h.line, upload=document,
                             upload_at=upload_at)
        result["config"]["url"] = url
        return result

    lanes = _lanes(collections)

    def prepared(name: str, p: Pipeline) -> None:
        if collections == 2 and "second" not in p.collections():
            p.ingest([corpus], include=include, collection="second")
        if warm_passages:
            warmed[name] = warm_store(p, questions[:requests], target_ttft)

    with tempfile.TemporaryDirectory(prefix="rag-bench-serve-") as tmp, \
            serving(h, corpus, include, index, model, slots, Path(tmp), only, prepared, fresh, limits,
                    _key_file(lanes, Path(tmp))) as (systems, pipeline):
        ready = {name: wait_ready(url, started) for name, url, _, started in systems}
        systems = [(name, url, counters) for name, url, counters, _ in systems]
        # A fresh server's first run must meet it as it starts, not after the bound is measured on it.
        bound = None if fresh else physical_bound(pipeline, questions[0], target_ttft)
        try:
            return bench_serve(systems, questions, clients=clients, requests=requests, target_ttft=target_ttft,
                               max_tokens=max_tokens, bound=bound, progress=h.line, store_warmed_s=warmed,
                               upload=document, ready_s=ready if fresh else None, upload_at=upload_at, limits=limits,
                               lanes=lanes)
        finally:
            if collections == 2:  # the bench's index is a cache other runs read: as it was
                pipeline.remove_collection("second")


@contextlib.contextmanager
def serving(h: Harness, corpus: Path, include: Sequence[str], index: Optional[Path], model: Optional[Path],
            slots: int, tmp: Path, only: Sequence[str] = (),
            prepared: Callable[[str, "Pipeline"], None] = lambda name, p: None, fresh: bool = False,
            limits: str = "off", keys_file: Path | None = None):
    """Two servers over one index (or those named in ``only``): the
    scheduler on ``slots`` sequences, and on one sequence; yields ``([(name, url, counters, started)],
    first pipeline)``, ``started`` the perf_counter instant each started,
    and stops them all on leaving. ``fresh``: nothing is prepared before a
    server starts (it warms itself up). ``limits``, ``keys_file``: see
    :func:`bench_service_settings`."""
    from ..service import LoopbackServer, create_app

    setups = [s for s in (("scheduler", slots), ("one at a time", 1)) if not only or s[0] in only]
    if not setups:
        raise RagError("--system: scheduler or 'one at a time'")
    pipelines = {}
    try:
        for name, n in setups:
            p = setup.bench_pipeline(h, corpus, include, index, model, slots=n, conversations=tmp / f"{n}.sqlite",
                                     kv_dir=False)
            pipelines[name] = (p, None, None)  # closed on the way out even if its server never starts
            if not fresh:
                p.prepare()
                prepared(name, p)
            started = time.perf_counter()
            server = LoopbackServer(create_app(p, bench_service_settings(limits, keys_file)),
                                    ready=not fresh)
            pipelines[name] = (p, server, started)
        yield ([(name, server.url, _counters(p), started) for name, (p, server, started) in pipelines.items()],
               next(iter(pipelines.values()))[0])
    finally:
        for p, server, _ in pipelines.values():
            if server is not None:
                server.stop()
            p.close()  # and the engine it opened


def bench_service_settings(limits: str, keys_file: Path | None = None):
    """A bench server's settings: the caller limits
    ``"default"`` (as ``rag serve`` starts) or ``"off"`` (none: the engine's
    own admission alone decides), and the key file (None: no keys)."""
    from ..service import ServiceSettings

    if limits == "default":
        return ServiceSettings(keys_file=keys_file)
    return ServiceSettings(rate_limit_per_minute=0, questions_in_flight=0, uploads_in_flight=0,
                           upload_bytes_in_flight=0, keys_file=keys_file)


def _lanes(collections: int) -> list[tuple[str, str]]:
    """A new key for each of ``collections`` collections (default, second), with it."""
    from ..service.keys import new_key

    return [(new_key()[0], name) for name in ("default", "second")[:collections]]


def _key_file(lanes: Sequence[tuple[str, str]], folder: Path) -> Path | None:
    """A key file giving each lane's key the right to read its collection alone (None: no lanes)."""
    from ..service.keys import key_hash

    if not lanes:
        return None
    path = folder / "keys.json"
    path.write_text(json.dumps({"keys": {f"client{i}": {"sha256": key_hash(key), "collections": {name: "read"}}
                                         for i, (key, name) in enumerate(lanes)}}), encoding="utf-8")
    return path


def _counters(p: "Pipeline") -> Callable[[], dict | None]:
    """The engine's step counters, where it keeps them (None elsewhere),
    read when called: a fresh server loads its engine itself."""
    return lambda: p.backend.engine_stats() if isinstance(p.backend, StepCounters) else None


def read_upload(path: Path) -> bytes:
    """The bytes of the document ``--upload`` names (a clear error if unreadable)."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise RagError(f"--upload {path}: {exc.strerror or exc}") from None


def main() -> None:
    """``python -m rag.bench.serve``: ``rag bench serve`` on its own."""
    setup.command_alone("serve")


if __name__ == "__main__":
    main()

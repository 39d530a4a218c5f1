"""``rag bench serve --engines N``: one service over a pool of N engines,
routed by each policy in turn (affinity, round robin, least loaded), each
over fresh engines and the same interleaved conversations, asked through
the real HTTP service on 127.0.0.1 as streamed ``/v1/ask`` requests.

Per policy: the share of each prompt its engine found cached, from turn 2
(the engines' own counts), client-side TTFT percentiles, goodput (answers
within 1.2 x target per second), requests retried on another engine
(failovers), engines taken out, requests lost (no final answer), and the
routing itself: requests per engine and how often a conversation moved.
With ``kill_at`` one engine is killed (SIGKILL) just before that turn: the
engine that answered the first conversation's previous turn.

:func:`run` is the whole of ``rag bench serve --engines N``: the corpus
indexed, llama-server found or built (as the tests do), and for each policy
fresh engines and a service over their pool started, measured by
:func:`bench_pool` (which starts nothing itself: it is given
``start_engines`` and ``serve``) and stopped.

Does not: assert anything, or measure throughput scaling (on one small
machine the engines share its cores).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional, Protocol, Sequence

import httpx

from engine.remote.routing import POLICIES

from ..errors import RagError
from . import parts
from .chat import chat_schedule, load_conversations
from .parts import Harness
from .serve import GOOD_FACTOR, ask_streamed
from .stats import mean, percentile

ENGINE_SLOTS = 2  # each engine keeps two conversations in its slots
ENGINE_SLOT_CTX = 4096


class Engine(Protocol):
    """A running engine the bench may kill: its URL, ``kill()``, and
    ``died()``: None while it runs or after it was killed on purpose, else
    one line saying how it ended."""

    url: str

    def kill(self) -> None: ...

    def died(self) -> str | None: ...

    def stop(self) -> None: ...


def bench_pool(
    start_engines: Callable[[], list[Engine]],
    serve: Callable[[list[str], str, Path], tuple[str, Callable[[], dict], Callable[[], None]]],
    conversations: Sequence[Sequence[str]],
    *,
    engines: int = 2,
    policies: Sequence[str] = POLICIES,
    turns: int = 10,
    sessions: int = 3,
    kill_at: int | None = None,
    target_ttft: float = 2.0,
    max_tokens: int = 32,
    workdir: Path,
    progress: Callable[[str], None] | None = None,
) -> dict[str, object]:
    """For each policy: ``start_engines()``, then ``serve(urls, policy,
    folder)`` (the service's URL, a function giving the pool's events and
    health, and one stopping it), then ``sessions`` conversations of
    ``turns`` questions interleaved (A1 B1 C1 A2 ...), one request at a
    time; the bench object of ``rag bench serve --engines``."""
    schedule = chat_schedule(sessions, turns, True)
    rows: list[dict[str, object]] = []
    runs: list[dict[str, object]] = []
    for policy in policies:
        running = start_engines()
        try:
            url, pool_state, stop = serve([e.url for e in running], policy, workdir / policy)
            try:
                started = time.perf_counter()
                mine = _conversations(url, running, schedule, conversations, policy, kill_at, target_ttft,
                                      max_tokens, progress)
                wall = time.perf_counter() - started
                state = pool_state()
            finally:
                stop()
        finally:
            for engine in running:
                engine.stop()
        rows.extend(mine)
        runs.append(_run_summary(policy, mine, wall, target_ttft, state))
    by = {r["policy"]: r for r in runs}
    return {
        "bench": "serve",
        "config": {"mode": "engines", "engines": engines, "policies": list(policies), "turns": turns,
                   "sessions": sessions, "kill_one_at": kill_at, "target_ttft_s": target_ttft,
                   "max_tokens": max_tokens, "schedule": "interleaved, one request at a time"},
        "rows": rows,
        "summary": {
            "cached_share": {p: by[p]["cached_share"] for p in by},
            "lost_requests": sum(int(r["lost"]) for r in runs),
            "lost_by_policy": {p: by[p]["lost"] for p in by},
            "failovers": {p: by[p]["failovers"] for p in by},
            "p50_ttft_s": {p: by[p]["p50_ttft_s"] for p in by},
            "p95_ttft_s": {p: by[p]["p95_ttft_s"] for p in by},
            "goodput_rps": {p: by[p]["goodput_rps"] for p in by},
            "affinity_over_round_robin": _ratio(by, "affinity", "round_robin"),
            "runs": runs,
        },
    }


def _ratio(by: dict, a: str, b: str) -> float | None:
    if a not in by or b not in by or not by[b]["cached_share"]:
        return None
    return round(by[a]["cached_share"] / by[b]["cached_share"], 2)


def _conversations(url: str, engines: list[Engine], schedule, conversations, policy: str, kill_at: int | None,
                   target_ttft: float, max_tokens: int, progress) -> list[dict[str, object]]:
    """Ask every (session, turn) of ``schedule`` in order; kill an engine before turn ``kill_at``."""
    rows: list[dict[str, object]] = []
    run_id = f"{policy}-{int(time.time() * 1000) % 10**8}"
    killed = None
    with httpx.Client(base_url=url, timeout=600) as http:
        for s, t in schedule:
            _check_alive(engines, policy)
            if kill_at is not None and t == kill_at and killed is None:
                last = next((r["engine"] for r in reversed(rows) if r["session"] == 0 and r["engine"]), None)
                victim = next((e for e in engines if e.url == last), engines[0])
                victim.kill()
                killed = victim.url
            body = {"question": conversations[s][t - 1], "session": f"bench-{run_id}-{s}", "max_tokens": max_tokens,
                    "target_ttft_s": target_ttft, "stream": True}
            outcome = ask_streamed(http, body)
            if outcome["status"] != 200:
                _check_alive(engines, policy)  # a lost answer because an engine crashed: say that, not "lost"
            answer = outcome.pop("answer")
            route = (answer or {}).get("engine") or {}
            timings = (answer or {}).get("timings") or {}
            rows.append(outcome | {
                "policy": policy, "session": s, "turn": t, "engine": route.get("url"),
                "reason": route.get("reason"), "failovers": route.get("failovers", 0),
                "prompt_tokens": timings.get("prompt_tokens"), "cached_tokens": timings.get("cached_tokens"),
                "engine_ttft_s": timings.get("ttft_s"), "chunks": (answer or {}).get("budget", {}).get("chosen"),
                "after_kill": killed is not None, "killed": killed if killed and t == kill_at and s == 0 else None,
            })
            if progress:
                progress(f"{policy}: session {s} turn {t}: {outcome['status']}")
    return rows


def _check_alive(engines: list[Engine], policy: str) -> None:
    """RagError at once, naming the engine, its signal and its log, when an
    engine the bench did not kill has ended: a pool that runs on over a
    crashed engine measures nothing it claims to."""
    from ..errors import RagError

    for engine in engines:
        how = engine.died()
        if how:
            raise RagError(f"{policy}: {how}; the bench stopped (the rows so far would measure a crashed engine)")


def _run_summary(policy: str, rows: list[dict], wall: float, target_ttft: float, state: dict) -> dict[str, object]:
    """One policy's figures."""
    answered = [r for r in rows if r["status"] == 200]
    later = [r for r in answered if r["turn"] >= 2 and r["prompt_tokens"]]
    ttfts = [float(r["ttft_s"]) for r in answered if r["ttft_s"] is not None]
    per_engine: dict[str, int] = {}
    for r in answered:
        per_engine[r["engine"]] = per_engine.get(r["engine"], 0) + 1
    moves = sum(1 for a in answered for b in answered
                if a["session"] == b["session"] and b["turn"] == a["turn"] + 1 and a["engine"] != b["engine"])
    reasons: dict[str, int] = {}
    for r in answered:
        reasons[str(r["reason"])] = reasons.get(str(r["reason"]), 0) + 1
    events = state.get("events", [])
    return {
        "policy": policy,
        "requests": len(rows),
        "answered": len(answered),
        "lost": len(rows) - len(answered),
        "cached_share": round(mean(r["cached_tokens"] / r["prompt_tokens"] for r in later), 3),
        "cached_tokens_share": round(sum(r["cached_tokens"] for r in later) / max(sum(r["prompt_tokens"] for r in later), 1), 3),
        "p50_ttft_s": percentile(ttfts, 0.5),
        "p95_ttft_s": percentile(ttfts, 0.95),
        "goodput_rps": round(sum(1 for x in ttfts if x <= GOOD_FACTOR * target_ttft) / wall, 3),
        "failovers": sum(int(r["failovers"] or 0) for r in answered),
        "engines_taken_out": sum(1 for e in events if e.get("event") == "down"),
        "requests_per_engine": per_engine,
        "session_moves": moves,
        "reasons": reasons,
        "mean_chunks": round(mean(r["chunks"] for r in answered if r["chunks"] is not None), 2),
        "wall_s": round(wall, 2),
        "events": events,
    }


def run(h: Harness, corpus: Path, include: Sequence[str], *, engines: int, policies: Sequence[str] = POLICIES,
        turns: int = 10, sessions: int = 3, kill_at: Optional[int] = None, target_ttft: float = 2.0,
        max_tokens: int = 32, index: Optional[Path] = None, model: Optional[Path] = None) -> dict[str, object]:
    """``rag bench serve --engines N``: ``corpus`` indexed once, then for
    each routing policy ``engines`` fresh llama-server engines (sharing this
    machine's cores) and a service over their pool on 127.0.0.1, asked the
    bundled Python-docs conversations interleaved (:func:`bench_pool`). A
    RagError, before anything starts, for values out of range."""
    from engine.models import default_model_path

    from .llama_server import LlamaServer, server_binary

    conversations = load_conversations(parts.BENCH_DATA / "python_docs_chat.json")
    if not 1 <= engines <= 8 or (kill_at is not None and not 1 <= kill_at <= turns) or not 1 <= turns <= 10:
        raise RagError("--engines: 1 to 8; --turns: 1 to 10; --kill-one-at: a turn between 1 and --turns")
    if kill_at is not None and engines < 2:
        raise RagError("--kill-one-at needs at least two engines: one must be left to answer")
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise RagError(f"--policies: unknown {', '.join(unknown)}; use {', '.join(POLICIES)}")
    if sessions > len(conversations) or turns > min(len(c) for c in conversations[:sessions]):
        raise RagError(f"the bench file has {len(conversations)} conversations; lower --sessions or --turns")
    p = parts.bench_pipeline(h, corpus, include, index, model)  # the index, brought up to date once
    p.close()
    index = p.index_dir
    gguf = model or default_model_path()
    server_binary()  # built once, before anything is timed
    threads = max(1, (os.cpu_count() or 2) // engines)  # the engines share this machine's cores
    s = h.settings(model=model).model_copy(update={"evidence_floor": 0.0})  # every question reaches an engine

    def start_engines():
        return [LlamaServer(gguf, n_ctx=ENGINE_SLOTS * ENGINE_SLOT_CTX, slots=ENGINE_SLOTS, threads=threads)
                for _ in range(engines)]

    def serve(urls: list[str], policy: str, folder: Path):
        from engine.remote.backend import RemoteBackend
        from engine.remote.pool import EnginePool

        from ..service import LoopbackServer, ServiceSettings, create_app

        folder.mkdir(parents=True, exist_ok=True)
        pool = EnginePool(urls, lambda url: RemoteBackend(url, timeout_s=120.0), policy=policy)
        pipeline = h.open(s.model_copy(update={"index": index}), backend=pool,
                          conversations=folder / "conversations.sqlite", kv_dir=False)
        pipeline.prepare()
        server = LoopbackServer(create_app(pipeline, ServiceSettings(rate_limit_per_minute=0)))

        def stop() -> None:
            server.stop()
            pipeline.close()
            pool.close()

        return server.url, lambda: {"events": list(pool.events), "health": pool.health()}, stop

    with tempfile.TemporaryDirectory(prefix="rag-bench-pool-") as tmp:
        result = bench_pool(start_engines, serve, conversations, engines=engines, policies=policies, turns=turns,
                            sessions=sessions, kill_at=kill_at, target_ttft=target_ttft, max_tokens=max_tokens,
                            workdir=Path(tmp), progress=h.line)
    result["config"] |= {"engine_threads": threads, "engine_slots": ENGINE_SLOTS, "engine_slot_ctx": ENGINE_SLOT_CTX,
                         "model": str(gguf)}
    return result

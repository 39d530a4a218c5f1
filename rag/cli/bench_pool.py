"""``rag bench serve --engines N``: starting the engines (llama-server, found
or built as the tests do) and a service over their pool for each routing
policy, then printing what ``rag.bench.pool`` measured.

Does not: measure anything itself.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import List, Optional

from rich.console import Console
from rich.table import Table

from ..errors import RagError
from .common import command_pipeline, echo_json, err, settings

ENGINE_SLOTS = 2  # each engine keeps two conversations in its slots
ENGINE_SLOT_CTX = 4096


def run_pool_bench(index: Path, model: Optional[Path], conversations: List[List[str]], *, engines: int,
                   policies: List[str], turns: int, sessions: int, kill_at: Optional[int], target_ttft: float,
                   max_tokens: int, as_json: bool) -> None:
    """Run the pool bench over ``index`` and print it (a table, or the bench object with ``as_json``)."""
    from engine.models import default_model_path
    from engine.remote.routing import POLICIES

    from ..bench.llama_server import LlamaServer, server_binary
    from ..bench.pool import bench_pool

    if not 1 <= engines <= 8 or (kill_at is not None and not 1 <= kill_at <= turns) or not 1 <= turns <= 10:
        raise RagError("--engines: 1 to 8; --turns: 1 to 10; --kill-one-at: a turn between 1 and --turns")
    if kill_at is not None and engines < 2:
        raise RagError("--kill-one-at needs at least two engines: one must be left to answer")
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise RagError(f"--policies: unknown {', '.join(unknown)}; use {', '.join(POLICIES)}")
    if sessions > len(conversations) or turns > min(len(c) for c in conversations[:sessions]):
        raise RagError(f"the bench file has {len(conversations)} conversations; lower --sessions or --turns")
    gguf = model or default_model_path()
    server_binary()  # built once, before anything is timed
    threads = max(1, (os.cpu_count() or 2) // engines)  # the engines share this machine's cores
    s = settings(model=model).model_copy(update={"evidence_floor": 0.0})  # every question reaches an engine

    def start_engines():
        return [LlamaServer(gguf, n_ctx=ENGINE_SLOTS * ENGINE_SLOT_CTX, slots=ENGINE_SLOTS, threads=threads)
                for _ in range(engines)]

    with tempfile.TemporaryDirectory(prefix="rag-bench-pool-") as tmp:
        def serve(urls: list[str], policy: str, folder: Path):
            from engine.remote.pool import EnginePool
            from engine.remote.backend import RemoteBackend

            from ..service import LoopbackServer, ServiceSettings, create_app

            folder.mkdir(parents=True, exist_ok=True)
            pool = EnginePool(urls, lambda url: RemoteBackend(url, timeout_s=120.0), policy=policy)
            p = command_pipeline(s.model_copy(update={"index": index}), backend=pool,
                                 conversations=folder / "conversations.sqlite", kv_dir=False)
            p.prepare()
            server = LoopbackServer(create_app(p, ServiceSettings(rate_limit_per_minute=0)))

            def stop() -> None:
                server.stop()
                p.close()
                pool.close()

            return server.url, lambda: {"events": list(pool.events), "health": pool.health()}, stop

        result = bench_pool(start_engines, serve, conversations, engines=engines, policies=policies, turns=turns,
                            sessions=sessions, kill_at=kill_at, target_ttft=target_ttft, max_tokens=max_tokens,
                            workdir=Path(tmp), progress=lambda line: err().print(f"[dim]{line}[/]"))
    result["config"] |= {"engine_threads": threads, "engine_slots": ENGINE_SLOTS, "engine_slot_ctx": ENGINE_SLOT_CTX,
                         "model": str(gguf)}
    if as_json:
        echo_json(result)
        return
    print_pool(result)


def print_pool(result: dict) -> None:
    """The pool bench as a table, one row per policy."""
    c = result["config"]
    title = (f"rag bench serve --engines {c['engines']} ({c['sessions']} conversations x {c['turns']} turns, "
             f"interleaved; target {c['target_ttft_s']:g} s"
             + (f"; one engine killed before turn {c['kill_one_at']})" if c["kill_one_at"] else ")"))
    table = Table(title=title, title_justify="left")
    for column in ("policy", "cached share (turn 2+)", "p50 TTFT s", "p95 TTFT s", "goodput/s", "answered", "lost",
                   "failovers", "engines out", "moves", "per engine"):
        table.add_column(column, justify="left" if column in ("policy", "per engine") else "right")
    for r in result["summary"]["runs"]:
        table.add_row(r["policy"], f"{r['cached_share']:.3f}", f"{r['p50_ttft_s'] or 0:.2f}", f"{r['p95_ttft_s'] or 0:.2f}",
                      f"{r['goodput_rps']:.3f}", str(r["answered"]), str(r["lost"]), str(r["failovers"]),
                      str(r["engines_taken_out"]), str(r["session_moves"]),
                      " ".join(str(n) for n in r["requests_per_engine"].values()))
    console = Console(highlight=False)
    console.print(table)
    ratio = result["summary"]["affinity_over_round_robin"]
    if ratio is not None:
        console.print(f"cached share, affinity over round robin: {ratio:g}x")

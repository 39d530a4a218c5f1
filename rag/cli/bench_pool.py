"""``rag bench serve --engines N``'s table: what ``rag.bench.pool`` measured,
one row per routing policy.

Does not: start engines or servers, or measure anything itself.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


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

"""``rag bench serve --engines N``'s table: what ``rag.bench.pool``
measured through vLLM's router, one row per router policy, then the
comparison of the policies' cached shares and what a killed worker cost.

Does not: start workers, routers or servers, or measure anything itself.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def _num(value, digits: int = 2) -> str:
    """A figure, or "-" where the run had none."""
    return "-" if value is None else f"{value:.{digits}f}"


def _title(result: dict) -> str:
    """The router, the set-up and the load, in one line."""
    c = result["config"]
    kill = f"; one worker killed before turn {c['kill_one_at']}" if c.get("kill_one_at") else ""
    return (f"rag bench serve --engines {c['engines']} through {c['router']} {c['router_version']} "
            f"({c['clients']} clients, each a conversation of {c['turns']} turns; target {c['target_ttft_s']:g} s{kill})")


def print_pool(result: dict) -> None:
    """The bench through the router as a table, one row per policy."""
    table = Table(title=_title(result), title_justify="left")
    columns = ("policy", "answered", "served asks", "429s", "lost", "errors", "p50 TTFT s", "p95 TTFT s", "p95/target",
               "within 1.2x", "cached share", "cached (workers)", "pred err p50/p95", "adherence p95", "per worker")
    for column in columns:
        table.add_column(column, justify="left" if column in ("policy", "per worker") else "right")
    for r in result["summary"]["runs"]:
        within = r["within_1_2_target_share"]
        table.add_row(r["policy"], f"{r['answered']}/{r['questions']}", f"{r['served_share'] * 100:.0f}%",
                      str(r["rejected_429"]), str(r["lost"]), str(r["errors"]), _num(r["p50_ttft_s"]), _num(r["p95_ttft_s"]), _num(r["p95_over_target"]),
                      "-" if within is None else f"{within * 100:.0f}%", _num(r["cached_share"], 3),
                      _num(r["cached_share_workers"], 3),
                      "-" if r["pred_err_p50"] is None else f"{r['pred_err_p50'] * 100:.0f}/{r['pred_err_p95'] * 100:.0f}%",
                      _num(r["adherence_p95"]), " ".join(str(n) for n in r["requests_per_worker"].values()))
    console = Console(highlight=False)
    console.print(table)
    ratio = result["summary"]["cache_aware_over_round_robin"]
    if ratio is not None:
        console.print(f"cached share, cache_aware over round_robin: {ratio:g}x")
    for r in result["summary"]["runs"]:
        k = r["kill"]
        if k:
            console.print(f"{r['policy']}: killed {k['worker']} ({k['in_flight_on_it']} in flight on it, "
                          f"{k['questions_in_flight']} questions in flight) at {k['at_s']:.1f} s: lost "
                          f"{k['lost_in_flight']} in flight, {k['lost_sent_after']} sent after; "
                          f"{k['lost_not_in_flight_on_it']} that were not in flight on it")

"""``rag bench serve --engines``: a pool of real llama-server engines per
routing policy, an engine killed mid-run, through the CLI."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.model


def test_bench_serve_over_a_pool_of_engines_with_one_killed(run, corpus, tmp_path):
    result = run("bench", "serve", "--engines", "2", "--turns", "2", "--sessions", "2", "--kill-one-at", "2",
                 "--policies", "affinity,round_robin", "--max-tokens", "8", "--target-ttft", "30",
                 "--corpus", corpus, "--include", "*", "--index", tmp_path / "index", "--json")
    assert result.exit_code == 0, result.output
    bench = json.loads(result.stdout)
    assert bench["bench"] == "serve" and bench["config"]["engines"] == 2 and bench["config"]["kill_one_at"] == 2
    summary = bench["summary"]
    assert set(summary["cached_share"]) == {"affinity", "round_robin"}
    assert all(0 <= share <= 1 for share in summary["cached_share"].values())
    assert summary["lost_requests"] == 0  # the engine killed before turn 2 cost no question
    assert len(bench["rows"]) == 8 and all(r["status"] == 200 and r["engine"] for r in bench["rows"])
    for run_ in summary["runs"]:
        killed = [r["killed"] for r in bench["rows"] if r["policy"] == run_["policy"] and r["killed"]]
        assert len(killed) == 1
        # After the kill, nothing was answered by the dead engine, and the pool took it out.
        after = [r for r in bench["rows"] if r["policy"] == run_["policy"] and r["after_kill"]]
        assert after and all(r["engine"] != killed[0] for r in after)
        assert run_["engines_taken_out"] >= 1

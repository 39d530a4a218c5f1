"""``rag bench serve --engines``: real llama-server workers through vLLM's
router, one run per router policy, concurrent clients in conversations, a
worker killed mid-run, through the CLI."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.model


def test_bench_serve_through_the_router_with_one_worker_killed(run, corpus, tmp_path):
    from engine.remote.router import router_binary

    if router_binary() is None:
        pytest.skip("vllm-router is not installed (pip install 'rag-budget[router]')")
    result = run("bench", "serve", "--engines", "2", "--clients", "2", "--turns", "2", "--kill-one-at", "2",
                 "--policies", "cache_aware,round_robin", "--max-tokens", "8", "--target-ttft", "30",
                 "--corpus", corpus, "--include", "*", "--index", tmp_path / "index", "--json")
    assert result.exit_code == 0, result.output
    bench = json.loads(result.stdout)
    config, summary = bench["config"], bench["summary"]
    assert bench["bench"] == "serve" and config["mode"] == "router" and config["router"] == "vllm-router"
    assert config["engines"] == 2 and config["clients"] == 2 and config["kill_one_at"] == 2
    assert summary["router"].startswith("vllm-router ") and config["router_version"] in summary["router"]
    assert [r["policy"] for r in summary["runs"]] == ["cache_aware", "round_robin"]
    assert set(summary["cached_share"]) == {"cache_aware", "round_robin"}
    for run_ in summary["runs"]:
        mine = [r for r in bench["rows"] if r["policy"] == run_["policy"]]
        assert len(mine) == run_["requests"] and run_["questions"] == 4  # 2 clients x 2 turns
        assert {(r["client"], r["turn"]) for r in mine} == {(0, 1), (0, 2), (1, 1), (1, 2)}
        assert run_["router"] == "vllm-router" and run_["answered"] + run_["lost"] + run_["given_up"] == 4
        assert run_["served"] + run_["lost"] + run_["rejected_429"] == len(mine)  # each ask told one way
        assert run_["cached_share"] is None or 0 <= run_["cached_share"] <= 1
        assert len(run_["workers"]) == 2 and sum(run_["requests_per_worker"].values()) >= run_["served"]
        kill = run_["kill"]
        assert kill["before_turn"] == 2 and kill["worker"] in run_["requests_per_worker"]
        # Only questions in flight on the killed worker may be lost; the router takes the rest to the other.
        assert kill["lost_not_in_flight_on_it"] == 0 and kill["lost_before"] == 0
        assert run_["lost"] == kill["lost_in_flight"] <= kill["in_flight_on_it"]
        answered = [r for r in mine if r["status"] == 200]
        assert all(r["prompt_tokens"] and r["predicted_ttft_s"] is not None for r in answered)
        assert run_["pred_err_p50"] is not None or not answered

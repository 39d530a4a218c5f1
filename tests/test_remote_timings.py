"""What the budget learns from a response's own figures (pure): llama-server's
``timings``, vLLM's ``usage`` cached-token count and per-request ``metrics``,
or the client's clock where a server reports none. The shapes are those the
servers document (llama-server's /v1/completions, vLLM's
``--enable-prompt-tokens-details`` and ``--enable-per-request-metrics``)."""

from engine.remote.backend import response_timings

VLLM_USAGE = {"prompt_tokens": 500, "completion_tokens": 32, "total_tokens": 532,
              "prompt_tokens_details": {"cached_tokens": 400}}
VLLM_METRICS = {"time_to_first_token_ms": 85.2, "generation_time_ms": 1240.5, "queue_time_ms": 12.3,
                "mean_itl_ms": 9.1, "tokens_per_second": 103.2}


def test_llama_server_timings_are_taken_as_the_engine_counted_them():
    reported = {"cache_n": 49, "prompt_n": 1, "prompt_ms": 18.0, "predicted_n": 8, "predicted_ms": 126.0}
    t = response_timings(50, reported, {}, {}, ttft=0.05, total=0.2, pieces=8)
    assert (t.cached_tokens, t.prefill_tokens, t.prefill_s, t.decode_tokens) == (49, 1, 0.018, 8)
    assert t.decode_s == 0.126 and t.ttft_s == 0.05


def test_vllm_per_request_metrics_give_the_prefill_and_queue_times():
    t = response_timings(500, {}, VLLM_USAGE, VLLM_METRICS, ttft=0.3, total=1.6, pieces=32)
    assert (t.cached_tokens, t.prefill_tokens, t.decode_tokens) == (400, 100, 32)
    assert t.prefill_s == 0.0852 and t.queue_s == 0.0123 and t.decode_s == 1.2405
    assert t.ttft_s == 0.3  # the client's own wait is kept beside the engine's figures


def test_without_metrics_the_first_token_wait_stands_in_for_the_prefill():
    t = response_timings(500, {}, VLLM_USAGE, {}, ttft=0.3, total=1.6, pieces=32)
    assert (t.cached_tokens, t.prefill_tokens, t.prefill_s) == (400, 100, 0.3)
    assert abs(t.decode_s - 1.3) < 1e-9


def test_counts_that_disagree_or_overrun_the_prompt_are_bounded_by_it():
    t = response_timings(10, {"prompt_n": 40, "cache_n": 3, "prompt_ms": 5.0}, {}, {}, 0.1, 0.2, 1)
    assert (t.prefill_tokens, t.cached_tokens) == (10, 0)
    t = response_timings(10, {}, {"prompt_tokens_details": {"cached_tokens": 99}}, {}, 0.1, 0.2, 1)
    assert (t.cached_tokens, t.prefill_tokens) == (10, 0)

"""``rag bench serve``'s own parts, without the model: a team from one
address against a server with the default limits, right after an upload
(issue 37), counted by a stand-in server."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from rag.service import LoopbackServer, ServiceSettings

ANSWER = {"answer": "Prefill reads the prompt.", "budget": {"chosen": 2}, "timings": {"decode_tokens": 3}}


def _stand_in(events: list[str]):
    """A server that records what it was sent, in order, and refuses the
    first question as the limiter would (429, ``rate_limited``), the second
    as admission would (``overloaded``)."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    async def documents(request):
        events.append(f"{request.method} documents")
        return JSONResponse({"documents": []})

    async def ask(request):
        events.append("ask")
        refusals = {1: "rate_limited", 2: "overloaded"}
        asked = events.count("ask")
        if asked in refusals:
            return JSONResponse({"error": {"message": "no", "type": refusals[asked]}}, status_code=429,
                                headers={"Retry-After": "1"})

        async def stream():
            yield 'data: {"delta": "Prefill"}\n\n'
            yield f"data: {json.dumps({'answer': ANSWER})}\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/documents", documents, methods=["GET", "POST"]),
                             Route("/v1/ask", ask, methods=["POST"])])


def test_an_upload_before_the_run_is_answered_first_and_refusals_are_counted_by_kind(monkeypatch):
    from rag.bench import serve

    monkeypatch.setattr(serve, "RETRY_WAIT_CAP_S", 0.0)  # the client's wait after a 429 is not what is counted
    events: list[str] = []
    s = LoopbackServer(_stand_in(events))
    try:
        result = serve.bench_serve([("stand-in", s.url, None)], ["What is prefill?"], clients=[2], requests=6,
                                   upload=("owls.md", b"# Owls\n"), upload_at="before", limits="default")
    finally:
        s.stop()
    assert events[:2] == ["POST documents", "GET documents"]  # uploaded and listed, as the page does, then asked
    assert events.count("ask") == 6
    (run,) = result["summary"]["runs"]
    assert run["served"] == 4 and run["rejected_429"] == 2 and run["errors"] == 0
    assert run["refused"] == {"rate_limited": 1, "overloaded": 1}
    assert run["upload_status"] == 200 and run["p95_ttft_s"] is not None
    assert result["config"]["limits"] == "default" and result["config"]["upload_at"] == "before"


def test_the_bench_servers_have_the_default_limits_or_none():
    from rag.bench.serve import bench_service_settings

    default, plain = bench_service_settings("default"), ServiceSettings()
    for name in ("rate_limit_per_minute", "questions_in_flight", "uploads_in_flight", "upload_bytes_in_flight"):
        assert getattr(default, name) == getattr(plain, name)
    off = bench_service_settings("off")
    assert off.rate_limit_per_minute == 0 and off.questions_in_flight == 0 and off.uploads_in_flight == 0


def test_bench_serve_refuses_unknown_limits_and_an_upload_time_without_an_upload():
    from rag import cli

    runner = CliRunner()
    result = runner.invoke(cli.app, ["bench", "serve", "--limits", "some"])
    assert result.exit_code == 1 and "--limits" in result.output
    result = runner.invoke(cli.app, ["bench", "serve", "--upload-at", "before"])
    assert result.exit_code == 1 and "--upload" in result.output

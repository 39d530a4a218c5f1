"""``rag bench serve``'s clients, without the model: ``rag bench serve
--url`` against stand-in servers on 127.0.0.1 that record what they were
sent and answer as they are told (a team from one address right after an
upload, issue 37; refusals by kind; a stream cut before its answer); and
the options it refuses."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from rag import cli
from rag.service import LoopbackServer

ANSWER = {"answer": "Prefill reads the prompt.", "budget": {"chosen": 2}, "timings": {"decode_tokens": 3}}


def _bench(*args):
    return CliRunner().invoke(cli.app, ["bench", "serve", *map(str, args)], env={"COLUMNS": "200"})


def _stand_in(events: list[str]):
    """A server that records what it was sent, in order, and refuses the
    first question as the limiter would (429, ``rate_limited``), the second
    as admission would (``overloaded``), each to be tried again at once."""
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
                                headers={"Retry-After": "0"})  # the client's wait after a 429 is not what is counted

        async def stream():
            yield 'data: {"delta": "Prefill"}\n\n'
            yield f"data: {json.dumps({'answer': ANSWER})}\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/documents", documents, methods=["GET", "POST"]),
                             Route("/v1/ask", ask, methods=["POST"])])


def test_an_upload_before_the_run_is_answered_first_and_refusals_are_counted_by_kind(tmp_path):
    events: list[str] = []
    upload = tmp_path / "owls.md"
    upload.write_text("# Owls\n", encoding="utf-8")
    s = LoopbackServer(_stand_in(events))
    try:
        result = _bench("--url", s.url, "--clients", "2", "--requests", "6", "--upload", upload,
                        "--upload-at", "before", "--json")
        assert result.exit_code == 0, result.output
        sent = list(events)
        events.clear()
        table = _bench("--url", s.url, "--clients", "1", "--requests", "3")
    finally:
        s.stop()
    assert sent[:2] == ["POST documents", "GET documents"]  # uploaded and listed, as the page does, then asked
    assert sent.count("ask") == 6
    d = json.loads(result.stdout)
    assert d["config"]["url"] == s.url and d["config"]["limits"] is None and d["summary"]["bound"] is None
    assert d["config"]["upload"] == "owls.md" and d["config"]["upload_at"] == "before"
    (run,) = d["summary"]["runs"]
    assert run["served"] == 4 and run["rejected_429"] == 2 and run["errors"] == 0
    assert run["refused"] == {"rate_limited": 1, "overloaded": 1}
    assert run["upload_status"] == 200 and run["list_status"] == 200 and run["p95_ttft_s"] is not None
    assert len(d["rows"]) == 6 and all(r["system"] == s.url for r in d["rows"])
    # The printed table says the refusals by kind, and whose limits they were.
    assert table.exit_code == 0, table.output
    assert events == ["ask"] * 3 and "429s by type: 1 overloaded, 1 rate_limited" in table.stdout
    assert "those of the server at" in table.stdout


def test_the_bench_client_counts_a_stream_without_its_answer_as_an_error():
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    async def cut(request):
        async def events():
            yield 'data: {"delta": "Prefill"}\n\n'
            yield 'data: {"delta": " reads"}\n\n'

        return StreamingResponse(events(), media_type="text/event-stream")

    s = LoopbackServer(Starlette(routes=[Route("/v1/ask", cut, methods=["POST"])]))
    try:
        result = _bench("--url", s.url, "--clients", "2", "--requests", "4", "--json")
    finally:
        s.stop()
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    (run,) = d["summary"]["runs"]
    assert run["errors"] == 4 and run["served"] == 0 and run["mean_chunks"] is None
    assert all("without its answer" in str(r["status"]) for r in d["rows"])


def test_bench_serve_refuses_unknown_limits_and_an_upload_time_without_an_upload():
    result = _bench("--limits", "some")
    assert result.exit_code == 1 and "--limits" in result.output
    result = _bench("--upload-at", "before")
    assert result.exit_code == 1 and "--upload" in result.output
    for wrong in (["--url", "127.0.0.1:8000"], ["--url", "http://127.0.0.1:9", "--limits", "default"],
                  ["--url", "http://127.0.0.1:9", "--system", "scheduler"]):
        result = _bench(*wrong)
        assert result.exit_code == 1 and "--url" in result.output, wrong

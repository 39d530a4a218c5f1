"""``rag mcp`` for real: the MCP SDK's own client (``ClientSession`` over
``stdio_client``, and over ``streamable_http_client``) talking to ``python
-m rag.cli mcp`` as a process of its own, which answers through the
resident server (a process too) with the real model, over an index of the
sample corpus in ``data/``. No timing is asserted."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from .answer_contract import missing_fields
from .test_resident import LONG, RAG, ROOT, rag, servers, shell, stop_every_server
from .test_resident import env  # noqa: F401 - the fixture: one shell, its resident server shared by the tests

SAMPLE = ROOT / "data"


@pytest.fixture(scope="module")
def index(tmp_path_factory, embedder) -> Path:
    """The sample corpus of ``data/``, ingested into an index of its own."""
    from rag import Pipeline

    root = tmp_path_factory.mktemp("mcp")
    pipeline = Pipeline.open(root / "index", embedder=embedder)
    pipeline.ingest([SAMPLE])
    pipeline.close()
    return root / "index"


def over_stdio(env: dict, index: Path, check, *extra: str) -> None:
    """Run ``rag mcp --index INDEX`` and ``await check(session)`` with an
    initialised client session over its stdin and stdout."""
    params = StdioServerParameters(command=sys.executable, args=RAG[1:] + ["mcp", "--index", str(index), *extra],
                                   env=env, cwd=str(ROOT))

    async def main() -> None:
        with anyio.fail_after(LONG):
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                await check(session)

    anyio.run(main)


def text_of(result) -> str:
    """The text content of a tool's result."""
    return "".join(c.text for c in result.content if getattr(c, "type", "") == "text")


def test_tools_are_listed_with_their_bounds_and_search_finds_the_sample_corpus(env, index):
    async def check(session: ClientSession) -> None:
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert set(tools) == {"search", "ask", "list_documents", "read_document"}
        k = tools["search"].input_schema["properties"]["k"]
        assert (k["minimum"], k["maximum"]) == (1, 50)
        assert tools["ask"].input_schema["required"] == ["question"]

        result = await session.call_tool("search", {"query": "What does the KV cache store?", "k": 3})
        assert not result.is_error, text_of(result)
        hits = result.structured_content["results"]
        assert len(hits) == 3 and hits[0]["source"] == "kv-cache.md"
        assert "keys and values" in " ".join(h["text"] for h in hits)
        assert hits[0]["doc_id"] and hits[0]["where"].startswith("kv-cache.md")
        assert json.loads(text_of(result)) == result.structured_content  # the same object, as text

        scoped = await session.call_tool("search", {"query": "KV cache", "k": 5,
                                                    "scope": {"sources": ["retrieval.md"]}})
        assert not scoped.is_error, text_of(scoped)
        assert {h["source"] for h in scoped.structured_content["results"]} == {"retrieval.md"}

    over_stdio(env, index, check)


def test_ask_answers_through_the_resident_server_with_sources_and_cost(env, index):
    progress: list[float] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append(done)

    async def check(session: ClientSession) -> None:
        result = await session.call_tool("ask", {"question": "What does the KV cache store?", "max_tokens": 16,
                                                 "target_ttft": 30}, progress_callback=on_progress)
        assert not result.is_error, text_of(result)
        answer = result.structured_content
        assert answer["answer"].strip()
        assert answer["sources"] and answer["sources"][0]["n"] == 1
        assert "kv-cache.md" in {s["source"] for s in answer["sources"]}
        assert all(s["doc_id"] for s in answer["sources"])
        assert isinstance(answer["evidence"], list)
        assert missing_fields(answer) == []  # the answer's contract, extended by n, where and cost
        cost = answer["cost"]
        assert cost["prompt_tokens"] > 0 and 0 <= cost["cached_tokens"] <= cost["prompt_tokens"]
        assert cost["ttft_s"] > 0 and cost["predicted_ttft_s"] > 0 and cost["target_ttft_s"] == 30
        assert 1 <= cost["passages_chosen"] == len(answer["sources"]) <= cost["candidates"]

    over_stdio(env, index, check)
    assert progress and progress == sorted(progress)  # the answer's text so far, as it grew
    (server,) = servers(env, index)  # the same resident server `rag ask` uses answered it
    assert server["requests"] >= 1 and not server["sample"]


def test_documents_are_listed_read_by_range_and_served_as_resources(env, index):
    async def check(session: ClientSession) -> None:
        listed = await session.call_tool("list_documents", {})
        assert not listed.is_error, text_of(listed)
        docs = {d["source"]: d for d in listed.structured_content["documents"]}
        assert set(docs) == {p.name for p in SAMPLE.iterdir()}
        doc_id = docs["kv-cache.md"]["id"]

        whole = (await session.call_tool("read_document", {"doc_id": doc_id})).structured_content
        assert whole["start"] == 0 and whole["end"] == whole["length"] == len(whole["text"]) and not whole["more"]
        assert "The KV cache stores these keys and values" in " ".join(whole["text"].split())
        part = await session.call_tool("read_document", {"doc_id": doc_id, "start": 10, "end": 60})
        assert not part.is_error, text_of(part)
        assert part.structured_content["text"] == whole["text"][10:60] and part.structured_content["more"]

        uri = f"rag://documents/{doc_id}"
        assert uri in {str(r.uri) for r in (await session.list_resources()).resources}
        templates = (await session.list_resource_templates()).resource_templates
        assert [t.uri_template for t in templates] == ["rag://documents/{doc_id}"]
        (content,) = (await session.read_resource(uri)).contents
        assert content.text == whole["text"] and content.mime_type == "text/plain"
        with pytest.raises(MCPError, match="no document 'ffffffffffffffff'"):
            await session.read_resource("rag://documents/ffffffffffffffff")

    over_stdio(env, index, check)


BAD_CALLS = [
    ("search", {"query": "KV cache", "k": 0}, ["k:", "greater than or equal to 1"]),
    ("search", {"query": "KV cache", "k": 51}, ["k:", "less than or equal to 50"]),
    ("search", {"query": "   "}, ["the query is empty"]),
    ("search", {"query": "KV", "scope": {"types": ["exe"]}}, ["scope.types", ".exe is not a type"]),
    ("ask", {"question": ""}, ["question:", "at least 1 character"]),
    ("ask", {"question": "  \n "}, ["the question is empty"]),
    ("ask", {"question": "Why?", "max_tokens": 0}, ["max_tokens:", "greater than or equal to 1"]),
    ("ask", {"question": "Why?", "target_ttft": -1}, ["target_ttft:", "greater than 0"]),
    ("ask", {"question": "Why?", "session": "a/b"}, ["session"]),
    ("ask", {}, ["question:", "required"]),
    ("read_document", {"doc_id": "ffffffffffffffff"}, ["no document 'ffffffffffffffff'", "list_documents"]),
    ("read_document", {"doc_id": "x", "start": -1}, ["start:", "greater than or equal to 0"]),
    ("read_document", {"doc_id": "x", "start": 9, "end": 3}, ["end 3 is before start 9"]),
    ("no_such_tool", {}, ["no_such_tool"]),
]


def test_bad_input_is_a_tool_error_in_one_clear_line(env, index):
    async def check(session: ClientSession) -> None:
        for name, arguments, fragments in BAD_CALLS:
            result = await session.call_tool(name, arguments)
            message = text_of(result)
            assert result.is_error, (name, arguments, message)
            assert "\n" not in message and "Traceback" not in message, message
            for fragment in fragments:
                assert fragment in message, (name, arguments, message)
        good = await session.call_tool("search", {"query": "KV cache", "k": 1})  # the session still works
        assert not good.is_error and len(good.structured_content["results"]) == 1

    over_stdio(env, index, check)


def test_streamable_http_on_loopback(env, index):
    process = subprocess.Popen(RAG + ["mcp", "--index", str(index), "--http", "--port", "0"], env=env, cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = _announced_url(process)
        assert url.startswith("http://127.0.0.1:") and url.endswith("/mcp")

        async def main() -> None:
            with anyio.fail_after(LONG):
                async with streamable_http_client(url) as (read, write), ClientSession(read, write) as session:
                    await session.initialize()
                    assert "search" in {t.name for t in (await session.list_tools()).tools}
                    result = await session.call_tool("search", {"query": "What does the KV cache store?", "k": 2})
                    assert not result.is_error, text_of(result)
                    assert result.structured_content["results"][0]["source"] == "kv-cache.md"
                    bad = await session.call_tool("search", {"query": "KV", "k": 0})
                    assert bad.is_error and "k: Input should be greater than or equal to 1" in text_of(bad)

        anyio.run(main)
    finally:
        process.terminate()
        process.wait(timeout=60)


def _announced_url(process: subprocess.Popen) -> str:
    """The URL ``rag mcp --http`` says it listens at, from its stderr."""
    deadline = time.monotonic() + LONG
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stderr], [], [], 1.0)
        if ready:
            line = process.stderr.readline()
            assert line or process.poll() is None, "rag mcp --http ended before listening"
            if "streamable HTTP at " in line:
                return line.rsplit(" ", 1)[-1].strip()
    raise AssertionError("rag mcp --http never said where it listens")


def test_http_off_loopback_is_refused_in_one_line(env):
    done = rag(env, "mcp", "--http", "--host", "0.0.0.0")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "--host 0.0.0.0" in line and "loopback only" in line


def test_no_server_answers_in_the_mcp_process(index, tmp_path):
    """With --no-server (as `rag ask --no-server`), a pipeline in the MCP process answers; no server starts."""
    variables = shell(RAG_CONVERSATIONS=str(tmp_path / "c.sqlite"))
    try:
        async def check(session: ClientSession) -> None:
            result = await session.call_tool("search", {"query": "What does the KV cache store?", "k": 1})
            assert not result.is_error, text_of(result)
            assert result.structured_content["results"][0]["source"] == "kv-cache.md"

        over_stdio(variables, index, check, "--no-server")
        assert servers(variables, index) == []
    finally:
        stop_every_server(variables)


def test_streamable_http_with_keys_calls_each_tool_as_its_keys_holder(env, index, tmp_path):
    """Issue 46: with the service's key file, every HTTP request needs a key
    (401), and each tool keeps to what the key's holder may read: another
    collection is one that holds nothing, and a session is the key's own."""
    import httpx2

    from rag.service.keys import key_hash, new_key

    private = tmp_path / "private"
    private.mkdir()
    (private / "payroll.md").write_text("Payroll closes on the 25th; bonuses are paid in December.\n", encoding="utf-8")
    done = rag(env, "ingest", str(private), "--index", str(index), "--collection", "payroll")
    assert done.returncode == 0, done.stderr
    done = rag(env, "ask", "What is the KV cache?", "--index", str(index), "--session", "local-1", "--max-tokens", "4")
    assert done.returncode == 0, done.stderr  # the local user's conversation, never the key's
    reader, _ = new_key()
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": {"reader": {"sha256": key_hash(reader), "collections": {"default": "read"}}}}),
                    encoding="utf-8")
    keyed = env | {"RAG_SERVE_KEYS_FILE": str(keys)}
    process = subprocess.Popen(RAG + ["mcp", "--index", str(index), "--http", "--port", "0"], env=keyed, cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = _announced_url(process)
        assert httpx2.post(url, json={}).status_code == 401

        async def main() -> None:
            with anyio.fail_after(LONG):
                client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {reader}"}, timeout=LONG)
                async with client, streamable_http_client(url, http_client=client) as (read, write), \
                        ClientSession(read, write) as session:
                    await session.initialize()
                    found = await session.call_tool("search", {"query": "When are bonuses paid?", "k": 5})
                    assert not found.is_error, text_of(found)
                    assert "payroll.md" not in {r["source"] for r in found.structured_content["results"]}
                    for tool, arguments in (("search", {"query": "bonuses", "collection": "payroll"}),
                                            ("list_documents", {"collection": "payroll"}),
                                            ("ask", {"question": "When are bonuses paid?", "collection": "payroll"}),
                                            ("search", {"query": "bonuses", "collection": "nosuch"})):
                        refused = await session.call_tool(tool, arguments)
                        assert refused.is_error and "holds no documents" in text_of(refused), (tool, text_of(refused))
                    assert (await session.list_resources()).resources == []
                    # The local user's "local-1" is not the key's: the key's own "local-1" starts at turn 1.
                    theirs = await session.call_tool("ask", {"question": "And then?", "session": "local-1",
                                                             "max_tokens": 4})
                    assert not theirs.is_error and theirs.structured_content["turn"] == 1, text_of(theirs)
                    mine = await session.call_tool("ask", {"question": "What is the KV cache?", "session": "reader-1",
                                                           "max_tokens": 4})
                    assert not mine.is_error and mine.structured_content["turn"] == 1, text_of(mine)

        anyio.run(main)
    finally:
        process.terminate()
        process.wait(timeout=60)
    done = rag(env, "collections", "delete", "payroll", "--index", str(index))
    assert done.returncode == 0, done.stderr

"""Issue 55, the side doors closed: what reaches the index other than
``rag serve``'s routes keeps to the service's keys and limits.

- The resident server never takes the service's keys from the shell that
  starts it (it would refuse its own keyless client).
- MCP over HTTP stands behind the service's gate: wrong keys an address may
  send (429), the request body limit (413), the questions a caller may have
  in flight, and ``ask``'s answer tokens within the service's cap.
- A tool call over HTTP with keys and no headers is refused, never the
  local user's.
- Without keys, the SDK's guard against DNS rebinding knows the address the
  server is bound to (127.0.0.2 is loopback too).
- A key file's holder names cannot pass for the plain keys or the local user.

The MCP server is the real one with the SDK's own client: as a process
(``rag mcp --http``, answering through the resident server with the real
model), or, where a question must be held in flight for as long as the test
needs, in this process over real HTTP with an answerer that waits to be let go.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client, ClientSession
from mcp.client.streamable_http import streamable_http_client

from rag.errors import RagError
from rag.service.keys import LOCAL_USER, KeyRing, key_hash, new_key

from .conftest import write_corpus
from .test_mcp import _announced_url, text_of
from .test_resident import LONG, RAG, ROOT, rag, servers, shell, stop_every_server

MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "side-doors", "version": "1"}}}


# --- holder names -------------------------------------------------------------------------------------------

def _key_file(tmp_path: Path, holder: str, key: str = "") -> Path:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"keys": {holder: {"sha256": key_hash(key), "collections": {"*": "read"}}}}),
                    encoding="utf-8")
    return path


@pytest.mark.parametrize("holder", ["", "key 1", "local user", "local user (resident)", "-alice", ".alice",
                                    "a" * 65, "alice\n", "alice bob", "josé", "alice/bob"])
def test_a_holder_name_that_could_pass_for_another_is_refused_naming_the_file_and_the_holder(tmp_path, holder):
    path = _key_file(tmp_path, holder)
    with pytest.raises(RagError) as caught:
        KeyRing.read(path)
    message = str(caught.value)
    assert str(path) in message and f"keys.{json.dumps(holder)}" in message and "\n" not in message
    assert "1 to 64 letters, digits" in message


@pytest.mark.parametrize("holder, unlike", [("alice", "alice bob"), ("a", ""), ("Team_7", "_Team7"),
                                            ("alice@example.org", "@example.org"), ("ops.bot-2", "ops.bot 2"),
                                            ("9" + "a" * 63, "9" + "a" * 64)])
def test_a_holder_name_of_letters_digits_and_marks_is_read_and_its_neighbour_is_not(tmp_path, holder, unlike):
    key = new_key()[0]
    assert KeyRing.read(_key_file(tmp_path, holder, key)).caller(key).holder == holder
    with pytest.raises(RagError, match="a holder's name is 1 to 64"):
        KeyRing.read(_key_file(tmp_path, unlike, key))


def test_rag_keys_new_checks_the_holder_as_the_key_file_does_and_quotes_it_in_the_entry(tmp_path):
    from typer.testing import CliRunner

    from rag.cli import _app

    refused = CliRunner().invoke(_app(), ["keys", "new", "key 1"])
    assert refused.exit_code == 1 and "Traceback" not in refused.output
    assert "holder 'key 1'" in refused.stderr and "1 to 64 letters, digits" in refused.stderr
    made = CliRunner().invoke(_app(), ["keys", "new", "alice@example.org", "--collection", "docs:read"])
    assert made.exit_code == 0, made.output
    key, *entry = made.stdout.strip().splitlines()
    path = tmp_path / "keys.toml"
    path.write_text("\n".join(entry) + "\n", encoding="utf-8")
    alice = KeyRing.read(path).caller(key)  # bare, [keys.alice@example.org] would not even be TOML
    assert alice.holder == "alice@example.org" and alice.may_read("docs") and not alice.may_read("other")


# --- who calls ----------------------------------------------------------------------------------------------

def test_the_transport_decides_the_caller_not_whether_headers_came():
    from rag.mcp.callers import NotAuthorised, caller_of

    key = new_key()[0]
    ring = KeyRing.plain([key])
    with pytest.raises(NotAuthorised, match="missing or wrong API key"):
        caller_of("http", None, ring)  # over HTTP with keys, no headers is no key
    with pytest.raises(NotAuthorised):
        caller_of("http", {"Authorization": "Bearer nope"}, ring)
    assert caller_of("http", {"authorization": f"Bearer {key}"}, ring).holder == "key 1"
    assert caller_of("stdio", None, ring) is LOCAL_USER
    assert caller_of("http", None, None) is LOCAL_USER  # loopback without keys


class HeldAnswers:
    """An answerer with two documents whose every answer waits until the
    test lets it go, then fails: a question in flight for as long as the
    test needs, without a model."""

    via = "test"

    def __init__(self) -> None:
        self.asking = threading.Event()  # an answer has begun
        self.go = threading.Event()
        self._folder = tempfile.TemporaryDirectory()
        self._conversations = None

    @property
    def conversations(self):
        """A real conversation store (a keyed caller's question runs in its holder's cache scope, made with
        the store's secret)."""
        if self._conversations is None:
            from rag.conversations import open_store

            self._conversations = open_store(Path(self._folder.name) / "c.sqlite")
        return self._conversations

    def prepare(self) -> None:
        pass

    def close(self) -> None:
        self.go.set()
        if self._conversations is not None:
            self._conversations.close()
        self._folder.cleanup()

    def documents(self, collection: str) -> list[dict]:
        return [{"id": "a1", "source": "a.md", "chunks": 1}, {"id": "b2", "source": "b.md", "chunks": 2}]

    @contextlib.contextmanager
    def stream(self, question, options):
        self.asking.set()
        self.go.wait(timeout=LONG)
        raise RagError("let go by the test")
        yield  # noqa: unreachable - a generator, for contextmanager


def _over_http(**settings):
    from rag.mcp.server import OverHTTP
    from rag.service.settings import ServiceSettings

    return OverHTTP.of(ServiceSettings(**({"api_keys": [], "watch": []} | settings)))


def test_a_tool_call_with_keys_and_no_headers_is_refused_not_the_local_users():
    """The SDK's in-memory transport carries no headers: built for HTTP with
    keys, the server refuses it; built for stdio, it answers."""
    from rag.mcp.connection import Connection
    from rag.mcp.server import build

    async def listed(server) -> tuple[bool, str]:
        with anyio.fail_after(60):
            async with Client(server) as client:
                result = await client.call_tool("list_documents", {})
                return result.is_error, text_of(result)

    keyed = build(Connection(HeldAnswers), _over_http(api_keys=[new_key()[0]]))
    is_error, text = anyio.run(listed, keyed)
    assert is_error and "missing or wrong API key" in text and "a.md" not in text
    is_error, text = anyio.run(listed, build(Connection(HeldAnswers)))
    assert not is_error and "a.md" in text


# --- MCP over HTTP in this process ----------------------------------------------------------------------------

@contextlib.contextmanager
def serving(http, host: str = "127.0.0.1"):
    """The real ``rag mcp --http`` application (the gate, the SDK's guard,
    the server) over ``http`` on ``host``, on a free port, with an answerer
    of :class:`HeldAnswers`: (its URL, the answerer)."""
    import uvicorn
    from sse_starlette.sse import AppStatus

    # sse-starlette (the SDK's event streams) ends every stream of the process once any uvicorn server in it
    # has been told to exit, and earlier tests stop servers of their own in this process: a fresh start.
    # `rag mcp --http` runs alone in its process, where that is the shutdown it is meant for.
    AppStatus.should_exit = False

    from rag.mcp.connection import Connection
    from rag.mcp.server import bind, build, http_app

    answerer = HeldAnswers()
    connection = Connection(lambda: answerer)
    sock = bind(host, 0)
    web = uvicorn.Server(uvicorn.Config(http_app(build(connection, http), host, http), log_level="warning"))
    thread = threading.Thread(target=web.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not web.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the MCP server did not start"
        time.sleep(0.05)
    try:
        yield f"http://{host}:{sock.getsockname()[1]}/mcp", answerer
    finally:
        answerer.go.set()
        web.should_exit = True
        thread.join(timeout=60)
        sock.close()


@contextlib.asynccontextmanager
async def session_at(url: str, key: str | None = None):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx2.AsyncClient(headers=headers, timeout=60) as client, \
            streamable_http_client(url, http_client=client) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def test_a_caller_may_have_only_its_questions_in_flight_and_gets_its_place_back():
    key = new_key()[0]
    with serving(_over_http(api_keys=[key], questions_in_flight=1)) as (url, answerer):
        async def main() -> None:
            with anyio.fail_after(120):
                async with session_at(url, key) as session, anyio.create_task_group() as group:
                    first: list = []

                    async def ask_first() -> None:
                        first.append(await session.call_tool("ask", {"question": "What is in a?"}))

                    group.start_soon(ask_first)
                    while not answerer.asking.is_set():
                        await anyio.sleep(0.02)
                    second = await session.call_tool("ask", {"question": "And in b?"})
                    assert second.is_error and "already has 1 questions in flight" in text_of(second), \
                        text_of(second)
                    assert "questions_in_flight" in text_of(second)
                    found = await session.call_tool("list_documents", {})  # only questions are counted
                    assert not found.is_error, text_of(found)
                    answerer.go.set()
                while not first:
                    await anyio.sleep(0.02)
                assert "let go by the test" in text_of(first[0])
                async with session_at(url, key) as session:  # the first one's place was given back
                    third = await session.call_tool("ask", {"question": "Once more?"})
                    assert third.is_error and "let go by the test" in text_of(third), text_of(third)

        anyio.run(main)


def test_a_body_over_the_limit_is_refused_when_sent_without_a_length():
    key = new_key()[0]
    with serving(_over_http(api_keys=[key], max_body_bytes=2048)) as (url, _):
        def chunks():
            yield b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"pad": "'
            for _ in range(8):
                yield b"x" * 1024
            yield b'"}}'

        refused = httpx2.post(url, content=chunks(), headers=MCP_HEADERS | {"Authorization": f"Bearer {key}"})
        assert refused.status_code == 413, refused.text
        assert "request body over 2048 bytes" in refused.json()["error"]["message"]
        small = httpx2.post(url, json=INITIALIZE, headers=MCP_HEADERS | {"Authorization": f"Bearer {key}"})
        assert small.status_code == 200, small.text


def test_without_keys_on_another_loopback_address_the_rebinding_guard_knows_it():
    with serving(_over_http(host="127.0.0.2"), host="127.0.0.2") as (url, _):
        rebound = httpx2.post(url, json=INITIALIZE, headers=MCP_HEADERS | {"Host": "evil.example"})
        assert rebound.status_code in (403, 421), rebound.text  # the gate's Host check, or the SDK's
        other_page = httpx2.post(url, json=INITIALIZE, headers=MCP_HEADERS | {"Origin": "http://evil.example"})
        assert other_page.status_code == 403, other_page.text

        async def main() -> None:
            with anyio.fail_after(60):
                async with session_at(url) as session:  # addressed as it is bound: let through
                    found = await session.call_tool("list_documents", {})
                    assert not found.is_error and "a.md" in text_of(found), text_of(found)

        anyio.run(main)


def test_the_sdks_rebinding_guard_knows_the_bound_address():
    from rag.mcp.server import rebinding_guard

    guard = rebinding_guard("127.0.0.2")
    assert guard.enable_dns_rebinding_protection
    assert {"127.0.0.1:*", "localhost:*", "[::1]:*", "127.0.0.2:*"} == set(guard.allowed_hosts)
    assert "http://127.0.0.2:*" in guard.allowed_origins
    assert "[::1]:*" in rebinding_guard("::1").allowed_hosts


# --- the resident server and the service's keys ----------------------------------------------------------------

def test_the_resident_server_is_started_without_the_services_keys(monkeypatch, tmp_path):
    from rag.resident.lifecycle import KEY_VARIABLES, server_environment
    from rag.resident.server import resident_settings
    from rag.service.settings import ServiceSettings

    fields = {f"RAG_SERVE_{name.upper()}" for name in ServiceSettings.model_fields}
    assert KEY_VARIABLES <= fields  # named as the settings read them
    shell_env = {"RAG_SERVE_KEYS_FILE": "k.toml", "rag_serve_api_keys": "k1", "RAG_SERVE_PUBLIC_DOCS": "1",
                 "RAG_SERVE_AUTH_FAILURES_PER_MINUTE": "3", "RAG_SERVE_MAX_BODY_BYTES": "4096", "HOME": "/h"}
    assert server_environment(shell_env) == {"RAG_SERVE_MAX_BODY_BYTES": "4096", "HOME": "/h"}

    # Even were they set where it runs, the resident server applies no keys.
    monkeypatch.setenv("RAG_SERVE_KEYS_FILE", str(_key_file(tmp_path, "alice")))
    monkeypatch.setenv("RAG_SERVE_API_KEYS", "k1,k2")
    assert ServiceSettings().keyed and not resident_settings().keyed


@pytest.fixture(scope="module")
def index(tmp_path_factory, embedder) -> Path:
    from rag import Pipeline

    root = tmp_path_factory.mktemp("side-doors")
    pipeline = Pipeline.open(root / "index", embedder=embedder)
    pipeline.ingest([write_corpus(root / "corpus")])
    pipeline.close()
    return root / "index"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    """A shell exporting the service's keys (a key file and a plain key), with
    a runtime folder of its own, and the key file's key; every server it
    started is stopped at the end."""
    folder = tmp_path_factory.mktemp("keyed")
    key = new_key()[0]
    keys = folder / "keys.json"
    keys.write_text(json.dumps({"keys": {"reader": {"sha256": key_hash(key), "collections": {"*": "read"}}}}),
                    encoding="utf-8")
    variables = shell(RAG_CONVERSATIONS=str(folder / "c.sqlite"), RAG_SERVE_KEYS_FILE=str(keys),
                      RAG_SERVE_API_KEYS=new_key()[0])
    yield variables, key
    stop_every_server(variables)


def test_rag_ask_answers_through_a_resident_server_started_where_the_services_keys_are_exported(keyed, index):
    env, _ = keyed
    done = rag(env, "ask", "What limits decode?", "--index", index, "--max-tokens", "8", "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["cli"]["via"] == "server" and answer["answer"].strip()
    (server,) = servers(env, index)
    environ = Path(f"/proc/{server['pid']}/environ")
    if environ.exists():  # Linux: what the server was started with
        names = {item.split(b"=", 1)[0] for item in environ.read_bytes().split(b"\0") if item}
        assert b"RAG_SERVE_KEYS_FILE" not in names and b"RAG_SERVE_API_KEYS" not in names


def test_mcp_over_http_keeps_the_services_limits(keyed, index):
    """``rag mcp --http`` with the service's keys and limits exported: wrong
    keys from one address are refused with 429 past the service's allowance,
    a body over the service's limit with 413, and ``ask`` declares and keeps
    the service's cap on answer tokens, answering within it through the
    resident server (started, or found, without the keys)."""
    env, key = keyed
    limited = env | {"RAG_SERVE_AUTH_FAILURES_PER_MINUTE": "100",  # a burst of 10
                     "RAG_SERVE_MAX_BODY_BYTES": "2048", "RAG_SERVE_MAX_TOKENS_LIMIT": "8"}
    process = subprocess.Popen(RAG + ["mcp", "--index", str(index), "--http", "--port", "0"], env=limited, cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = _announced_url(process)
        wrong = [httpx2.post(url, json=INITIALIZE, headers=MCP_HEADERS | {"Authorization": f"Bearer wrong{i}"})
                 for i in range(11)]
        assert [r.status_code for r in wrong] == [401] * 10 + [429], [r.text for r in wrong]
        assert int(wrong[-1].headers["Retry-After"]) >= 1
        assert "too many wrong API keys from this address" in wrong[-1].json()["error"]["message"]

        bearer = {"Authorization": f"Bearer {key}"}
        padded = INITIALIZE | {"params": INITIALIZE["params"] | {"pad": "x" * 4096}}
        too_big = httpx2.post(url, json=padded, headers=MCP_HEADERS | bearer)
        assert too_big.status_code == 413 and "request body over 2048 bytes" in too_big.text, too_big.text

        async def main() -> None:
            with anyio.fail_after(LONG):
                async with session_at(url, key) as session:  # a right key still comes in after the wrong ones
                    ask = {t.name: t for t in (await session.list_tools()).tools}["ask"]
                    declared = ask.input_schema["properties"]["max_tokens"]
                    assert (declared["maximum"], declared["default"]) == (8, 8)
                    over = await session.call_tool("ask", {"question": "What limits decode?", "max_tokens": 9})
                    assert over.is_error and "max_tokens: Input should be less than or equal to 8" in text_of(over)
                    within = await session.call_tool("ask", {"question": "What limits decode?", "max_tokens": 8,
                                                             "target_ttft": 30})
                    assert not within.is_error, text_of(within)
                    assert within.structured_content["answer"].strip()
                    assert within.structured_content["timings"]["decode_tokens"] <= 8

        anyio.run(main)
    finally:
        process.terminate()
        process.wait(timeout=60)

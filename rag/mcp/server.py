"""The MCP server of rag-budget, with the official ``mcp`` SDK's
``MCPServer``: the tools ``search``, ``ask``, ``list_documents`` and
``read_document``, and every document as the resource
``rag://documents/{doc_id}`` (its text as indexed), over stdio or
streamable HTTP.

Over HTTP it keeps the service's rules (``rag serve``'s settings, the
``RAG_SERVE_*`` variables): the service's own gate stands in front of the
transport (keys, wrong keys an address may send, the flood rate, the
request body limit; without keys, the Host and Origin of a loopback
server), ``ask`` keeps to the service's cap on answer tokens
(``max_tokens_limit``) and to the questions a caller may have in flight
(``questions_in_flight``), and the SDK's guard against DNS rebinding knows
the address the server is bound to.

Every argument is checked against the bounds its input schema declares
(the SDK validates them with pydantic); a refused argument, or a RagError
from answering, is a tool error whose text is one line, never a
traceback: ``Error executing tool search: k: Input should be greater than
or equal to 1``.

Does not: answer, search or read by itself (``tools`` does, over the
resident server or a pipeline: see ``connection``), nor parse the command
line (``rag.cli.mcp`` does).
"""

from __future__ import annotations

import contextlib
import inspect
import socket
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, AsyncIterator, Iterator, Optional

import anyio
import anyio.from_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError, UnexpectedToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import Resource, ToolAnnotations
from pydantic import Field, ValidationError
from pydantic.fields import FieldInfo

from ..errors import DocumentNotFound, RagError
from ..index.collection_names import DEFAULT_COLLECTION
from ..qa.options import MAX_TARGET_TTFT_S, AskOptions, CollectionName, offered
from ..retrieval.scope import Scope
from ..service.keys import Caller, KeyRing
from . import tools
from .callers import caller_of
from .connection import Connection

if TYPE_CHECKING:
    from ..service.metrics import Metrics
    from ..service.ratelimit import CallerLimits
    from ..service.settings import ServiceSettings

NAME = "rag-budget"
DOCUMENT_URI = "rag://documents/{doc_id}"
INSTRUCTIONS = (
    "Local documents, searched and answered from on this machine. `search` finds passages without the model; "
    "`ask` answers from the passages that fit a time-to-first-token budget, with numbered sources, the evidence "
    "sentences and what it cost; `list_documents` and `read_document` (or the resource rag://documents/{id}) "
    "read a document's text, where a source's char_start/char_end point."
)
READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=False)
# ask keeps the turns of its session: not read-only, nothing destroyed
ANSWERS = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)

SCOPE_EXAMPLE = ', e.g. {"sources": ["reports/**"], "types": ["md"]}; default all'
SCOPE = Field(description=AskOptions.describe("scope") + SCOPE_EXAMPLE + ".")


def one_line(exc: ValidationError) -> str:
    """The first problem of a refused argument, as one line:
    ``"k: Input should be greater than or equal to 1"``."""
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first.get("loc", ())) or "arguments"
    message = " ".join(str(first.get("msg", "invalid")).removeprefix("Value error, ").split())
    more = len(exc.errors()) - 1
    return f"{field}: {message}" + (f" (and {more} more)" if more else "")


@contextlib.contextmanager
def tool_errors() -> Iterator[None]:
    """RagErrors (and the file system's refusals) as tool errors with their one-line message."""
    try:
        yield
    except RagError as exc:
        raise ToolError(" ".join(str(exc).split())) from None
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename else ""
        raise ToolError((exc.strerror or str(exc)) + where) from None


class RagMCPServer(MCPServer):
    """``MCPServer`` with this server's two differences: a refused argument
    is reported in one line (the SDK gives pydantic's whole report), and
    every document is listed as a resource."""

    def __init__(self, connection: Connection, keys: KeyRing | None = None, **options: Any) -> None:
        super().__init__(NAME, instructions=INSTRUCTIONS, lifespan=_warming(connection), **options)
        self.connection, self.keys = connection, keys

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Context | None = None):
        try:
            return await super().call_tool(name, arguments, context)
        except UnexpectedToolError:
            raise
        except ToolError as exc:
            if isinstance(exc.__cause__, ValidationError):
                raise ToolError(f"Error executing tool {name}: {one_line(exc.__cause__)}") from exc.__cause__
            raise

    async def list_resources(self) -> list[Resource]:
        """Every document in the index, as ``rag://documents/{id}``; none
        (no error) while the index cannot be read, for a client lists
        resources on its own, unasked. With keys, none: a resource is read
        with no collection to check a key's rights against (read_document is)."""
        if self.keys is not None:
            return []
        try:
            docs = (await anyio.to_thread.run_sync(tools.list_documents, self.connection))["documents"]
        except (RagError, OSError):
            return []
        return [Resource(uri=DOCUMENT_URI.format(doc_id=d["id"]), name=d["source"], mime_type="text/plain",
                         description=f"{d['source']} as indexed ({d['chunks']} chunks)") for d in docs]


def _warming(connection: Connection):
    """A lifespan that opens the answerer in the background as the server
    starts serving: on stdio only once the SDK holds stdout, so nothing a
    model prints while loading can reach the client's stream."""
    @contextlib.asynccontextmanager
    async def lifespan(_server) -> AsyncIterator[dict]:
        connection.warm()
        yield {}

    return lifespan


COLLECTION = Field(description=AskOptions.describe("collection") + ".")


# The names the SDK's guard against DNS rebinding knows a loopback server by (its own list for 127.0.0.1).
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


@dataclass
class OverHTTP:
    """What serving over HTTP keeps of the service: its settings (``rag
    serve``'s, from the ``RAG_SERVE_*`` variables), the keys it accepts
    (none: loopback, no key needed) and its limits per caller. It is what
    the service's gate reads of the service's state (``ServiceState``),
    so the gate stands in front of MCP as it stands in front of the service."""

    settings: ServiceSettings
    keys: KeyRing
    limits: CallerLimits
    metrics: Metrics  # the gate counts the requests it refuses; MCP serves no /metrics

    @classmethod
    def of(cls, settings: ServiceSettings) -> "OverHTTP":
        """The keys and limits ``settings`` ask for; a RagError naming a key file that cannot be read."""
        from ..service.metrics import Metrics
        from ..service.ratelimit import CallerLimits

        return cls(settings, settings.keyring(), CallerLimits.of(settings), Metrics())

    @property
    def max_tokens(self) -> int:
        """The most answer tokens ``ask`` may be asked for: the service's cap, within the tool's own."""
        return min(tools.MAX_ANSWER_TOKENS, self.settings.max_tokens_limit)


def build(connection: Connection, http: OverHTTP | None = None) -> RagMCPServer:
    """The MCP server whose tools answer over ``connection``: on stdio
    (``http`` None) as the local user, with every right; over HTTP with
    the service's keys, each call as the holder of its request's bearer
    key (a call without one is refused), without keys (loopback) as the
    local user; over HTTP, ``ask`` within the service's limits."""
    keys = http.keys if http is not None and http.settings.keyed else None
    server = RagMCPServer(connection, keys, log_level="WARNING")
    transport = "stdio" if http is None else "http"

    def who(ctx: Context) -> Caller:
        return caller_of(transport, ctx.headers, keys)

    _add_reading_tools(server, connection, who, keys)
    _add_ask(server, connection, who, http)
    return server


def asked_parameters(most_tokens: int, options: "type[AskOptions] | None" = None) -> list[inspect.Parameter]:
    """``ask``'s arguments after the question: every option offered on MCP
    (``rag.qa.options.offered``), each with its declared type, bounds and
    words, optional (None: the set-up's default); ``max_tokens`` within
    ``most_tokens`` and by default the lesser of its default and that."""
    made = []
    for o in offered("mcp", options):
        words = o.words(default=False)
        annotation, default, extra = Optional[o.field.annotation], None, ()
        if o.name == "max_tokens":
            annotation, default, extra = int, min(int(o.field.default), most_tokens), (Field(le=most_tokens),)
        elif o.name == "target_ttft":
            extra, words = (Field(le=MAX_TARGET_TTFT_S),), f"{words} (default: the set-up's)"
        elif o.name == "scope":
            words += SCOPE_EXAMPLE
        info = FieldInfo.merge_field_infos(o.field, default=default, description=words + ".")
        made.append(inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                      annotation=Annotated[(annotation, info, *extra)]))
    return made


def _with_options(tool, most_tokens: int):
    """``tool`` (question, ctx, **asked) as the SDK sees it: its signature
    holds the question's offered options (:func:`asked_parameters`)."""
    fixed = list(inspect.signature(tool, eval_str=True).parameters.values())[:2]
    parameters = fixed + asked_parameters(most_tokens)
    tool.__signature__ = inspect.Signature(parameters, return_annotation=dict[str, Any])
    tool.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": dict[str, Any]}
    return tool


@contextlib.contextmanager
def _question_held(http: OverHTTP | None, ctx: Context, caller: Caller) -> Iterator[None]:
    """Over HTTP, a place among the questions its caller has in flight
    (the service's ``questions_in_flight``: the caller is who the gate
    counted the request against, its key or else its address); a RagError
    when it already has as many as it may. Nothing on stdio."""
    if http is None:
        yield
        return
    request = ctx.request_context.request
    counted = getattr(request, "scope", {}).get("rag.caller") or f"key:{caller.holder}"
    questions = http.limits.questions
    if questions.enter(counted) is not None:
        raise RagError(f"this caller already has {questions.most} questions in flight, the most it may "
                       "(questions_in_flight); ask again once one is answered")
    try:
        yield
    finally:
        questions.leave(counted)


def _add_ask(server: RagMCPServer, connection: Connection, who, http: OverHTTP | None) -> None:
    """The ``ask`` tool: over HTTP its ``max_tokens`` within the service's
    limit and its questions in flight counted as the service counts them."""
    most_tokens = tools.MAX_ANSWER_TOKENS if http is None else http.max_tokens

    def ask(
        question: Annotated[str, Field(min_length=1, max_length=tools.MAX_QUESTION_CHARS,
                                       description="The question to answer from your documents.")],
        ctx: Context,
        **asked: Any,
    ) -> dict[str, Any]:
        """Answer QUESTION from your documents with the local model, choosing as many passages as fit the
        time-to-first-token target. Returns the answer, its numbered sources (its citations [n] refer to
        them), the evidence sentences found without the model, and what it cost: measured and predicted
        TTFT, prompt and cached tokens, passages chosen."""
        def progress(text: str) -> None:  # the answer so far, as progress (a no-op unless the client asked)
            anyio.from_thread.run(ctx.report_progress, len(text), None, text[-200:])

        with tool_errors():
            caller = who(ctx)
            with _question_held(http, ctx, caller):
                given = {name: value for name, value in asked.items() if value is not None}
                return tools.ask(connection, question, given, on_text=progress, caller=caller)

    server.tool(annotations=ANSWERS)(_with_options(ask, most_tokens))


def _add_reading_tools(server: RagMCPServer, connection: Connection, who, keys: KeyRing | None) -> None:
    """The tools and the resource that read without the model: ``search``,
    ``list_documents``, ``read_document`` and ``rag://documents/{id}``
    (not with keys: ``read_document`` checks the caller's rights)."""
    @server.tool(annotations=READ_ONLY)
    def search(
        query: Annotated[str, Field(min_length=1, max_length=tools.MAX_QUESTION_CHARS,
                                    description="What to look for.")],
        ctx: Context,
        k: Annotated[int, Field(ge=1, le=tools.MAX_SEARCH_K, description="How many chunks to return.")] = 5,
        scope: Annotated[Optional[Scope], SCOPE] = None,
        collection: Annotated[CollectionName, COLLECTION] = DEFAULT_COLLECTION,
    ) -> dict[str, Any]:
        """The chunks of your documents that best match QUERY, best first, without asking the model: each
        with its text, source, where it lies, score, and doc_id (for read_document)."""
        with tool_errors():
            return tools.search(connection, query, k, scope, collection=collection, caller=who(ctx))

    @server.tool(annotations=READ_ONLY)
    def list_documents(
        ctx: Context, collection: Annotated[CollectionName, COLLECTION] = DEFAULT_COLLECTION,
    ) -> dict[str, Any]:
        """Every document in the index: its id (for read_document and rag://documents/{id}), source and chunks."""
        with tool_errors():
            return tools.list_documents(connection, collection=collection, caller=who(ctx))

    @server.tool(annotations=READ_ONLY)
    def read_document(
        doc_id: Annotated[str, Field(min_length=1, max_length=tools.MAX_DOC_ID_CHARS,
                                     description="A document id from list_documents, search or ask.")],
        ctx: Context,
        start: Annotated[int, Field(ge=0, description="First character to return.")] = 0,
        end: Annotated[Optional[int], Field(ge=0, description="Character to stop before (default: the end).")] = None,
        collection: Annotated[CollectionName, COLLECTION] = DEFAULT_COLLECTION,
    ) -> dict[str, Any]:
        """The text of a document as the index holds it (sources' char_start/char_end are offsets into it),
        from START to END, at most 20,000 characters a call: `more` says whether text follows `end`."""
        with tool_errors():
            return tools.read_document(connection, doc_id, start, end, collection=collection, caller=who(ctx))

    @server.resource(DOCUMENT_URI, name="document", mime_type="text/plain",
                     description="A document's text as the index holds it.")
    def document(doc_id: str) -> str:
        if keys is not None:  # as list_resources: with keys, read_document is the way, its rights checked
            raise ResourceNotFoundError(f"no document {doc_id!r} as a resource; use read_document")
        try:
            return str(tools.document_text(connection, doc_id)["text"])
        except DocumentNotFound as exc:
            raise ResourceNotFoundError(str(exc)) from None
        except RagError as exc:
            raise ResourceError(str(exc)) from None


def serve_stdio(connection: Connection) -> None:
    """Serve MCP on this process's stdin and stdout until the client closes them."""
    anyio.run(build(connection).run_stdio_async)


def rebinding_guard(host: str) -> TransportSecuritySettings:
    """The SDK's guard against DNS rebinding for a server bound to the
    loopback ``host`` without keys: requests addressed (``Host``) and sent
    from pages (``Origin``) by a loopback name the SDK knows or by ``host``
    itself, at any port. The SDK guards only the three names it knows, and
    not at all a server bound to another (127.0.0.2 is loopback too)."""
    shown = f"[{host}]" if ":" in host else host
    names = list(dict.fromkeys([*LOOPBACK_NAMES, shown]))
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=[f"{n}:*" for n in names],
                                     allowed_origins=[f"http://{n}:*" for n in names])


def http_app(server: RagMCPServer, host: str, http: OverHTTP):
    """The ASGI application serving ``server`` over streamable HTTP at
    ``/mcp`` for a server bound to ``host``, behind the service's gate
    (``rag.service.gate``), which reads ``http`` as the service's state:
    with keys, every request needs one (401; 429 once an address has sent
    too many wrong ones), and every request keeps to the service's flood
    rate and body limit (413). Without keys the SDK's guard knows ``host``."""
    from ..service.gate import Gate  # the service's, with FastAPI: not on stdio

    guard = None if http.settings.keyed else rebinding_guard(host)  # keyed: the SDK's own choice, as before
    return Gate(server.streamable_http_app(host=host, transport_security=guard), state=http)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (0: any free port); a
    RagError saying why when it cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise RagError(f"cannot listen on {host}:{port} ({exc.strerror or exc})") from None
    return sock


def serve_http(connection: Connection, host: str, port: int, settings: ServiceSettings) -> None:
    """Serve MCP over streamable HTTP at ``http://HOST:PORT/mcp`` until
    interrupted, saying where on stderr once it listens, with the service's
    ``settings`` (its keys, with each tool call as its key's holder, and
    its limits: :func:`http_app`); a RagError naming a key file that
    cannot be read, or a port that cannot be had."""
    import uvicorn

    http = OverHTTP.of(settings)
    server = build(connection, http)
    sock = bind(host, port)
    shown = f"[{host}]" if ":" in host else host
    web = uvicorn.Server(uvicorn.Config(http_app(server, host, http), log_level="warning"))
    connection.warm()
    print(f"rag mcp: streamable HTTP at http://{shown}:{sock.getsockname()[1]}/mcp", file=sys.stderr, flush=True)
    web.run(sockets=[sock])

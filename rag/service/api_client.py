"""The service's HTTP API as an :class:`~rag.qa.answerer.Answerer`: what
``POST /v1/ask`` streams, ``/v1/search``, the documents and the sessions,
read back into the same answers, hits and conversations a pipeline in this
process gives. The resident client (over a Unix socket, to this set-up's
own server) and the service client (over HTTP, to a ``rag serve``
elsewhere) are this, each with its own transport.

Does not: import FastAPI, the index, the engine or the models (``search``
imports the index's ``Hit``, and numpy with it); choose a server or send
bytes (a subclass does).
"""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING, Generator, Iterator
from urllib.parse import quote

from ..conversations.store import Conversation, Turn
from ..errors import Overloaded, QuestionTooLong, RagError
from ..index.collection_names import DEFAULT_COLLECTION
from ..qa.answer import Answer, Budget, Evidence
from ..qa.options import AskOptions
from ..qa.stream import AnswerEvent, AnswerStream, EvidenceFound, TextPiece
from ..retrieval.scope import Scope
from ..settings import Settings

if TYPE_CHECKING:
    from ..qa.pipeline import Retrieval


def api_error(status: int, data: bytes, retry_after: str | None = None) -> RagError:
    """The error a failed response of the service carries (its ``{"error":
    {"message", "type"}}``): Overloaded for a 429 (with its Retry-After),
    QuestionTooLong for a 413, else a RagError with its message."""
    try:
        message = str(json.loads(data)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = f"the rag server answered {status}"
    if status == 429:
        return Overloaded(message, float(retry_after) if retry_after and retry_after.isdigit() else 1.0)
    return QuestionTooLong(message) if status == 413 else RagError(message)


def _answer_of(d: dict) -> Answer:
    # Figures of other callers' prompts a server withholds from a key's holder (null: rag.service.owners)
    # are read as not known here: their defaults.
    timings = {name: value for name, value in (d.get("timings") or {}).items() if value is not None}
    return Answer.from_dict(d | {"timings": timings})


class ApiAnswerer:
    """Questions answered and documents read by a rag server, through its
    HTTP API: a subclass gives the transport (:meth:`_call`,
    :meth:`_events`); ``settings`` are this side's (the target, the
    retrieval mode and the evidence floor a question leaves to the set-up
    are written into it here, as a pipeline here would)."""

    via = "server"
    server_pid: int | None = None

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._sessions: set[str] = set()  # the conversations this client asked in

    # -- the transport, given by a subclass ---------------------------------------

    def _call(self, method: str, path: str, body: dict | None = None, *, missing_ok: bool = False) -> dict | None:
        """One request and its JSON answer; None for a 404 when ``missing_ok``."""
        raise NotImplementedError

    def _events(self, path: str, body: dict) -> Iterator[dict]:
        """The server-sent events of a streamed POST to ``path``, each ``data:`` line's JSON."""
        raise NotImplementedError

    def _unfinished(self) -> RagError:
        """The error for an answer the server ended without its sources and timings."""
        return RagError("the rag server ended the answer without its sources and timings")

    # -- the Answerer ----------------------------------------------------------------

    def prepare(self) -> None:
        """Nothing to load here: the server has."""

    def stream(self, question: str, options: AskOptions) -> AnswerStream:
        """The answer to ``question``, streamed from the server as the
        pipeline's :meth:`~rag.qa.pipeline.Pipeline.stream` would give it:
        iterate for text (or :meth:`~AnswerStream.events`), then read
        ``.answer``. Closing it early (Ctrl-C) hangs up, which stops the
        generation on the server."""
        if options.session is not None:
            self._sessions.add(options.session)
        options = options.resolved(self.settings)  # this side's defaults, as the pipeline here would
        body = options.wire() | {"question": question, "stream": True}
        if options.cache_scope:
            body["cache_scope"] = options.cache_scope  # the caller MCP answers for (the resident socket is trusted)
        return AnswerStream(self._answer(body))

    def _answer(self, body: dict) -> Generator[AnswerEvent, None, Answer]:
        with contextlib.closing(self._events("/v1/ask", body)) as events:
            for event in events:
                if "delta" in event:
                    yield TextPiece(event["delta"])
                elif "evidence" in event:  # as in process: known before the first token
                    yield EvidenceFound(tuple(Evidence.from_dict(e) for e in event["evidence"]))
                elif "answer" in event:
                    return _answer_of(event["answer"])
                elif "error" in event:
                    raise RagError(event["error"]["message"])
        raise self._unfinished()

    def budgeted(self, question: str, options: AskOptions | None = None, **changes) -> "Retrieval":
        """The chunks :meth:`stream` would put into the prompt for
        ``question`` (same options), in prompt order, with the budget that
        chose them, as the server plans them (``POST /v1/retrieve``);
        nothing is generated."""
        from ..index.store import Hit  # numpy comes with it; a question does not need it
        from ..qa.pipeline import Retrieval

        options = AskOptions.of(options, **changes).resolved(self.settings)
        d = self._call("POST", "/v1/retrieve", options.wire() | {"question": question})
        return Retrieval(tuple(Hit(**h) for h in d["hits"]), Budget.from_dict(d["budget"]))

    def search(self, query: str, k: int = 5, *, mode: str | None = None, scope: Scope | None = None,
               collection: str = DEFAULT_COLLECTION) -> list:
        """The ``k`` chunks that best match ``query``, as
        :meth:`~rag.qa.pipeline.Pipeline.search` gives them."""
        from ..index.store import Hit  # numpy comes with it; a question does not need it

        body = {"query": query, "k": k, "retrieval": mode or self.settings.retrieval, "collection": collection}
        if scope is not None and scope != Scope():
            body["scope"] = scope.model_dump(mode="json")
        return [Hit(**r) for r in self._call("POST", "/v1/search", body)["results"]]

    def documents(self, collection: str = DEFAULT_COLLECTION) -> list[dict[str, object]]:
        """The documents of ``collection`` in the server's index, as
        :meth:`~rag.qa.pipeline.Pipeline.documents` gives them."""
        return self._call("GET", f"/v1/documents?collection={quote(collection, safe='')}")["documents"]

    def document_text(self, doc_id: str, collection: str = DEFAULT_COLLECTION) -> dict[str, object]:
        """The text of the document ``doc_id`` of ``collection`` as the
        server's index holds it (``GET /v1/documents/{doc_id}/text``):
        ``id``, ``source``, ``text``, ``pages`` and ``current``; a RagError
        when it has none."""
        return self._call("GET", f"/v1/documents/{quote(doc_id, safe='')}/text?collection={quote(collection, safe='')}")

    def conversation(self, session: str) -> Conversation:
        """A view of the stored conversation ``session``: its summary and
        recent turns (the prompts they were asked with stay on the server)."""
        d = self._call("GET", f"/v1/sessions/{quote(session, safe='')}", missing_ok=True)
        if d is None:
            return Conversation(session)
        turns = tuple(Turn(t["number"], t["question"], "", t["answer"], 0, tuple(t.get("sources") or ()))
                      for t in d["turns"])
        return Conversation(session, summary=d.get("summary", ""), turns=turns, folded=d.get("folded", 0))

    def reset(self, session: str) -> None:
        """Forget conversation ``session`` on the server (nothing to forget is no error)."""
        self._call("DELETE", f"/v1/sessions/{quote(session, safe='')}", missing_ok=True)

    @property
    def background_log(self) -> list[dict[str, object]]:
        """The server's background work is its own: none is logged here."""
        return []

    def background_busy(self) -> bool:
        """False: the server finishes background work on its own time."""
        return False

    def wait_idle(self) -> float:
        """Nothing to wait for here (the server keeps running)."""
        return 0.0

    def close(self) -> None:
        """Nothing is held between requests."""

"""The command line's side of the resident server: reach the server of
this set-up (started in the background if none runs, see ``lifecycle``) and
ask, search and keep conversations through it, offering the part of
:class:`~rag.qa.pipeline.Pipeline` that ``rag ask``, ``rag chat``,
``rag search`` and ``rag mcp`` use, so they print the same thing either way. A request
that the server took nothing from (it was stopping, or went away before
answering) is sent again to a fresh server, so an idle server stopping as
a question arrives loses no question.

Does not: import the index, the engine, numpy or the models (a question
through a running server imports none of them; ``search`` imports the
index's ``Hit``, and numpy with it); serve (``server`` does).
"""

from __future__ import annotations

import threading
from typing import Callable, Generator
from urllib.parse import quote

from ..conversations.opening import open_store
from ..conversations.store import Conversation, Conversations, Turn
from ..errors import RagError
from ..index.collection_names import DEFAULT_COLLECTION
from ..qa.answer import Answer, Evidence
from ..qa.options import AskOptions
from ..qa.stream import AnswerEvent, AnswerStream, EvidenceFound, TextPiece
from ..retrieval.scope import Scope
from ..settings import Settings
from .address import Address
from .lifecycle import ensure_running
from .wire import BROKEN, Unanswered, call, error_of, events, exchange

ATTEMPTS = 3  # servers a request is sent to when each one goes away before answering it


class ResidentClient:
    """A running resident server, used like the parts of a Pipeline that the
    question commands use: :meth:`stream`, :meth:`search`,
    :meth:`conversation`, :meth:`reset`, :attr:`background_log`."""

    via = "server"

    def __init__(self, address: Address, settings: Settings, info: dict,
                 notice: Callable[[str], None] = lambda message: None) -> None:
        self.address, self.settings, self.info, self._notice = address, settings, info, notice
        self.server_pid: int = info["pid"]
        self._socket = str(address.socket)
        self._sessions: set[str] = set()  # the conversations this client asked in
        self._store: Conversations | None = None
        self._store_lock = threading.Lock()

    @classmethod
    def connect(cls, settings: Settings, notice: Callable[[str], None] = lambda message: None) -> "ResidentClient":
        """The server of the set-up ``settings`` describe, started if none
        runs; ``notice`` is told what it noted while starting."""
        address = Address.of(settings)
        return cls(address, settings, ensure_running(address, settings, notice), notice)

    def _gone(self, exc: BaseException) -> RagError:
        return RagError(f"the rag server (pid {self.server_pid}) stopped answering ({exc or type(exc).__name__}); "
                        f"its log: {self.address.log}; try again, or use --no-server")

    def _another(self, attempt: int, exc: Unanswered) -> None:
        """After the server took nothing from a request: reach a fresh one
        (started if need be) to send it again, or the error when this was
        the last attempt."""
        if attempt + 1 >= ATTEMPTS:
            raise self._gone(exc) from None
        self.info = ensure_running(self.address, self.settings, self._notice)
        self.server_pid = self.info["pid"]

    def _call(self, method: str, path: str, body: dict | None = None, **options) -> dict | None:
        for attempt in range(ATTEMPTS):
            try:
                return call(self._socket, method, path, body, **options)
            except Unanswered as exc:
                self._another(attempt, exc)
            except BROKEN as exc:
                raise self._gone(exc) from None

    # -- what the question commands use of a Pipeline ---------------------------

    def prepare(self) -> None:
        """Nothing to load here: the server has."""

    def stream(self, question: str, options: AskOptions) -> AnswerStream:
        """The answer to ``question``, streamed from the server as the
        pipeline's :meth:`~rag.qa.pipeline.Pipeline.stream` would give it:
        iterate for text, then read ``.answer``. Closing it early (Ctrl-C)
        hangs up, which stops the generation on the server."""
        if options.session is not None:
            self._sessions.add(options.session)
        return AnswerStream(self._answer(self._ask_body(question, options)))

    def _ask_body(self, question: str, options: AskOptions) -> dict:
        # Every option the HTTP surface offers, by its wire name, with this set-up's defaults written in.
        options = options.resolved(self.settings)
        body = options.wire() | {"question": question, "stream": True}
        if options.cache_scope:
            body["cache_scope"] = options.cache_scope  # the caller MCP answers for (its socket is trusted)
        return body

    def _answer(self, body: dict) -> Generator[AnswerEvent, None, Answer]:
        for attempt in range(ATTEMPTS):
            try:
                with exchange(self._socket, "POST", "/v1/ask", body, timeout=None) as response:
                    if response.status != 200:
                        raise error_of(response, response.read())  # Unanswered (nothing yielded) if stopping
                    for event in events(response):
                        if "delta" in event:
                            yield TextPiece(event["delta"])
                        elif "evidence" in event:
                            # As in process: the evidence is known before the first token.
                            yield EvidenceFound(tuple(Evidence.from_dict(e) for e in event["evidence"]))
                        elif "answer" in event:
                            return Answer.from_dict(event["answer"])
                        elif "error" in event:
                            raise RagError(event["error"]["message"])
                break
            except Unanswered as exc:  # raised only before the status line: nothing was yielded yet
                self._another(attempt, exc)
            except BROKEN as exc:
                raise self._gone(exc) from None
        raise RagError(f"the rag server ended the answer without its sources and timings; its log: {self.address.log}")

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
        """The server's latest background work (summaries, prefills) for the
        conversations this client asked in, oldest first: what a pipeline in
        this process would have logged."""
        if not self._sessions:
            return []
        log = self._call("GET", "/v1/resident/background")["background"]
        return [e for e in log if e.get("session") in self._sessions]

    def background_busy(self) -> bool:
        """False: the server finishes background work on its own time."""
        return False

    def wait_idle(self) -> float:
        """Nothing to wait for here (the server keeps running)."""
        return 0.0

    @property
    def conversations(self) -> Conversations:
        """The conversation store the server keeps, opened here too on first
        use (it may be shared between processes): where the MCP tools claim
        a session id for their caller before the server answers in it."""
        with self._store_lock:
            if self._store is None:
                self._store = open_store(self.settings.conversations_path)
            return self._store

    def close(self) -> None:
        """Close the conversation store if it was opened; nothing else is
        held between requests (each is a connection of its own)."""
        with self._store_lock:
            if self._store is not None:
                self._store.close()
                self._store = None

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
from typing import Callable, Iterator

from ..conversations.opening import open_store
from ..conversations.store import Conversations
from ..errors import RagError
from ..service.api_client import ApiAnswerer
from ..settings import Settings
from .address import Address
from .lifecycle import ensure_running
from .wire import BROKEN, Unanswered, call, error_of, events, exchange

ATTEMPTS = 3  # servers a request is sent to when each one goes away before answering it


class ResidentClient(ApiAnswerer):
    """A running resident server, answering as a Pipeline would: the
    service's API (:class:`~rag.service.api_client.ApiAnswerer`) over this
    set-up's Unix socket, each request sent again to a fresh server where
    the one it reached took nothing from it."""

    via = "server"

    def __init__(self, address: Address, settings: Settings, info: dict,
                 notice: Callable[[str], None] = lambda message: None) -> None:
        super().__init__(settings)
        self.address, self.info, self._notice = address, info, notice
        self.server_pid: int = info["pid"]
        self._socket = str(address.socket)
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

    def _events(self, path: str, body: dict) -> Iterator[dict]:
        for attempt in range(ATTEMPTS):
            try:
                with exchange(self._socket, "POST", path, body, timeout=None) as response:
                    if response.status != 200:
                        raise error_of(response, response.read())  # Unanswered (nothing yielded) if stopping
                    yield from events(response)
                return
            except Unanswered as exc:  # raised only before the status line: nothing was yielded yet
                self._another(attempt, exc)
            except BROKEN as exc:
                raise self._gone(exc) from None

    def _unfinished(self) -> RagError:
        return RagError(f"the rag server ended the answer without its sources and timings; its log: {self.address.log}")

    @property
    def background_log(self) -> list[dict[str, object]]:
        """The server's latest background work (summaries, prefills) for the
        conversations this client asked in, oldest first: what a pipeline in
        this process would have logged."""
        if not self._sessions:
            return []
        log = self._call("GET", "/v1/resident/background")["background"]
        return [e for e in log if e.get("session") in self._sessions]

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

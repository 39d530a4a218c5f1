"""What the MCP tools answer with: the resident server of this set-up,
reached as ``rag ask`` reaches it (``rag.resident.client``), or, where
``rag ask`` would answer in process (``--no-server``, ``RAG_NO_SERVER=1``),
a pipeline in this process. It is opened once, on first need, from
whichever thread needs it first; the others wait for the same one.

Does not: decide which of the two to open (the command hands over a
function that opens it, as ``rag ask`` does) or shape what the tools return
(``tools`` does).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from ..qa.answerer import Answerer


class Connection:
    """The answerer ``open_answerer`` gives, opened on the first call of
    :meth:`get` (or :meth:`warm`) and kept; a failed opening is tried again
    by the next call, so a server that could not start is not fatal."""

    def __init__(self, open_answerer: Callable[[], "Answerer"]) -> None:
        self._open = open_answerer
        self._lock = threading.Lock()
        self._answerer: Answerer | None = None

    def get(self) -> "Answerer":
        """The answerer, opened (and its models loaded, in process) if not yet;
        a RagError saying why when it cannot be."""
        with self._lock:  # one opening at a time: a second caller waits for the first's answerer
            if self._answerer is None:
                answerer = self._open()
                answerer.prepare()  # in process: load now, not inside a question's time to first token
                self._answerer = answerer
            return self._answerer

    def warm(self) -> None:
        """Open the answerer now, on a thread of its own, so the first tool
        call finds it ready; an error is left for that call to report."""
        def run() -> None:
            try:
                self.get()
            except Exception:  # noqa: BLE001 - reported by the tool call that needs it, in one line
                pass

        threading.Thread(target=run, name="rag-mcp-warm", daemon=True).start()

    def close(self) -> None:
        """Release what was opened (a pipeline's index and stores; nothing
        for a server's client). One still being opened is left to end with
        the process: a client hanging up does not wait for a model to load."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            if self._answerer is not None:
                self._answerer.close()
                self._answerer = None
        finally:
            self._lock.release()

"""What answers a question for a front end: the one protocol the command
line and MCP call, whether the question is answered in this process
(:class:`~rag.qa.pipeline.Pipeline`), by this set-up's resident server
(:class:`~rag.resident.client.ResidentClient`) or by a ``rag serve``
elsewhere (:class:`~rag.service.client.ServiceClient`) (issue 56). The
HTTP service's routes answer through a Pipeline, and the LangChain
retriever reads any answerer's budget.

Does not: answer anything itself; it only says what an answerer offers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ..conversations import Conversation, Conversations
    from ..index.records import Hit
    from .options import AskOptions
    from .pipeline import Retrieval
    from .stream import AnswerStream


@runtime_checkable
class Answerer(Protocol):
    """Questions answered and documents read, by this process or a server.
    ``via``: ``"process"``, ``"server"`` (this set-up's resident server) or
    ``"service"`` (a ``rag serve`` elsewhere); ``server_pid``: the resident
    server's process (None otherwise)."""

    via: str
    server_pid: int | None

    def prepare(self) -> None:
        """Load now what a question needs (nothing where a server has)."""
        ...

    def stream(self, question: str, options: "AskOptions") -> "AnswerStream":
        """The answer to ``question``, as it is generated."""
        ...

    def budgeted(self, question: str, options: "AskOptions | None" = None, **changes) -> "Retrieval":
        """The chunks :meth:`stream` would put into the prompt for
        ``question``, in prompt order, with the budget that chose them;
        nothing is generated (the LangChain retriever reads this)."""
        ...

    def search(self, query: str, k: int = 5, **options) -> list["Hit"]:
        """The ``k`` chunks that best match ``query``."""
        ...

    def documents(self, collection: str = ...) -> list[dict[str, object]]:
        """The documents of ``collection``: id, source and what the index holds of each."""
        ...

    def document_text(self, doc_id: str, collection: str = ...) -> dict[str, object]:
        """The text of a document as the index holds it (``GET /v1/documents/{doc_id}/text``'s object)."""
        ...

    def conversation(self, session: str) -> "Conversation":
        """The stored conversation ``session``: its summary and recent turns."""
        ...

    def reset(self, session: str) -> None:
        """Forget conversation ``session``."""
        ...

    def background_log(self) -> list[dict[str, object]]:
        """The latest background work (summaries, prefills)."""
        ...

    def background_busy(self) -> bool:
        """Whether background work is still running here."""
        ...

    def wait_idle(self) -> float:
        """Wait for background work here to finish; the seconds waited."""
        ...

    def close(self) -> None:
        """Release what is held."""
        ...


@runtime_checkable
class SharesStore(Protocol):
    """An answerer whose conversation store this process may open too (a
    pipeline here, or this set-up's resident server, whose store is a file
    or database both reach): where the MCP tools claim a session id for
    their caller before it is answered in. A ``rag serve`` elsewhere keeps
    its own."""

    @property
    def conversations(self) -> "Conversations":
        """The conversation store."""
        ...

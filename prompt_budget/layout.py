"""The order and wording of a prompt.

A prompt is ``[system prompt][retrieved passages][question]``: the system
prompt comes first and never changes, byte for byte, so an engine can reuse
its cached KV prefix from one request to the next.

Does not: apply a chat template (the backend does, with the model's own)
or decide which passages go in (see ``budgeter``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from engine.backend import Message

# Byte-stable on purpose: no dates, counts or settings in it.
SYSTEM_PROMPT = (
    "You are rag-budget, an assistant that answers questions from the user's documents. "
    "Answer using only the numbered context passages in the user's message, and cite them "
    "by number, like [1]. If the passages do not contain the answer, say that you do not know."
)


@dataclass(frozen=True)
class ContextPassage:
    """A retrieved passage as it is shown to the model."""

    source: str
    text: str
    page: int | None = None


def format_passage(number: int, passage: ContextPassage) -> str:
    """One numbered passage with its source.

    ``format_passage(1, ContextPassage("a.md", "Hi")) -> "[1] (a.md)\\nHi"``
    """
    where = passage.source if passage.page is None else f"{passage.source}, page {passage.page}"
    return f"[{number}] ({where})\n{passage.text.strip()}"


def user_message(question: str, passages: Sequence[ContextPassage]) -> str:
    """The user turn: the numbered passages, then the question."""
    if not passages:
        return f"Context: (no passages found)\n\nQuestion: {question.strip()}"
    blocks = "\n\n".join(format_passage(i, p) for i, p in enumerate(passages, start=1))
    return f"Context:\n\n{blocks}\n\nQuestion: {question.strip()}"


def build_messages(
    question: str, passages: Sequence[ContextPassage], system: str = SYSTEM_PROMPT
) -> list[Message]:
    """The chat messages of one request: the system prompt, then one user
    turn holding the passages and the question."""
    return [Message("system", system), Message("user", user_message(question, passages))]

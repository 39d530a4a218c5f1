"""The order and wording of a prompt.

A prompt is ``[system prompt][conversation summary][recent turns][retrieved
passages][question]``, most stable first, so that consecutive prompts of one
conversation share the longest token prefix and an engine reuses its cached
KV for it: the system prompt never changes, byte for byte; the summary
changes only when older turns are folded into it; a recent turn is shown
exactly as it was prompted (its passages included) until it is folded, so
each prompt starts with the whole of the previous one and its answer.
Passages inside one prompt go in a canonical order (source, then position
in the source), so overlapping retrievals share longer prefixes.

Does not: apply a chat template (the backend does, with the model's own)
or decide which passages or turns go in (see ``budgeter`` and ``history``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from engine.backend import Message

# Byte-stable on purpose: no dates, counts or settings in it.
SYSTEM_PROMPT = (
    "You are rag-budget, an assistant that answers questions from the user's documents. "
    "Answer using only the numbered context passages in the user's message, and cite them "
    "by number, like [1]. If the passages do not contain the answer, say that you do not know. "
    "Answer in the language of the question."
)


@dataclass(frozen=True)
class ContextPassage:
    """A retrieved passage as it is shown to the model."""

    source: str
    text: str
    page: int | None = None
    collection: str | None = None  # a named collection's, shown with it; None: the default one's


def passage_body(passage: ContextPassage) -> str:
    """A passage as it is shown, less its number: the same in every prompt
    it appears in, whatever its number there, so an engine can keep its KV
    (see ``engine.llama_cpp.passage_kv``). A named collection's passage
    names its collection, so the same text in two collections is two
    passages, whose KV is kept apart: one collection's prompt never reuses,
    nor by its speed tells of, another's.

    ``passage_body(ContextPassage("a.md", "Hi")) -> " (a.md)\\nHi"``
    ``passage_body(ContextPassage("a.md", "Hi", collection="acme")) -> " (a.md; collection acme)\\nHi"``
    """
    where = passage.source if passage.page is None else f"{passage.source}, page {passage.page}"
    if passage.collection is not None:
        where += f"; collection {passage.collection}"
    return f" ({where})\n{passage.text.strip()}"


def format_passage(number: int, passage: ContextPassage) -> str:
    """One numbered passage with its source.

    ``format_passage(1, ContextPassage("a.md", "Hi")) -> "[1] (a.md)\\nHi"``
    """
    return f"[{number}]{passage_body(passage)}"


def passage_blocks(passages: Sequence[ContextPassage]) -> str:
    """The passages numbered from 1, one block each, blank lines between."""
    return "\n\n".join(format_passage(i, p) for i, p in enumerate(passages, start=1))


@dataclass(frozen=True)
class Quote:
    """A sentence of a passage chosen as evidence for the question, with
    the signature or heading it is about."""

    passage: int
    text: str
    about: str = ""


def quote_line(quote: Quote) -> str:
    """One quote on one line, its whitespace collapsed.

    ``quote_line(Quote(2, "Wraps  a\nfunction.", "lru_cache()")) -> '[2] lru_cache(): "Wraps a function."'``
    """
    about = " ".join(quote.about.split())
    text = " ".join(quote.text.split())
    return f"[{quote.passage}] {about + ': ' if about else ''}\"{text}\""


EVIDENCE_HEADING = "Most relevant:"


def evidence_block(evidence: Sequence[Quote]) -> str:
    """The evidence as the user turn quotes it, under its heading ("" for none)."""
    if not evidence:
        return ""
    return f"{EVIDENCE_HEADING}\n" + "\n".join(quote_line(q) for q in evidence)


def user_message(question: str, passages: Sequence[ContextPassage], evidence: Sequence[Quote] = (),
                 collection: str | None = None) -> str:
    """The user turn: the numbered passages, the evidence quoted from them
    (after the passages, so it changes no cached prefix), then the question.
    Passages of a named ``collection`` are headed by its name, ahead of
    them: a prompt from one collection then shares no cached prefix, and so
    no passage KV held behind one, with a prompt from another (whose
    answer's speed would tell that the other holds the same text)."""
    head = "Context" if collection is None else f"Context (collection {collection})"
    if not passages:
        return f"{head}: (no passages found)\n\nQuestion: {question.strip()}"
    quoted = f"\n\n{evidence_block(evidence)}" if evidence else ""
    return f"{head}:\n\n{passage_blocks(passages)}{quoted}\n\nQuestion: {question.strip()}"


def answer_lead(evidence: Sequence[Quote]) -> str:
    """The start of the answer, written for the model, that quotes the
    evidence first (a small model then answers from it): empty without any."""
    if not evidence:
        return ""
    return "The passages say: " + " ".join(quote_line(q) for q in evidence) + "\n\n"


def answer_opening(evidence: Sequence[Quote]) -> str:
    """The start of the answer as its reader sees it: the evidence quoted,
    one quote a line with its passage number, then a blank line (the model
    goes on from there); empty without any.

    ``answer_opening([Quote(1, "The default is 5min.", "checkpoint_timeout")])``
    -> ``'[1] checkpoint_timeout: "The default is 5min."\n\n'``
    """
    if not evidence:
        return ""
    return "\n".join(quote_line(q) for q in evidence) + "\n\n"


@dataclass(frozen=True)
class PastTurn:
    """An earlier turn as it is shown again: the user message (as it was
    prompted, or the question alone) and the answer."""

    user: str
    answer: str


SUMMARY_HEADING = "Summary of the conversation so far:"


def system_message(summary: str | None = None, system: str = SYSTEM_PROMPT) -> Message:
    """The system message: the byte-stable system prompt, then the summary
    of older turns, if there is one."""
    if summary and summary.strip():
        return Message("system", f"{system}\n\n{SUMMARY_HEADING}\n{summary.strip()}")
    return Message("system", system)


def history_messages(turns: Sequence[PastTurn]) -> list[Message]:
    """The recent turns as user and assistant messages, oldest first."""
    messages: list[Message] = []
    for turn in turns:
        messages += [Message("user", turn.user), Message("assistant", turn.answer)]
    return messages


def build_messages(
    question: str,
    passages: Sequence[ContextPassage],
    *,
    summary: str | None = None,
    turns: Sequence[PastTurn] = (),
    system: str = SYSTEM_PROMPT,
    evidence: Sequence[Quote] = (),
    collection: str | None = None,
) -> list[Message]:
    """The chat messages of one request: the system prompt (with the
    conversation summary), the recent turns, then one user turn holding the
    passages (headed by their ``collection``'s name where it is named), the
    evidence quoted from them and the question."""
    return [
        system_message(summary, system),
        *history_messages(turns),
        Message("user", user_message(question, passages, evidence, collection)),
    ]


def canonical_order(places: Sequence[tuple[str, int]]) -> list[int]:
    """Indices of passages at ``places`` (source, position in the source)
    in the order they go into a prompt: by source, then position.

    ``canonical_order([("b.md", 0), ("a.md", 3), ("a.md", 1)]) -> [2, 1, 0]``
    """
    return sorted(range(len(places)), key=lambda i: (places[i][0], places[i][1]))

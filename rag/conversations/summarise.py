"""Folding old conversation turns into a short summary.

The model is asked first; if it fails, is interrupted, stops short of an
answer, or writes more than the summary budget, an extractive summary is
used instead: each folded question with the first sentence of its answer,
the newest kept when they do not all fit. Either way the result fits the
budget.

Does not: decide when to summarise or store anything.
"""

from __future__ import annotations

from typing import Callable, Sequence

from engine.backend import Backend, Message, Timings, scoped
from prompt_budget.trim import sentence_ends, trim_to_tokens

from .store import Turn

SUMMARY_SYSTEM = (
    "You write short summaries of conversations between a user and an assistant. "
    "Write plain sentences: what the user asked about and what the assistant answered. No lists, no preamble."
)


class Interrupted(Exception):
    """Summarising was stopped because a question is waiting for the engine."""


def extractive_summary(previous: str, turns: Sequence[Turn], max_tokens: int, count_tokens: Callable[[str], int]) -> str:
    """The previous summary and, per folded turn, its question and the
    first sentence of its answer, cut to ``max_tokens`` (older lines first
    to go)."""
    lines = [previous.strip()] if previous.strip() else []
    for turn in turns:
        answer = " ".join(turn.answer.split())
        first = answer[: sentence_ends(answer)[0]] if answer else "(no answer)"
        lines.append(f"Asked: {' '.join(turn.question.split())} Answered: {first}")
    while lines and count_tokens("\n".join(lines)) > max_tokens:
        if len(lines) == 1:
            return trim_to_tokens(lines[0], max_tokens, count_tokens)
        lines.pop(0)
    return "\n".join(lines)


def llm_summary(
    backend: Backend, previous: str, turns: Sequence[Turn], max_tokens: int,
    should_stop: Callable[[], bool] = lambda: False, cache_scope: str = "",
) -> tuple[str, Timings]:
    """The model's summary of ``previous`` and ``turns`` with its timings,
    written in the conversation's ``cache_scope`` (its cells are its
    holder's alone). Raises Interrupted when ``should_stop()`` turns true,
    ValueError when the reply is empty or does not finish within ``max_tokens``."""
    parts = [f"Summary so far: {previous.strip()}"] if previous.strip() else []
    for turn in turns:
        parts.append(f"User: {turn.question.strip()}\nAssistant: {turn.answer.strip()}")
    words = max(max_tokens * 2 // 3, 10)
    request = "\n\n".join(parts) + f"\n\nSummarise this conversation in at most {words} words."
    prompt = backend.render([Message("system", SUMMARY_SYSTEM), Message("user", request)])
    tokens = backend.tokenize(prompt)
    if len(tokens) + max_tokens + 1 > backend.n_ctx:
        raise ValueError("the turns to fold do not fit the context window")
    pieces: list[str] = []
    # In the conversation's own scope, as its prompts run.
    with backend.generate(tokens, max_tokens=max_tokens + 1, background=True, **scoped(cache_scope)) as generation:
        for piece in generation:
            pieces.append(piece)
            if should_stop():
                raise Interrupted()
        timings = generation.timings
    text = " ".join("".join(pieces).split())
    if timings.decode_tokens > max_tokens:
        raise ValueError(f"the summary ran past {max_tokens} tokens")
    if len(text.split()) < 3:
        raise ValueError("the summary is empty")
    return text, timings


def summarise(
    backend: Backend, previous: str, turns: Sequence[Turn], max_tokens: int,
    should_stop: Callable[[], bool] = lambda: False, cache_scope: str = "",
) -> tuple[str, str]:
    """A summary of ``previous`` and ``turns`` in at most ``max_tokens``,
    and how it was made: ``"llm"`` or ``"extractive"`` (the model's written
    in ``cache_scope``: see :func:`llm_summary`). Raises Interrupted when
    ``should_stop()`` turns true while the model writes."""
    try:
        text, _ = llm_summary(backend, previous, turns, max_tokens, should_stop, cache_scope)
        if len(backend.tokenize(text)) <= max_tokens:
            return text, "llm"
    except Interrupted:
        raise
    except Exception:  # noqa: BLE001 - any failure of the model falls back; the history must not be lost
        pass
    return extractive_summary(previous, turns, max_tokens, lambda t: len(backend.tokenize(t))), "extractive"

"""An answer as it is generated: iterate it for text, then read the answer.

Does not: generate (the pipeline does) or format (the CLI and the service do).
"""

from __future__ import annotations

from typing import Callable, Generator

from engine.backend import TextStream

from .answer import Answer, Evidence


class Early:
    """What an answer knows before its first text: the evidence, once its
    prompt is planned (None until then)."""

    evidence: tuple[Evidence, ...] | None = None


class AnswerStream(TextStream[Answer]):
    """Iterate for the answer's text pieces as they are generated; once
    exhausted, :attr:`answer` is the final :class:`Answer` with its sources,
    budget and timings. :meth:`close` stops the generation early and frees
    the engine; :meth:`cancel` does so from another thread without waiting
    for the next piece (a client that went away while the prompt is
    evaluated), and the thread iterating it then ends with a RagError.
    :attr:`evidence` is known before the first piece of text."""

    _what = "answer stream"

    def __init__(self, run: Generator[str, None, Answer], *, cancel: Callable[[], None] | None = None,
                 early: Early | None = None) -> None:
        super().__init__(run, cancel=cancel)
        self._early = early or Early()

    @property
    def evidence(self) -> tuple[Evidence, ...] | None:
        """The answer's evidence as soon as its prompt is planned, before
        the first token: the stream yields an empty piece at that moment, so
        a reader may show it first; None until then."""
        return self._early.evidence

    @property
    def answer(self) -> Answer:
        """The final answer; only once the stream is exhausted."""
        return self.final

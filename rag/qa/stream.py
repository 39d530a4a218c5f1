"""An answer as it is generated: iterate it for text, then read the answer.

Does not: generate (the pipeline does) or format (the CLI and the service do).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generator, Iterator, Union

from engine.backend import TextStream

from .answer import Answer, Evidence


class Early:
    """What an answer knows before its first text: the evidence, once its
    prompt is planned (None until then)."""

    evidence: tuple[Evidence, ...] | None = None


@dataclass(frozen=True)
class EvidenceFound:
    """The prompt is planned: what the answer rests on, known before its
    first token, so a reader may be shown it first."""

    evidence: tuple[Evidence, ...]


@dataclass(frozen=True)
class TextPiece:
    """A piece of the answer's text, as it is generated."""

    text: str


AnswerEvent = Union[EvidenceFound, TextPiece]


class AnswerStream(TextStream[Answer]):
    """Iterate for the answer's text pieces as they are generated; once
    exhausted, :attr:`answer` is the final :class:`Answer` with its sources,
    budget and timings. :meth:`close` stops the generation early and frees
    the engine; :meth:`cancel` does so from another thread without waiting
    for the next piece (a client that went away while the prompt is
    evaluated), and the thread iterating it then ends with a RagError.
    :attr:`evidence` is known before the first piece of text; :meth:`events`
    says when, as a typed event, beside each piece."""

    _what = "answer stream"

    def __init__(self, run: Generator[str, None, Answer], *, cancel: Callable[[], None] | None = None,
                 early: Early | None = None) -> None:
        super().__init__(run, cancel=cancel)
        self._early = early or Early()

    @property
    def evidence(self) -> tuple[Evidence, ...] | None:
        """The answer's evidence as soon as its prompt is planned, before
        the first token (:class:`EvidenceFound` in :meth:`events`); None
        until then."""
        return self._early.evidence

    def __next__(self) -> str:
        """The next piece of the answer's text (never an empty one)."""
        while True:
            piece = super().__next__()
            if piece:
                return piece

    def events(self) -> Iterator[AnswerEvent]:
        """The answer as it comes, typed: :class:`EvidenceFound` once its
        prompt is planned (where it has evidence), then a :class:`TextPiece`
        for each piece of text; :attr:`answer` once they are all read."""
        told = False
        while True:
            try:
                # The generator marks the moment the prompt is planned with an empty piece; it goes no further.
                piece = super().__next__()
            except StopIteration:
                return
            if not told and self.evidence is not None:
                told = True
                yield EvidenceFound(self.evidence)
            if piece:
                yield TextPiece(piece)

    @property
    def answer(self) -> Answer:
        """The final answer; only once the stream is exhausted."""
        return self.final

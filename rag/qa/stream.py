"""An answer as it is generated: iterate it for text, then read the answer.

Does not: generate (the pipeline does) or format (the CLI and the service do).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generator, Iterator, Union

from engine.backend import TextStream

from .answer import Answer, Evidence


@dataclass(frozen=True)
class EvidenceFound:
    """The prompt is planned: what the answer rests on, known before its
    first token, so a reader may be shown it first."""

    evidence: tuple[Evidence, ...]


@dataclass(frozen=True)
class TextPiece:
    """A piece of the answer's text, as it is generated."""

    text: str


@dataclass(frozen=True)
class AnswerDone:
    """The answer is complete: its text, sources, budget and timings (the
    stream's :attr:`AnswerStream.answer`)."""

    answer: Answer


AnswerEvent = Union[EvidenceFound, TextPiece, AnswerDone]


class AnswerStream(TextStream[Answer]):
    """Iterate for the answer's text pieces as they are generated; once
    exhausted, :attr:`answer` is the final :class:`Answer` with its sources,
    budget and timings. :meth:`close` stops the generation early and frees
    the engine; :meth:`cancel` does so from another thread without waiting
    for the next piece (a client that went away while the prompt is
    evaluated), and the thread iterating it then ends with a RagError.
    :meth:`events` gives the same answer as typed events: the evidence
    (:class:`EvidenceFound`, known before the first token), each piece
    of text (:class:`TextPiece`) and the final answer (:class:`AnswerDone`).

    Made from a generator of :data:`AnswerEvent` that returns the
    :class:`Answer` (the pipeline's, or the resident client's read from
    the server's events)."""

    _what = "answer stream"

    def __init__(self, run: Generator[AnswerEvent, None, Answer], *,
                 cancel: Callable[[], None] | None = None) -> None:
        super().__init__(run, cancel=cancel)  # type: ignore[arg-type]  # events, read by _event
        self._evidence: tuple[Evidence, ...] | None = None

    @property
    def evidence(self) -> tuple[Evidence, ...] | None:
        """The answer's evidence as soon as its prompt is planned, before
        the first token (:class:`EvidenceFound` in :meth:`events`); None
        until then."""
        return self._evidence

    def _event(self) -> AnswerEvent:
        event = super().__next__()
        if isinstance(event, EvidenceFound):
            self._evidence = event.evidence
        return event  # type: ignore[return-value]

    def __next__(self) -> str:
        """The next piece of the answer's text (never an empty one)."""
        while True:
            event = self._event()
            if isinstance(event, TextPiece) and event.text:
                return event.text

    def events(self) -> Iterator[AnswerEvent]:
        """The answer as it comes, typed: :class:`EvidenceFound` once its
        prompt is planned (where it has evidence), a :class:`TextPiece` for
        each piece of text, then :class:`AnswerDone` with the final answer
        (also :attr:`answer` from then on)."""
        while True:
            try:
                event = self._event()
            except StopIteration:
                yield AnswerDone(self.answer)
                return
            if not isinstance(event, TextPiece) or event.text:
                yield event

    @property
    def answer(self) -> Answer:
        """The final answer; only once the stream is exhausted."""
        return self.final

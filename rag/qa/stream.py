"""An answer as it is generated: iterate it for text, then read the answer.

Does not: generate (the pipeline does) or format (the CLI and the service do).
"""

from __future__ import annotations

from engine.backend import TextStream

from .answer import Answer


class AnswerStream(TextStream[Answer]):
    """Iterate for the answer's text pieces as they are generated; once
    exhausted, :attr:`answer` is the final :class:`Answer` with its sources,
    budget and timings. :meth:`close` stops the generation early and frees
    the engine; :meth:`cancel` does so from another thread without waiting
    for the next piece (a client that went away while the prompt is
    evaluated), and the thread iterating it then ends with a RagError."""

    _what = "answer stream"

    @property
    def answer(self) -> Answer:
        """The final answer; only once the stream is exhausted."""
        return self.final

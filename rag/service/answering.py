"""Running questions for the HTTP layer: the pipeline's answer stream on a
thread of its own (admitted and planned by the engine's own report of its
queue), read from the event loop piece by piece, and the metrics of each
answer.

Does not: speak any wire format (the routes do) or plan prompts.
"""

from __future__ import annotations

import asyncio
import threading
from typing import AsyncIterator, Awaitable, Callable, Mapping, TypeVar

from engine.remote.in_flight import InFlight

from ..errors import RagError
from ..qa.answer import Answer
from ..qa.options import AskOptions
from ..qa.pipeline import Pipeline
from ..qa.stream import AnswerEvent, AnswerStream, TextPiece
from .metrics import Metrics
from .settings import ServiceSettings


T = TypeVar("T")


class ClientGone(Exception):
    """The client went away before what it waited for came; its generation was stopped."""


class ThreadedAnswer:
    """An :class:`AnswerStream` run on its own thread and read from the event
    loop: ``async for event in it`` (its :meth:`AnswerStream.events`), then
    :attr:`answer`.

    :meth:`aclose` (a client that went away) cancels the stream at once,
    even before its first piece: the engine drops the request at its next
    step, and the thread ends and closes the stream. ``finished(answer or
    None)`` runs on that thread at the end.
    """

    def __init__(self, stream: AnswerStream, finished: Callable[[Answer | None], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._inbox: asyncio.Queue = asyncio.Queue()
        self._stop = threading.Event()
        self._answer: Answer | None = None
        self._over = False
        self._stream, self._finished = stream, finished
        threading.Thread(target=self._produce, name="rag-request", daemon=True).start()

    def _hand_over(self, kind: str, value: object) -> None:
        try:
            self._loop.call_soon_threadsafe(self._inbox.put_nowait, (kind, value))
        except RuntimeError:
            pass  # the event loop is gone (shutdown): nobody to tell

    def _produce(self) -> None:
        answer = None
        try:
            for event in self._stream.events():
                self._hand_over("event", event)
                if self._stop.is_set():
                    break
            else:
                answer = self._stream.answer
                self._hand_over("answer", answer)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the consumer's side
            self._hand_over("error", exc)
        finally:
            self._stream.close()  # on this thread: a generator is closed where it runs
            self._finished(answer)

    def __aiter__(self) -> "ThreadedAnswer":
        return self

    async def __anext__(self) -> AnswerEvent:
        if self._over:
            raise StopAsyncIteration
        kind, value = await self._inbox.get()
        if kind == "event":
            return value
        self._over = True
        if kind == "error":
            raise value
        self._answer = value
        raise StopAsyncIteration

    @property
    def evidence(self):
        """The answer's evidence once its prompt is planned (None before)."""
        return self._stream.evidence

    @property
    def answer(self) -> Answer:
        """The final answer, once the pieces are all read."""
        if self._answer is None:
            raise RuntimeError("the answer is not finished")
        return self._answer

    async def result(self) -> Answer:
        """Read the stream to its end; the final answer."""
        async for _ in self:
            pass
        return self.answer

    async def result_unless(self, gone: Callable[[], Awaitable[bool]], every_s: float = 0.25) -> Answer | None:
        """The final answer, or None (and the generation stopped) as soon as
        ``gone()`` says the client went away."""
        try:
            return await self.unless_gone(self.result(), gone, every_s)
        except ClientGone:
            return None

    async def first_unless(self, gone: Callable[[], Awaitable[bool]], every_s: float = 0.25) -> AnswerEvent:
        """The first event (StopAsyncIteration for an answer with none), or
        ClientGone (and the generation stopped) as soon as ``gone()`` says the
        client went away: while the prompt is evaluated nothing is written,
        so nothing else would notice."""
        return await self.unless_gone(self.__anext__(), gone, every_s)

    async def text_unless(self, gone: Callable[[], Awaitable[bool]], every_s: float = 0.25) -> str | None:
        """The next piece of text (None when the answer ends with none), or
        ClientGone as :meth:`first_unless`: once the evidence is sent, the
        wait for the first token still stops for a client that left."""
        while True:
            try:
                event = await self.first_unless(gone, every_s)
            except StopAsyncIteration:
                return None
            if isinstance(event, TextPiece):
                return event.text

    async def texts(self, first: AnswerEvent | None, gone: Callable[[], Awaitable[bool]],
                    every_s: float = 0.25) -> AsyncIterator[str]:
        """The answer's pieces of text, from ``first`` (the event already
        read; None for an answer with none): the wait for the first piece
        stops for a client that left (:meth:`text_unless`), the rest are
        read as they come."""
        text = first.text if isinstance(first, TextPiece) else None
        if first is not None and text is None:
            text = await self.text_unless(gone, every_s)
        if text is None:
            return
        yield text
        async for event in self:
            if isinstance(event, TextPiece):
                yield event.text

    async def unless_gone(self, work: Awaitable[T], gone: Callable[[], Awaitable[bool]], every_s: float = 0.25) -> T:
        """What ``work`` (reading this answer) gives, or ClientGone, with the
        generation stopped, as soon as ``gone()`` says the client went away
        (asked every ``every_s`` seconds)."""
        task = asyncio.ensure_future(work)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=every_s)
                if done:
                    return task.result()
                if await gone():
                    await self.aclose()
                    raise ClientGone()
        finally:
            if not task.done():
                task.cancel()

    async def aclose(self) -> None:
        """Stop generating now: the stream is cancelled (the engine drops the
        request at its next step) and its thread stops reading it. Nothing
        is waited for; after the answer has ended it does nothing."""
        self._stop.set()
        self._stream.cancel()


class Answering:
    """Questions to answers for the routes: each request is admitted and
    planned by the one decision the pipeline takes from the engine's own
    report of its queue (``engine.backend.LoadAware``: fewer passages under
    load, Overloaded only when the question alone cannot meet its target
    behind it), run on its own thread, and counted in the metrics."""

    def __init__(self, pipeline: Pipeline, settings: ServiceSettings, metrics: Metrics) -> None:
        self.pipeline, self.settings, self.metrics = pipeline, settings, metrics
        # Requests started here and not finished, and how long one has lately taken from its arrival: the
        # queue's depth in /metrics and /healthz, and the Retry-After of a caller over its questions in flight.
        self.in_progress = InFlight()

    @property
    def depth(self) -> int:
        """Requests started here and not yet finished."""
        return self.in_progress.count

    @property
    def service_s(self) -> float:
        """Seconds an answer has lately taken, from its arrival (a moving average)."""
        return self.in_progress.service_s

    def start(self, endpoint: str, question: str, asked: Mapping[str, object]) -> ThreadedAnswer:
        """The answer to ``question`` with the :class:`AskOptions` fields
        ``asked`` (those left out: the service's defaults), started; a
        RagError for bad options or more answer tokens than this server
        allows, and Overloaded (while it is read) for a question the
        engine's load keeps from its target even without passages, where
        the service refuses those (``reject_over_target``)."""
        options = AskOptions.of(**asked)
        limit = self.settings.max_tokens_limit
        if options.max_tokens > limit:
            raise RagError(f"max_tokens {options.max_tokens} is over this server's limit of {limit}")
        stream = self.pipeline.stream(question, options, refuse_late=self.settings.reject_over_target)
        self.in_progress.enter()
        self.metrics.queue_depth.set(self.depth)

        def finished(answer: Answer | None) -> None:
            self.in_progress.leave(answer.timings.total_s if answer is not None else None)
            self.metrics.queue_depth.set(self.depth)
            if answer is not None:
                self.metrics.observe(answer)
                self.metrics.requests.labels(endpoint, "ok").inc()

        return ThreadedAnswer(stream, finished)

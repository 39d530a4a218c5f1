"""The seam between rag-budget and an inference engine.

A backend turns chat messages into a prompt with the model's own template,
counts tokens with the model's own tokenizer, and streams a completion while
measuring it. Everything above this seam (the budgeter, the pipeline, the
interfaces) talks only to :class:`Backend`; a second engine is a new module
that implements it. An engine that keeps KV state between requests may also
offer :class:`PrefixCache`, an optional capability the pipeline uses when
it is there.

A completion is a :class:`Generation`: iterate it for text, then read its
:class:`Timings`. Engines write it as a generator that yields text and
returns the timings, so nothing downstream sorts a mixed stream by type.

Every request names a cache scope (``cache_scope``, a string; "": the local
user's, what a caller that names none gets). What a cache can tell of a
prompt is a secret of whoever asked it: a prompt found cached is evaluated
faster, and says so in ``cached_tokens``, so a caller who could start from
another's cells could read that other's question word by word, guessing on.
So an engine that keeps KV between requests lets a prompt of one scope start
from what prompts of another left (an idle sequence's prompt, a session's
snapshot, a passage's exact segment) only as far as the shared system
prompt, which every prompt holds anyway; from its own scope's, as far as
they share tokens. :meth:`PrefixCache.cached_prefix` and
:meth:`ExactPassages.held_prefix` predict the same, for the scope named.
A remote engine carries the scope where its server can (vLLM's
``cache_salt``); see the engine README for one that cannot.

Does not: choose what goes into the prompt, retrieve, or keep conversations.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, replace
from typing import (TYPE_CHECKING, Callable, Generator, Generic, Iterator, Literal, Protocol, Sequence, TypeVar,
                    runtime_checkable)

from .errors import ContextOverflow, GenerationFailed

if TYPE_CHECKING:
    from .scheduler import Ahead, Cost, Load

Role = Literal["system", "user", "assistant"]

# The collection passages are of where the caller names none (``PassageKV``): an
# engine keys every passage it keeps by its collection, this one too. Spelled as
# rag names its default collection, so naming that one or none is the same.
DEFAULT_COLLECTION = "default"


def scoped(cache_scope: str) -> dict[str, str]:
    """The keyword that names a request's cache scope to an engine's cache
    calls (``generate``, ``prefill``, ``cached_prefix``, ``held_prefix``,
    ``held_passages``): ``cache_scope=`` for a holder's; none for the local
    user's (""), which is what the keyword means when it is left out, so an
    engine written before scopes still serves the local user, and a
    holder's request fails loudly there instead of sharing its cache.

    ``scoped("ab12.cd34") -> {"cache_scope": "ab12.cd34"}``; ``scoped("") -> {}``
    """
    return {"cache_scope": cache_scope} if cache_scope else {}


@dataclass(frozen=True)
class Message:
    """One chat message, before the model's template is applied."""

    role: Role
    content: str


@dataclass(frozen=True)
class Timings:
    """What the engine measured for one request.

    Invariant: ``cached_tokens + prefill_tokens == prompt_tokens``; tokens
    of stored passages spliced into the prompt count as cached (they were
    not evaluated for this prompt) and are also counted in ``spliced_tokens``.
    ``prefill_s`` and ``decode_s`` are the engine's own counters; ``ttft_s``
    and ``total_s`` are wall-clock seconds from the start of the request.
    """

    prompt_tokens: int
    cached_tokens: int
    prefill_tokens: int
    ttft_s: float
    prefill_s: float
    decode_tokens: int
    decode_s: float
    total_s: float
    restored_tokens: int = 0  # of cached_tokens, those read back from a saved snapshot
    restore_s: float = 0.0  # spent reading that snapshot back (inside ttft_s)
    snapshot_s: float = 0.0  # spent saving the state after the answer (after total_s)
    queue_s: float = 0.0  # spent waiting for the engine behind other requests (inside ttft_s)
    spliced_tokens: int = 0  # of cached_tokens, those of stored passages placed into the prompt
    spliced_passages: int = 0  # the stored passages they came from (each splits the prompt's evaluation)
    splice_s: float = 0.0  # spent loading and placing them (inside ttft_s)
    shared_prefill: bool = False  # its prompt was evaluated beside other requests' tokens: not a plain prefill
    others_cells: int = 0  # KV cells other sequences held as its prompt began: each of its tokens passed over them

    def to_dict(self) -> dict[str, int | float]:
        """The ``timings`` object of the ``rag ask --json`` contract."""
        return asdict(self)

    def shifted(self, seconds: float) -> "Timings":
        """These timings with ``seconds`` of work before the engine call added
        to the wall-clock figures (``ttft_s`` and ``total_s``)."""
        return replace(self, ttft_s=self.ttft_s + seconds, total_s=self.total_s + seconds)


T = TypeVar("T")


class Cancel:
    """A stop asked from any thread, for work running on another whose
    parts start later: each part hands over how it is stopped
    (:meth:`on_cancel`), and is stopped at once if the stop came first.
    Calling it asks the stop; asking twice is asking once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asked = False
        self._stops: list[Callable[[], None]] = []

    def on_cancel(self, stop: Callable[[], None]) -> None:
        """Call ``stop`` when the stop is asked (now, if it already was)."""
        with self._lock:
            if not self._asked:
                self._stops.append(stop)
                return
        stop()

    def __call__(self) -> None:
        """Ask the stop: every part handed over so far is stopped, on this thread."""
        with self._lock:
            self._asked = True
            stops, self._stops = self._stops, []
        for stop in stops:
            stop()


class TextStream(Generic[T]):
    """Text arriving piece by piece, then one final value: iterate it for
    the pieces; once it is exhausted, :attr:`final` holds the value.
    :meth:`close` (or leaving a ``with`` block) stops it early, from the
    thread that iterates it; :meth:`cancel` stops it from any other.

    Made from a generator that yields text and *returns* the final value,
    so no consumer sorts a mixed stream by type.
    """

    _what = "stream"

    def __init__(self, run: Generator[str, None, T], *, cancel: Callable[[], None] | None = None) -> None:
        self._run = run
        self._final: T | None = None
        self._done = False
        self._cancel = cancel  # stops the work behind the stream from another thread, without waiting

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        if self._done:
            raise StopIteration
        try:
            return next(self._run)
        except StopIteration as done:
            self._final, self._done = done.value, True
            raise StopIteration from None

    @property
    def done(self) -> bool:
        """Whether the stream ran to its end."""
        return self._done

    @property
    def final(self) -> T:
        """The value the stream ended with; only once it is exhausted."""
        if not self._done:
            raise RuntimeError(f"the {self._what} has not finished: iterate it to the end first")
        return self._final  # type: ignore[return-value]

    def result(self) -> tuple[str, T]:
        """Run the stream to its end: its whole text and its final value."""
        text = "".join(self)
        return text, self.final

    def close(self) -> None:
        """Stop now; whatever the stream held is released."""
        self._run.close()

    def cancel(self) -> None:
        """Stop it from any thread, without waiting: the engine drops the
        request behind it before its next step (the step in flight, one
        native call, is not interrupted), and the thread iterating it ends
        with an error (that thread still closes it). A stream with no way to
        be stopped from outside (a remote engine's) goes on until that
        thread closes it."""
        if self._cancel is not None:
            self._cancel()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Generation(TextStream[Timings]):
    """A completion in progress: iterate it for text pieces as they are
    decoded; once it is exhausted, :attr:`timings` holds what the engine
    measured. Closing it early, or cancelling it from another thread,
    frees the engine for others.
    """

    _what = "generation"

    def __init__(self, run: Generator[str, None, Timings], *, engine: str = "engine",
                 release: Callable[[], None] | None = None, cancel: Callable[[], None] | None = None) -> None:
        super().__init__(run, cancel=cancel)
        self._engine = engine
        self._release = release  # frees what the engine holds for a generation closed before it started
        # When the caller asked: the engine's clock starts here too, so the
        # time spent before it (retrieval, planning) is added in one place.
        self.started = time.perf_counter()

    @property
    def timings(self) -> Timings:
        """What the engine measured; only once the generation is exhausted."""
        timings = self.final
        if not isinstance(timings, Timings):
            raise GenerationFailed(f"{self._engine} ended a generation without reporting its timings")
        return timings

    def close(self) -> None:
        """Stop now; the engine frees whatever it holds for this generation."""
        super().close()
        if self._release is not None:
            self._release()

    def timings_since(self, received: float) -> Timings:
        """The timings with their wall-clock figures counted from ``received``
        (a ``time.perf_counter()`` reading taken before the engine was asked)."""
        return self.timings.shifted(self.started - received)

    def result(self) -> tuple[str, Timings]:
        """Run the generation to its end: its whole text and its timings."""
        text = "".join(self)
        return text, self.timings


@runtime_checkable
class Backend(Protocol):
    """An inference engine that rag-budget can prompt and measure."""

    @property
    def name(self) -> str:
        """A short identifier of the engine and model, for reports."""
        ...

    @property
    def n_ctx(self) -> int:
        """The context window in tokens: prompt plus answer never exceed it."""
        ...

    def render(self, messages: Sequence[Message]) -> str:
        """The prompt text for ``messages`` under the model's chat template,
        ending where the assistant's answer begins."""
        ...

    def tokenize(self, text: str) -> list[int]:
        """The model's tokens for ``text`` as a whole prompt (special tokens
        in the text are parsed as such)."""
        ...

    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        session: str | None = None,
        deadline: float | None = None,
        background: bool = False,
        stop: Sequence[str] = (),
        cache_scope: str = "",
    ) -> Generation:
        """The completion of ``prompt`` (text, or tokens as :meth:`tokenize`
        gives them), streamed as a :class:`Generation`. It ends, with its
        timings, as soon as its text holds one of ``stop``: no token is
        decoded after that (whether the stop's own text is streamed is the
        engine's choice; a reader cuts it).

        An engine with a :class:`PrefixCache` does not evaluate again the
        longest prefix of the prompt it holds for ``cache_scope`` (beyond
        the shared system prompt, only what prompts of that scope left; see
        the module), and with a ``session`` key keeps the state after the
        answer for the session's next prompt, as that scope's. An
        engine that serves several requests at once may order them by
        ``deadline`` (a ``time.perf_counter()`` instant) and run
        ``background`` work only when nothing else waits; others ignore both.

        Raises :class:`~engine.errors.ContextOverflow` before any work if the
        prompt plus ``max_tokens`` exceed :attr:`n_ctx`; other failures are
        :class:`~engine.errors.EngineError` s, raised while iterating.
        """
        ...

    def profile_key(self) -> dict[str, object]:
        """What changes this engine's prefill rates (model file, build,
        offload, context, threads, batch): equal keys may share a profile."""
        ...

    def describe(self) -> dict[str, object]:
        """Facts about the engine for ``rag doctor``: build, device, model
        path and size, context, threads."""
        ...

    def close(self) -> None:
        """Release the engine (its model, context or connections)."""
        ...


@runtime_checkable
class PrefixCache(Protocol):
    """An optional ability: an engine that keeps KV state between requests
    and lets the caller predict, fill and drop it."""

    def cached_prefix(self, tokens: Sequence[int], cache_scope: str = "") -> int:
        """How many leading ``tokens`` the engine would reuse from its KV
        cache or its saved snapshots, not evaluating them again, if they were
        prompted now by a request of ``cache_scope`` (see the module)."""
        ...

    def prefill(self, tokens: Sequence[int], *, session: str, pin: bool = False, cache_scope: str = "") -> Timings:
        """Evaluate ``tokens`` now (reusing any cached prefix) and keep the
        state under ``session``, so a later prompt of ``cache_scope`` that
        starts with them finds them cached; ``pin`` keeps it from eviction
        and makes it every scope's (the system prompt's state)."""
        ...

    def forget(self, session: str) -> None:
        """Drop the saved state of ``session``, if any."""
        ...

    def cache_stats(self) -> dict[str, object]:
        """What the engine's cache holds: entries and bytes, and its caps."""
        ...


@runtime_checkable
class LoadAware(Protocol):
    """An optional ability: an engine that serves several requests at once
    and reports what a new one meets behind them: the in-process engine
    from its scheduler's queue, a server from the requests this client has
    in flight there. The one report a question is admitted and planned by."""

    def ahead(self, deadline: float | None, cost: "Cost") -> "Ahead":
        """What a request due at ``deadline`` (a ``time.perf_counter()``
        instant; None: none) meets now, its prefill costed by ``cost``
        (seconds for ``n_new`` tokens on ``n_cached`` beside ``n_others``
        cells)."""
        ...


@runtime_checkable
class Scheduled(Protocol):
    """An optional ability: an engine whose own loop orders the requests it
    serves by deadline and runs background work only when nothing else
    waits (the in-process one); its :class:`~engine.scheduler.Load` is the
    queue as the loop holds it."""

    def load(self) -> "Load":
        """The :class:`~engine.scheduler.Load` a new request meets now."""
        ...


class TakesPassages(Protocol):
    """What a passage engine (:class:`PassageKV`, :class:`ExactPassages`)
    adds to :meth:`Backend.generate`: ``passages``, the texts of the
    retrieved passages inside the prompt as
    :func:`prompt_budget.layout.passage_body` writes them, and
    ``collection``, the collection they are of. Only an engine with one of
    those abilities is given them (``rag.qa.passages.takes_passages``)."""

    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        session: str | None = None,
        deadline: float | None = None,
        background: bool = False,
        stop: Sequence[str] = (),
        passages: Sequence[str] = (),
        collection: str = DEFAULT_COLLECTION,
        cache_scope: str = "",
    ) -> Generation:
        """:meth:`Backend.generate`, the prompt's ``passages`` of ``collection`` known."""
        ...


@runtime_checkable
class Replicated(Protocol):
    """An optional ability: an engine behind one address that serves
    several requests at once (a server's slots, over every worker behind a
    router) and says how many."""

    @property
    def parallel(self) -> int:
        """Requests it serves at once."""
        ...

    def router_facts(self) -> dict[str, object]:
        """The router and its workers where there is one, else ``{}``."""
        ...


@runtime_checkable
class StepCounters(Protocol):
    """An optional ability: an engine that counts what its steps ran
    (sequences, cells, tokens prefilled and decoded, requests waiting)."""

    def engine_stats(self) -> dict[str, object]:
        """Its counters now."""
        ...


@runtime_checkable
class PassageKV(TakesPassages, Protocol):
    """An optional ability: an engine that keeps the KV of passages it has
    evaluated and splices it into later prompts holding them (its
    ``generate`` takes ``passages=`` and ``collection=``: :class:`TakesPassages`).
    ``splice_fresh``: tokens at a spliced passage's head that are evaluated
    again; None when splicing is off.

    What it keeps is keyed by the passages' ``collection`` as well as their
    tokens (:data:`DEFAULT_COLLECTION` when none is named): a passage of one
    collection is never served to, nor counted as stored for, a prompt of
    another, even where the two passages' texts are the same. It is the same
    for every cache scope: a stored passage was evaluated behind the system
    prompt alone, so it holds no one's question, only a passage its
    collection's readers may read."""

    splice_fresh: int | None

    def stored_passages(self, texts: Sequence[str], *, collection: str = DEFAULT_COLLECTION) -> list[int]:
        """For each passage of ``collection``, the prompt tokens a prompt
        holding it would take from the store instead of evaluating (0: not stored)."""
        ...

    def keep_passages(self, texts: Sequence[str], *, collection: str = DEFAULT_COLLECTION) -> int:
        """Evaluate and keep these passages of ``collection`` when the engine
        is otherwise idle; how many were queued."""
        ...

    def precompute_passages(self, texts: Sequence[str], progress=None, *,
                            collection: str = DEFAULT_COLLECTION) -> dict[str, int]:
        """Evaluate and keep these passages of ``collection`` now; what it
        computed and the bytes stored."""
        ...


@runtime_checkable
class ExactPassages(TakesPassages, Protocol):
    """An optional ability: an engine that keeps the exact KV of the
    passages of prompts it answered, cut at passage boundaries, and reuses
    it in a later prompt of the same collection and cache scope that begins
    with the same tokens up to a passage's end (its ``generate`` takes
    ``passages=`` and ``collection=``: :class:`TakesPassages`).
    ``exact_passages``: whether it does now."""

    exact_passages: bool

    def held_passages(self, texts: Sequence[str], *, collection: str = DEFAULT_COLLECTION,
                      cache_scope: str = "") -> list[bool]:
        """For each passage of ``collection``: whether the engine may hold it
        for ``cache_scope`` (a hint)."""
        ...

    def held_prefix(self, tokens: Sequence[int], texts: Sequence[str], *,
                    collection: str = DEFAULT_COLLECTION, cache_scope: str = "") -> tuple[int, int]:
        """Leading prompt tokens that will not be evaluated for a prompt of
        ``cache_scope`` (cached, then held passages of ``collection``
        following on), and how many of ``texts`` lie inside."""
        ...


def check_fits(n_prompt: int, max_tokens: int, n_ctx: int) -> None:
    """Raise ContextOverflow if ``n_prompt`` prompt tokens plus ``max_tokens``
    answer tokens exceed a context window of ``n_ctx``."""
    if n_prompt + max_tokens > n_ctx:
        raise ContextOverflow(
            f"prompt of {n_prompt} tokens + {max_tokens} answer tokens exceeds the context window of {n_ctx}"
        )

"""A request to the engine's loop, and its state while it holds a sequence.

Does not: schedule or evaluate anything (``loop`` does).
"""

from __future__ import annotations

import codecs
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..backend import DEFAULT_COLLECTION, Timings
from ..errors import EngineError
from .native import Sampler
from .passage_kv import Splice
from ..scheduler import Work


@dataclass
class Trace:
    """What a measurement asks a request to record (``rag bench splice``):
    each answer token (an end token included) and the model's raw logits
    at each answer position (before any penalty). With ``forced``, those
    tokens are the answer instead of the sampled ones (teacher forcing), so
    two prompts' next-token distributions can be compared on one answer."""

    forced: tuple[int, ...] = ()
    tokens: list[int] = field(default_factory=list)
    logits: list[np.ndarray] = field(default_factory=list)

    def take(self, sampled: int, logits: np.ndarray) -> int:
        """Record the position whose ``logits`` gave ``sampled``; the token the answer goes on with."""
        token = self.forced[len(self.tokens)] if len(self.tokens) < len(self.forced) else sampled
        self.tokens.append(token)
        self.logits.append(logits)
        return token


@dataclass
class Request:
    """What was asked of the engine, and where its results go: events
    ``("piece", text)``, then ``("done", Timings)`` or ``("error", EngineError)``.
    ``max_tokens`` 0 is a prefill: the prompt evaluated and kept (as the
    shared system prefix with ``pin``, or as the snapshot ``session``)."""

    key: int
    tokens: list[int]
    max_tokens: int
    session: str | None = None  # keep the state after it under this snapshot key
    pin: bool = False
    deadline: float = math.inf
    background: bool = False
    spans: tuple[tuple[int, int], ...] = ()  # where retrieved passages lie in ``tokens`` (they may be spliced)
    collection: str = DEFAULT_COLLECTION  # the collection those passages are of: part of their keys in the store
    # Whose cached cells it may start from beyond the system prompt, and whose it leaves (``engine.backend``).
    cache_scope: str = ""
    stored: int = 0  # of ``tokens``, those its stored passages will supply (not evaluated)
    pieces: int = 0  # those stored passages: each ends an evaluation step
    store: str | None = None  # a passage behind the system prompt, to evaluate and keep under this key
    idle: bool = False  # warming the passage store: runs only while nothing else needs the engine
    trace: Trace | None = None  # record answer tokens and logits (measurements only)
    stops: tuple[str, ...] = ()  # texts that end the answer as soon as it holds one (no step after)
    started: float = field(default_factory=time.perf_counter)
    events: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)

    @property
    def prefill_only(self) -> bool:
        return self.max_tokens == 0

    def work(self) -> Work:
        """As the scheduler sees it while it waits for a sequence (stored passages are not evaluated)."""
        return Work(self.key, self.deadline, self.started, len(self.tokens) - self.stored, self.max_tokens, False,
                    self.background, self.pieces)

    def fail(self, error: EngineError) -> None:
        """End it with ``error`` before it held a sequence."""
        self.events.put(("error", error))
        self.released.set()


@dataclass
class Active:
    """A request holding sequence ``seq``: ``reserved`` cells it may take,
    the next prompt token to evaluate, the positions its sequence holds,
    and what it found cached (and restored from a snapshot)."""

    req: Request
    seq: int
    reserved: int
    next: int
    n_past: int
    cached: int
    restored: int = 0
    restore_s: float = 0.0
    sampler: Sampler | None = None
    generated: list[int] = field(default_factory=list)
    pending: int | None = None  # sampled, not yet evaluated
    decoder: codecs.IncrementalDecoder = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))
    prefill_s: float = 0.0
    shared_prefill: bool = False  # some of its prompt was evaluated in a step beside other requests' tokens
    decode_s: float = 0.0
    first_token_at: float | None = None
    splices: list[Splice] = field(default_factory=list)  # stored passages still ahead in the prompt
    spliced: int = 0
    spliced_passages: int = 0
    splice_s: float = 0.0
    others: int | None = None  # cells other sequences held when its prompt began to be evaluated
    said: str = ""  # the answer's last characters, as far as a stop sequence may reach back

    def says_stop(self, piece: str) -> bool:
        """Whether the answer, with its next ``piece`` of text, now holds one
        of its request's stop sequences (then nothing more is decoded)."""
        stops = self.req.stops
        if not stops or not piece:
            return False
        text = self.said + piece
        if any(stop in text for stop in stops):
            return True
        reach = max(map(len, stops)) - 1  # what a stop may hold of the text before the next piece
        self.said = text[-reach:] if reach else ""
        return False

    def work(self) -> Work:
        """As the scheduler sees it: the prompt tokens it still evaluates (spliced ones are not)."""
        ahead = len(self.req.tokens) - self.next - sum(sp.spliced for sp in self.splices)
        return Work(self.req.key, self.req.deadline, self.req.started, ahead,
                    self.req.max_tokens - len(self.generated), self.pending is not None, self.req.background,
                    len(self.splices), self.n_past)

    def until_splice(self) -> int | None:
        """Prompt tokens to evaluate before the next stored passage goes in (None: none ahead)."""
        return self.splices[0].point - self.next if self.splices else None


def timings_of(a: Active, snapshot_s: float) -> Timings:
    """What ``a`` took: its own prefill and decode seconds (its share of the
    steps it was in), the passages spliced in and the time that took, and
    everything else before its first token as waiting."""
    req, end = a.req, time.perf_counter()
    first = a.first_token_at if a.first_token_at is not None else end
    ttft = first - req.started
    cached = a.cached + a.spliced  # spliced tokens were not evaluated: they count as cached
    return Timings(
        prompt_tokens=len(req.tokens), cached_tokens=cached, prefill_tokens=len(req.tokens) - cached,
        ttft_s=ttft, prefill_s=a.prefill_s, decode_tokens=len(a.generated), decode_s=a.decode_s,
        total_s=end - req.started - snapshot_s, restored_tokens=a.restored, restore_s=a.restore_s,
        snapshot_s=snapshot_s, queue_s=max(ttft - a.prefill_s - a.restore_s - a.splice_s, 0.0),
        shared_prefill=a.shared_prefill, others_cells=a.others or 0,
        spliced_tokens=a.spliced, spliced_passages=a.spliced_passages, splice_s=a.splice_s,
    )


def share_step(owners: Sequence[tuple[Active, bool]], seconds: float) -> float:
    """Share a step's ``seconds`` among its tokens, one ``(request, is a
    prompt token)`` each, as prefill or decode time; returns ``seconds``."""
    share = seconds / len(owners)
    shared = len({id(a) for a, _ in owners}) > 1
    for a, prompt in owners:
        if prompt:
            a.prefill_s += share
            a.shared_prefill = a.shared_prefill or shared
        else:
            a.decode_s += share
    return seconds

"""The KV of retrieved passages, computed once and kept, so that a prompt
holding a passage seen before loads it instead of prefilling it again.

A passage's KV is computed at one canonical place: right behind the system
prompt (its first token at position ``len(system)``), attending to nothing
else. It is kept under a key made of the engine's set-up (model, build,
context, KV type: states are only meaningful to the set-up that wrote
them), the collection the passage is of, the system prompt's tokens and the
passage's exact tokens, so a passage whose text changed (a re-ingest) has
another key and is never served from its old KV. Entries live in a
byte-bounded LRU in RAM and on disk (the snapshot files of ``snapshots``,
checksummed; a damaged one is dropped and computed again, never loaded).

Splicing a stored passage into a prompt is not a full prefill: its cells
never attended to what precedes them in that prompt. The first ``fresh``
tokens of each spliced passage (and everything after the passages) are
therefore evaluated over the spliced cells, which restores attention across
the passage boundary (as EPIC does); ``rag bench splice`` measures what is
left of the difference.

Exact reuse (the default) keeps no canonical copies: a prompt's passages cut
it into segments, each from the end of the passage before (or of the system
prompt) to the end of its own passage, and a segment's cells are kept under
the tokens of the whole prompt up to its end, at their own positions. A
later prompt that begins with the same tokens up to a segment's end takes
that segment's cells as they are: every cell attended to exactly the tokens
it attends to there, so it is as exact as a prefix cache (up to the
summation order of the batch that computed it), a prefix cache cut at
passage boundaries, as RAGCache keeps its knowledge tree.

Every key holds the passages' collection (the default one's name too), so
one collection's prompt is never served from, nor by its cached or spliced
token counts told of, another collection's passages. The tokens alone do
not keep them apart: a named collection's passage names its collection in
its text, but the default collection's passages name none, so a default
passage can have exactly the tokens of a named one (a file named and
written to read as " (a.md; collection acme)" and its text). Exact
segments are keyed by the whole prompt up to their end, and two
collections' prompts differ today in the heading of their passages; the
collection is in their keys all the same, so that no key of the store
rests on how a prompt is worded (a conversation's earlier turns may show
another collection's passages word for word, and the heading is
``prompt_budget.layout``'s to change).

Exact segments are keyed by the prompt's cache scope too (``engine.backend``:
a holder's, per collection; "" the local user's): a segment holds every
token before its passage's end, a conversation's earlier questions and
answers among them, so a prompt of another scope that began with the same
tokens and found it held would learn, from its speed and ``cached_tokens``,
that someone asked them. The empty scope is key material too, so no segment
kept before keys named a scope is found again (they leave the store as the
LRU needs room). Lossy passages stay keyed by collection alone: each is
computed behind the system prompt only, so it holds no question, no
conversation and nothing but a passage of its collection, which every
holder of that collection may read anyway; which passages are stored tells
only what that collection's holders asked about lately.

Does not: evaluate, load or place anything (``loop`` does), or choose
which passages to keep (the caller asks for them).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..backend import DEFAULT_COLLECTION
from ..errors import EngineSettingsError
from .snapshots import Snapshot, SnapshotCache


@dataclass(frozen=True)
class Splice:
    """A stored passage inside a prompt: its tokens ``[start, end)``, its
    key, and how many tokens at its head are evaluated fresh."""

    start: int
    end: int
    key: str
    fresh: int
    origin: int | None = None  # where the stored cells begin; None: the canonical place behind the system prompt

    @property
    def point(self) -> int:
        """The prompt position where evaluation stops and the stored cells go in."""
        return min(self.start + self.fresh, self.end)

    @property
    def spliced(self) -> int:
        """Tokens taken from the store instead of being evaluated."""
        return self.end - self.point


def find_spans(prompt: Sequence[int], passages: Sequence[Sequence[int]], start: int = 0) -> list[tuple[int, int] | None]:
    """Where each of ``passages`` (token lists, in prompt order) lies in
    ``prompt``, searched from ``start`` and each after the one before; None
    for one whose tokens are not found exactly (its text was tokenized
    differently at its boundaries there, so it cannot be spliced).

    ``find_spans([9, 1, 2, 9, 3], [[1, 2], [3]]) -> [(1, 3), (4, 5)]``
    """
    hay = np.asarray(prompt, dtype=np.int64)
    spans: list[tuple[int, int] | None] = []
    at = start
    for tokens in passages:
        needle = np.asarray(tokens, dtype=np.int64)
        found = None
        if 0 < len(needle) <= len(hay) - at:
            # Candidate starts: where the first token matches; then compare the whole run.
            for i in np.flatnonzero(hay[at:len(hay) - len(needle) + 1] == needle[0]) + at:
                if np.array_equal(hay[i:i + len(needle)], needle):
                    found = (int(i), int(i) + len(needle))
                    break
        spans.append(found)
        if found is not None:
            at = found[1]
    return spans


def segments(prompt: Sequence[int], spans: Sequence[tuple[int, int]], origin: int) -> list[tuple[int, int]]:
    """The exact-reuse segments of ``prompt`` whose passages lie at
    ``spans`` (in order): each from the end of the one before (the first
    from ``origin``, the end of the system prompt) to the end of its
    passage; a passage that ends the prompt makes none (its last token is
    always evaluated, for the answer's first logits).

    ``segments(range(10), [(3, 5), (6, 8)], 2) -> [(2, 5), (5, 8)]``
    """
    found, at = [], origin
    for _, end in spans:
        if end >= len(prompt):
            break
        if end > at:
            found.append((at, end))
            at = end
    return found


def collection_part(collection: str) -> bytes:
    """``collection`` as key material: its length goes first, so that no
    name runs into the tokens after it.

    ``collection_part("acme") -> b"|collection 4:acme|"``
    """
    name = collection.encode("utf-8")
    return b"|collection %d:%s|" % (len(name), name)


def scope_part(scope: str) -> bytes:
    """A cache ``scope`` as key material, its length first as for
    :func:`collection_part` ("" too: a key made before scopes never matches).

    ``scope_part("ab12") -> b"|scope 4:ab12|"``
    """
    name = scope.encode("utf-8")
    return b"|scope %d:%s|" % (len(name), name)


def body_digest(tokens: Sequence[int], collection: str = DEFAULT_COLLECTION, scope: str = "") -> str:
    """A short name for a passage's tokens in ``collection``, held for cache
    ``scope`` (what the planner is told is held)."""
    digest = hashlib.sha256(collection_part(collection) + scope_part(scope))
    digest.update(np.asarray(tokens, dtype="<i4").tobytes())
    return digest.hexdigest()[:32]


class PassageStore:
    """Passage KV by key, in RAM and optionally on disk (a :class:`SnapshotCache`
    of its own); ``fresh`` is the number of tokens at the head of a spliced
    passage that are evaluated again (None: no lossy splicing); ``exact``
    keeps and reuses exact segments instead (ignored when ``fresh`` is set).
    Neither: the store is not used. Thread safe."""

    def __init__(self, identity: str, cache: SnapshotCache, *, fresh: int | None, exact: bool = False) -> None:
        self.identity, self.cache = identity, cache
        self.use(fresh=fresh, exact=exact)
        self.hits = self.misses = 0
        # Passages inside kept segments (this process's), most recently kept last: a hint for the
        # planner, checked exactly by the keys; at most one per entry the cache holds (a segment
        # ends with one passage), so the oldest go as segments leave the cache.
        self._bodies: OrderedDict[str, None] = OrderedDict()
        self._bodies_lock = threading.Lock()

    @classmethod
    def open(cls, identity: str, disk_dir: Path | None, ram_bytes: int, disk_bytes: int, *,
             fresh: int | None, exact: bool = False) -> "PassageStore":
        """A store of at most ``ram_bytes`` in RAM and, under ``disk_dir``,
        ``disk_bytes`` on disk; EngineSettingsError for a negative ``fresh``."""
        if fresh is not None and fresh < 0:
            raise EngineSettingsError(f"splice_fresh must be 0 or more tokens, not {fresh}")
        return cls(identity, SnapshotCache(ram_bytes, disk_dir, disk_bytes), fresh=fresh, exact=exact)

    def use(self, *, fresh: int | None, exact: bool) -> None:
        """Splice lossily with ``fresh`` tokens evaluated again, or (``fresh``
        None) reuse exact segments when ``exact``, or neither."""
        self.fresh, self.exact = fresh, exact and fresh is None

    @property
    def enabled(self) -> bool:
        """Whether prompts take passages' KV from the store (lossy or exact)."""
        return self.fresh is not None or self.exact

    def segment_keys(self, prompt: Sequence[int], bounds: Sequence[tuple[int, int]], *,
                     collection: str = DEFAULT_COLLECTION, scope: str = "") -> list[str]:
        """The key of each exact segment ``bounds`` of ``prompt``, a prompt
        of ``collection`` and cache ``scope``: the engine's set-up, the
        collection, the scope, every prompt token up to the segment's end,
        and where it starts."""
        digest = hashlib.sha256(self.identity.encode("utf-8") + b"|exact|" + collection_part(collection)
                                + scope_part(scope))
        hay = np.asarray(prompt, dtype="<i4")
        keys, at = [], 0
        for start, end in bounds:
            digest.update(hay[at:end].tobytes())
            at = end
            mine = digest.copy()
            mine.update(f"|{start}".encode())
            keys.append("segment:" + mine.hexdigest())
        return keys

    def exact_splices(self, prompt: Sequence[int], bounds: Sequence[tuple[int, int]], after: int, *,
                      collection: str = DEFAULT_COLLECTION, scope: str = "") -> list[Splice]:
        """The held segments of ``collection`` and cache ``scope`` among
        ``bounds`` of ``prompt`` that end after ``after`` (what precedes is
        cached already), in order; one whose head is cached is taken from
        where the cache ends."""
        found = []
        for (start, end), key in zip(bounds, self.segment_keys(prompt, bounds, collection=collection, scope=scope)):
            if end > after and self.holds(key):
                found.append(Splice(start, end, key, max(after - start, 0), origin=start))
        return found

    def held_chain(self, prompt: Sequence[int], bounds: Sequence[tuple[int, int]], after: int, *,
                   collection: str = DEFAULT_COLLECTION, scope: str = "") -> tuple[int, int]:
        """How far ``prompt``, a prompt of ``collection`` and cache
        ``scope``, is held when its first ``after`` tokens are cached: the
        end of the last of the held segments that follow on without a gap,
        and how many segments end inside that."""
        held, count = after, 0
        for (start, end), key in zip(bounds, self.segment_keys(prompt, bounds, collection=collection, scope=scope)):
            if end <= held:
                count += 1
            elif start <= held and self.holds(key):
                held, count = end, count + 1
            else:
                break
        return held, count

    def start_over(self, cache: SnapshotCache, held: OrderedDict[str, None] | None = None
                   ) -> tuple[SnapshotCache, OrderedDict[str, None]]:
        """Keep passages in ``cache`` from now on, ``held`` the hint of what
        it holds (None: nothing stored before is found); returns what the
        store held until now, to be put back the same way (measurements)."""
        with self._bodies_lock:
            before = self.cache, self._bodies
            self.cache, self._bodies = cache, held if held is not None else OrderedDict()
        return before

    def note_bodies(self, bodies: Sequence[Sequence[int]], *, collection: str = DEFAULT_COLLECTION,
                    scope: str = "") -> None:
        """Remember that these passages of ``collection`` lie inside segments
        kept for cache ``scope``; the hint keeps at most as many passages as
        the cache holds entries, the least recently kept going first."""
        limit = self.cache.entries()
        with self._bodies_lock:
            for body in bodies:
                digest = body_digest(body, collection, scope)
                self._bodies[digest] = None
                self._bodies.move_to_end(digest)
            while len(self._bodies) > limit:
                self._bodies.popitem(last=False)

    def may_hold(self, body: Sequence[int], *, collection: str = DEFAULT_COLLECTION, scope: str = "") -> bool:
        """Whether a segment of ``collection`` kept for cache ``scope`` may
        hold this passage (a hint: only the segment keys say whether a
        prompt's passages are held)."""
        return body_digest(body, collection, scope) in self._bodies

    def key(self, system: Sequence[int], tokens: Sequence[int], *, collection: str = DEFAULT_COLLECTION) -> str:
        """The key of a passage of ``collection`` of ``tokens`` computed behind ``system``."""
        digest = hashlib.sha256(self.identity.encode("utf-8"))
        digest.update(collection_part(collection))
        digest.update(np.asarray(system, dtype="<i4").tobytes())
        digest.update(b"|")
        digest.update(np.asarray(tokens, dtype="<i4").tobytes())
        return "passage:" + digest.hexdigest()

    def holds(self, key: str) -> bool:
        """Whether the store has ``key`` (in RAM or on disk), without reading it."""
        return self.cache.holds(key)

    def get(self, key: str) -> bytes | None:
        """The state bytes under ``key``, or None (counted as a hit or a miss)."""
        snap = self.cache.get(key)
        if snap is None:
            self.misses += 1
            return None
        self.hits += 1
        return snap.data

    def put(self, key: str, tokens: Sequence[int], data: bytes) -> None:
        """Keep the state ``data`` of a passage of ``tokens`` under ``key``."""
        self.cache.put(key, Snapshot(np.asarray(tokens, dtype=np.int32), data))

    def discard(self, key: str) -> None:
        """Forget ``key`` (a state llama.cpp refused, or a stale one)."""
        self.cache.discard(key)

    def stats(self) -> dict[str, object]:
        """Entries and bytes in RAM and on disk, hits and misses, and ``fresh``."""
        return {f"passage_{k}": v for k, v in self.cache.stats().items()} | {
            "passage_hits": self.hits, "passage_misses": self.misses, "splice_fresh_tokens": self.fresh,
            "exact_passages": self.exact}

    def splices(self, system: Sequence[int], prompt: Sequence[int], spans: Sequence[tuple[int, int]],
                after: int, *, collection: str = DEFAULT_COLLECTION, scope: str = "") -> list[Splice]:
        """The stored passages among ``spans`` of ``prompt``, a prompt of
        ``collection`` and cache ``scope``, that end after position
        ``after`` (what precedes is cached already), in order: passages of
        that collection stored behind the system prompt when splicing is
        lossy (whatever the scope: see the module), the exact segments held
        for that collection and scope when it is exact, nothing when the
        store is off. A passage whose head is cached already is spliced from
        where the cache ends; one that ends the prompt is not spliced."""
        if not system:
            return []
        if self.fresh is None:
            bounds = segments(prompt, spans, len(system))
            return self.exact_splices(prompt, bounds, after, collection=collection, scope=scope) if self.exact else []
        found = []
        for start, end in spans:
            # A cached prefix often runs into the first passage (the previous prompt began with
            # the same "[1] (source" tokens): those cells are exact, the rest comes from the store.
            fresh = max(self.fresh, after - start)
            if end - start <= fresh or end >= len(prompt):
                # A prompt's last token is always evaluated, for the logits of the answer's first token:
                # a passage it ends with is evaluated, or nothing would be left to schedule.
                continue
            key = self.key(system, prompt[start:end], collection=collection)
            if self.holds(key):
                found.append(Splice(start, end, key, fresh))
        return found

"""The KV of retrieved passages, computed once and kept, so that a prompt
holding a passage seen before loads it instead of prefilling it again.

A passage's KV is computed at one canonical place: right behind the system
prompt (its first token at position ``len(system)``), attending to nothing
else. It is kept under a key made of the engine's set-up (model, build,
context, KV type: states are only meaningful to the set-up that wrote
them), the system prompt's tokens and the passage's exact tokens, so a
passage whose text changed (a re-ingest) has another key and is never served
from its old KV. Entries live in a byte-bounded LRU in RAM and on disk (the
snapshot files of ``snapshots``, checksummed; a damaged one is dropped and
computed again, never loaded).

Splicing a stored passage into a prompt is not a full prefill: its cells
never attended to what precedes them in that prompt. The first ``fresh``
tokens of each spliced passage (and everything after the passages) are
therefore evaluated over the spliced cells, which restores attention across
the passage boundary (as EPIC does); ``rag bench splice`` measures what is
left of the difference.

Does not: evaluate, load or place anything (``loop`` does), or choose
which passages to keep (the caller asks for them).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

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


class PassageStore:
    """Passage KV by key, in RAM and optionally on disk (a :class:`SnapshotCache`
    of its own); ``fresh`` is the number of tokens at the head of a spliced
    passage that are evaluated again (None: splicing is off, the store is
    not used). Thread safe."""

    def __init__(self, identity: str, cache: SnapshotCache, *, fresh: int | None) -> None:
        self.identity, self.cache, self.fresh = identity, cache, fresh
        self.hits = self.misses = 0

    @classmethod
    def open(cls, identity: str, disk_dir: Path | None, ram_bytes: int, disk_bytes: int, *,
             fresh: int | None) -> "PassageStore":
        """A store of at most ``ram_bytes`` in RAM and, under ``disk_dir``,
        ``disk_bytes`` on disk; EngineSettingsError for a negative ``fresh``."""
        if fresh is not None and fresh < 0:
            raise EngineSettingsError(f"splice_fresh must be 0 or more tokens, not {fresh}")
        return cls(identity, SnapshotCache(ram_bytes, disk_dir, disk_bytes), fresh=fresh)

    @property
    def enabled(self) -> bool:
        """Whether prompts are spliced from the store."""
        return self.fresh is not None

    def key(self, system: Sequence[int], tokens: Sequence[int]) -> str:
        """The key of a passage of ``tokens`` computed behind ``system``."""
        digest = hashlib.sha256(self.identity.encode("utf-8"))
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
            "passage_hits": self.hits, "passage_misses": self.misses, "splice_fresh_tokens": self.fresh}

    def splices(self, system: Sequence[int], prompt: Sequence[int], spans: Sequence[tuple[int, int]],
                after: int) -> list[Splice]:
        """The stored passages among ``spans`` of ``prompt`` that end after
        position ``after`` (what precedes is cached already), in order;
        nothing when splicing is off. A passage whose head is cached already
        is spliced from where the cache ends; one that ends the prompt is
        not spliced."""
        if self.fresh is None or not system:
            return []
        found = []
        for start, end in spans:
            # A cached prefix often runs into the first passage (the previous prompt began with
            # the same "[1] (source" tokens): those cells are exact, the rest comes from the store.
            fresh = max(self.fresh, after - start)
            if end - start <= fresh or end >= len(prompt):
                # A prompt's last token is always evaluated, for the logits of the answer's first token:
                # a passage it ends with is evaluated, or nothing would be left to schedule.
                continue
            key = self.key(system, prompt[start:end])
            if self.holds(key):
                found.append(Splice(start, end, key, fresh))
        return found

"""The engine's stored passages as its callers see them: which passages a
prompt would take from the store (stored behind the system prompt, or held
exactly after the same tokens), and asking the loop to evaluate and keep
more (in idle time, or now for ``rag ingest --precompute-kv``). Each call
names the collection its passages are of, and looks up or keeps them under
that collection's keys only; what exact segments a prompt finds, under its
cache scope's too (``passage_kv``).

Does not: store bytes (``passage_kv``) or splice them (``splicing``).
"""

from __future__ import annotations

from typing import Callable, Sequence

from .loop import EngineLoop
from ..backend import DEFAULT_COLLECTION
from ..errors import EngineSettingsError
from .passage_kv import PassageStore, find_spans, segments
from .requests import Request


class PassageShelf:
    """Passage texts in, store keys and loop requests out."""

    def __init__(self, loop: EngineLoop, store: PassageStore, tokenize: Callable[[str], list[int]]) -> None:
        self.loop, self.store, self._tokenize = loop, store, tokenize

    def _keys(self, texts: Sequence[str], collection: str) -> list[tuple[str, list[int]]]:
        system = list(self.loop.system)
        tokens = [self._tokenize(t) for t in texts]
        return [(self.store.key(system, t, collection=collection), t) for t in tokens]

    def stored(self, texts: Sequence[str], collection: str = DEFAULT_COLLECTION) -> list[int]:
        """For each passage text of ``collection``, the prompt tokens a prompt
        holding it would splice instead of evaluate; 0 if not stored or
        splicing is off."""
        if not self.store.enabled or not self.loop.system:
            return [0] * len(texts)
        fresh = self.store.fresh or 0
        return [max(len(t) - fresh, 0) if self.store.holds(k) else 0 for k, t in self._keys(texts, collection)]

    def held(self, texts: Sequence[str], collection: str = DEFAULT_COLLECTION, scope: str = "") -> list[bool]:
        """For each passage text of ``collection``: whether an exact segment
        kept for cache ``scope`` may hold it (a hint)."""
        if not self.store.exact:
            return [False] * len(texts)
        return [self.store.may_hold(self._tokenize(t), collection=collection, scope=scope) for t in texts]

    def held_prefix(self, tokens: Sequence[int], texts: Sequence[str], cached: int,
                    collection: str = DEFAULT_COLLECTION, scope: str = "") -> tuple[int, int]:
        """How far a prompt of ``tokens`` holding the passages ``texts`` (in
        order) of ``collection``, of cache ``scope``, is held when its first
        ``cached`` tokens are cached: the end of the exact segments held for
        that collection and scope that follow on, and how many passages lie
        inside that."""
        if not self.store.exact or not texts or not self.loop.system:
            return cached, 0
        spans = [s for s in find_spans(tokens, [self._tokenize(t) for t in texts]) if s is not None]
        held, count = self.store.held_chain(tokens, segments(tokens, spans, len(self.loop.system)), cached,
                                            collection=collection, scope=scope)
        return min(held, len(tokens) - 1), count

    def keep(self, texts: Sequence[str], collection: str = DEFAULT_COLLECTION) -> int:
        """Queue these passages of ``collection`` to be evaluated and kept
        while the engine is otherwise idle; how many were queued (0 when
        splicing is off)."""
        if not self.store.enabled or not self.loop.system:
            return 0
        return self.loop.warm(self._keys(texts, collection))

    def precompute(self, texts: Sequence[str], progress=None, collection: str = DEFAULT_COLLECTION) -> dict[str, int]:
        """Evaluate and keep every passage of ``collection`` not stored yet,
        now, calling ``progress(done, total)`` after each; the passages
        computed, those already stored, and the bytes and entries the store
        holds."""
        if not self.loop.system:
            raise EngineSettingsError("the system prompt is not cached yet: prefill it first (pin=True)")
        computed = kept = 0
        items = self._keys(texts, collection)
        for done, (key, tokens) in enumerate(items, start=1):
            if self.store.holds(key):
                kept += 1
            else:
                request = self.loop.submit(Request(0, [*self.loop.system, *tokens], 0, store=key, background=True))
                kind, value = self.loop.next_event(request)
                if kind == "error":
                    raise value
                computed += 1
            if progress is not None:
                progress(done, len(items))
        self.store.cache.flush()  # the report counts what landed on disk
        stats = self.store.cache.stats()
        return {"computed": computed, "stored_before": kept, "disk_bytes": stats["disk_bytes"],
                "ram_bytes": stats["ram_bytes"], "entries": max(stats["disk_entries"], stats["ram_entries"])}

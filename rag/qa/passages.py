"""The engine's passage KV store as the pipeline uses it: whether an engine
splices prompts (``splicing``; the dispatcher submits prompts with their
passages), filling the store with every chunk
of the index (``rag ingest --precompute-kv``), and what ``rag doctor`` shows.

A chunk's passage is stored as every prompt shows it
(:func:`prompt_budget.layout.passage_body` of its source, text and page),
so the keys of a precomputed chunk and of the same chunk in a prompt match.
Every call that hands the engine passages names their collection
(:func:`for_collection`): the engine keys what it keeps by it, so no
collection's prompt is served from another's passages, even one whose text
is the same.

Does not: store, splice or evaluate anything (the engine does), or choose
passages (``planner``).
"""

from __future__ import annotations

from typing import Callable

from engine.backend import Backend, ExactPassages, PassageKV, PrefixCache, TakesPassages
from prompt_budget import ContextPassage, passage_body

from ..errors import RagError
from ..index.collection_names import DEFAULT_COLLECTION, named


def splicing(backend: Backend) -> PassageKV | None:
    """``backend`` if it splices stored passages into prompts now (lossy), else None."""
    return backend if isinstance(backend, PassageKV) and backend.splice_fresh is not None else None


def exact_reuse(backend: Backend) -> ExactPassages | None:
    """``backend`` if it reuses the exact KV of passages held from earlier prompts now, else None."""
    return backend if isinstance(backend, ExactPassages) and backend.exact_passages else None


def for_collection(collection: str | None) -> dict[str, str]:
    """The keyword that names ``collection`` (as prompts name it: None for
    the default one) to an engine's passage calls (``generate`` with
    ``passages=``, and those of :class:`~engine.backend.PassageKV` and
    :class:`~engine.backend.ExactPassages`): ``collection=`` for a named
    one; none for the default one, which is what the keyword means when it
    is left out. An engine written before collections then still serves the
    default collection, and a named one fails loudly there instead of being
    kept as the default's.

    ``for_collection("acme") -> {"collection": "acme"}``; ``for_collection(None) -> {}``
    """
    return {} if collection is None else {"collection": collection}


def takes_passages(backend: Backend) -> TakesPassages | None:
    """``backend`` if it wants a prompt's passages with it (it splices
    stored passages, or reuses exact ones held from earlier prompts), as the
    engine whose ``generate`` takes them; else None."""
    engine = splicing(backend)
    return engine if engine is not None else exact_reuse(backend)


class PassageReuse:
    """The pipeline's side of passage KV reuse, over a backend and an index
    loaded on first use."""

    def __init__(self, backend: Callable[[], Backend], index: Callable[[], object]) -> None:
        self._backend, self._index = backend, index

    def precompute(self, progress: Callable[[int, int], None] | None = None) -> dict[str, int]:
        """Evaluate and store the passage of every chunk of the index not
        stored yet, each under its own collection, calling ``progress(done,
        total)`` over them all; the passages computed, those already stored
        and the bytes the store holds (RAM and disk). RagError when the
        engine does not splice (a server, or splicing off)."""
        backend = self.check()
        by_collection: dict[str | None, list[str]] = {}
        for source, text, page, collection in self._index().passages():
            shown = named(collection)
            by_collection.setdefault(shown, []).append(passage_body(ContextPassage(source, text, page, shown)))
        total = sum(map(len, by_collection.values()))
        report: dict[str, int] = {}
        counted = {"computed": 0, "stored_before": 0}
        done = 0
        # The engine is asked once even for an empty index: it says whether it could store passages at all.
        for shown, texts in (by_collection or {named(DEFAULT_COLLECTION): []}).items():
            step = None if progress is None else (lambda n, _, before=done: progress(before + n, total))
            report = backend.precompute_passages(texts, step, **for_collection(shown))
            counted = {k: counted[k] + report.get(k, 0) for k in counted}
            done += len(texts)
        report = report | counted  # the store's bytes and entries as the last call left them; the counts of all
        return report | {"passages": total, "bytes_per_passage": _per_passage(report)}

    def check(self) -> PassageKV:
        """The engine, if it splices stored passages; else a RagError that says why not."""
        backend = self._backend()
        if not isinstance(backend, PassageKV):
            raise RagError(f"{backend.name} keeps no passage KV (only the in-process llama.cpp engine does); "
                           "drop --precompute-kv or --engine-url")
        if backend.splice_fresh is None:
            raise RagError("passages are precomputed only for lossy splicing: set --splice-fresh N (or RAG_SPLICE_FRESH); "
                           "exact reuse (the default) keeps passages as prompts are answered")
        return backend

    def describe(self) -> dict[str, object]:
        """For ``rag doctor``: whether the engine can splice stored passages,
        whether it does, its R and what its store holds."""
        backend = self._backend()
        if not isinstance(backend, PassageKV):
            return {"splicing": "unsupported (this engine keeps no passage KV)"}
        stats = backend.cache_stats() if isinstance(backend, PrefixCache) else {}
        return {"splicing": "on" if backend.splice_fresh is not None else "off", "splice_fresh": backend.splice_fresh,
                "exact_passages": "on" if exact_reuse(backend) else "off",
                **{k: v for k, v in stats.items() if k.startswith("passage_")}}


def _per_passage(report: dict[str, int]) -> int:
    """Bytes one stored passage takes, on average (disk if kept there, else RAM)."""
    entries = report.get("entries", 0)
    stored = report.get("disk_bytes", 0) or report.get("ram_bytes", 0)
    return round(stored / entries) if entries else 0

"""BM25 over chunks (each indexed as its document's title, then its text,
in the chunk's own language: ``rag.text.language``), saved beside the
vectors and updated incrementally.

Dense embeddings miss exact names (``shutil.copytree``, ``SIGINT``); BM25
finds them. The index keeps, per chunk, its terms and their counts (a
vocabulary, and a chunk-by-term table as flat NumPy arrays); scores are
computed when a query comes, Lucene's BM25 (``k1`` 1.5, ``b`` 0.75, the
formula bm25s calls "lucene", which ``tests/test_lexical_reference.py``
checks against it). Because nothing corpus-wide is precomputed, adding or
removing a file touches only that file's rows: a one-file upload into a large
index does not re-read the whole corpus. Saved as JSON and ``.npy`` arrays,
read with ``allow_pickle=False``.

Every statistic a score uses (the number of chunks, each term's document
frequency, the mean length, the languages a query is read in) is taken over
the chunks a search is given ``within``: a question's collection, so that
its ranking, scores included, is the same whatever another collection holds
(were they the whole index's, the order of two chunks would tell whether
another collection holds a word). Ties are broken by chunk id, never by
where a row lies among other collections' rows.

Does not: fuse rankings (``rag.retrieval``) or touch SQLite.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter, OrderedDict
from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np

from ..text import language

_FOLDER_FORMAT = 3  # 1: bm25s's own files, which are read no more (rebuilt); 2: English terms, unstemmed
K1, B = 1.5, 0.75
_ARRAYS = ("chunk_ids", "offsets", "terms", "counts", "langs")
DOMAINS_KEPT = 64  # the statistics of this many sets of chunk ids (collections) kept per index


def ids_key(ids: np.ndarray) -> bytes:
    """A key for the chunk ids ``ids`` as given (a collection's, which a
    reader hands out again and again): a 128-bit digest, so a cache of
    statistics does not keep every id list."""
    return hashlib.blake2b(np.ascontiguousarray(ids, dtype=np.int64).tobytes(), digest_size=16).digest()


class Domain(NamedTuple):
    """The chunks whose statistics a search ranks by."""

    rows: np.ndarray | None  # whether each row is one of them (None: every row)
    n: int  # how many
    avg: float  # their mean length, in terms (1.0 for none)
    languages: tuple[str, ...]  # their languages, sorted: a query is read in each


def tokenize(text: str, lang: str = language.DEFAULT) -> list[str]:
    """The BM25 terms of ``text`` in language ``lang``: words folded and
    stemmed, identifiers whole and in parts, stop words left out
    (:func:`rag.text.language.terms`).

    ``tokenize("Use os.path.join") -> ["use", "os.path.join", "os", "path", "join"]``
    """
    return language.terms(text, lang)


class LexicalIndex:
    """BM25 scores of chunks for a query, by chunk id.

    Row ``i`` stands for chunk ``chunk_ids[i]``; its distinct terms are
    ``terms[offsets[i]:offsets[i+1]]`` with their ``counts``, its language
    ``codes[langs[i]]``. A query is tokenized in every language held by
    the chunks it is searched ``within``.
    """

    def __init__(self, vocab: dict[str, int], chunk_ids: np.ndarray, offsets: np.ndarray, terms: np.ndarray,
                 counts: np.ndarray, langs: np.ndarray | None = None, codes: Sequence[str] = ()) -> None:
        self.vocab = vocab
        self.codes = tuple(codes)
        self.langs = (np.zeros(len(chunk_ids), np.int16) if langs is None else langs).astype(np.int16, copy=False)
        self.chunk_ids = chunk_ids.astype(np.int64, copy=False)
        self.offsets = offsets.astype(np.int64, copy=False)
        self.terms = terms.astype(np.int32, copy=False)
        self.counts = counts.astype(np.int32, copy=False)
        self._postings: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float] | None = None
        # The statistics of each set of chunk ids searched within, by ids_key: the index never changes.
        self._domains: OrderedDict[bytes, Domain] = OrderedDict()
        self._domains_lock = threading.Lock()

    # -- building --------------------------------------------------------------

    @classmethod
    def build(cls, ids: Sequence[int], texts: Sequence[str], langs: Sequence[str] | None = None) -> "LexicalIndex":
        """An index of ``texts`` (in languages ``langs``, default English),
        row ``i`` standing for chunk ``ids[i]``."""
        return cls.empty().updated((), ids, texts, langs)

    @classmethod
    def empty(cls) -> "LexicalIndex":
        """An index of no chunks."""
        return cls({}, np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int32))

    @property
    def languages(self) -> tuple[str, ...]:
        """The languages of the chunks held, sorted."""
        return tuple(sorted({self.codes[i] for i in np.unique(self.langs)})) if len(self.langs) else ()

    def updated(self, removed: Sequence[int], ids: Sequence[int], texts: Sequence[str],
                langs: Sequence[str] | None = None) -> "LexicalIndex":
        """This index without the chunks ``removed`` and with the chunks
        ``ids`` (texts ``texts``, languages ``langs``, default English)
        added: only the added texts are read."""
        keep = ~np.isin(self.chunk_ids, np.asarray(removed, dtype=np.int64)) if len(removed) else None
        chunk_ids, offsets, terms, counts, rows = self.chunk_ids, self.offsets, self.terms, self.counts, self.langs
        if keep is not None and not keep.all():
            lengths = np.diff(offsets)
            entry_kept = np.repeat(keep, lengths)
            chunk_ids, terms, counts, rows = chunk_ids[keep], terms[entry_kept], counts[entry_kept], rows[keep]
            offsets = np.concatenate([[0], np.cumsum(lengths[keep])])
        vocab = dict(self.vocab)
        codes = list(self.codes)
        langs = [language.known(x) for x in langs] if langs is not None else [language.DEFAULT] * len(texts)
        new_rows = []
        for lang in langs:
            if lang not in codes:
                codes.append(lang)
            new_rows.append(codes.index(lang))
        new_terms: list[int] = []
        new_counts: list[int] = []
        new_lengths: list[int] = []
        for text, lang in zip(texts, langs):
            counted = Counter(vocab.setdefault(t, len(vocab)) for t in tokenize(text, lang))
            new_terms.extend(counted.keys())
            new_counts.extend(counted.values())
            new_lengths.append(len(counted))
        return LexicalIndex(
            vocab,
            np.concatenate([chunk_ids, np.asarray(ids, dtype=np.int64)]),
            np.concatenate([offsets, offsets[-1] + np.cumsum(np.asarray(new_lengths, dtype=np.int64))]),
            np.concatenate([terms, np.asarray(new_terms, dtype=np.int32)]),
            np.concatenate([counts, np.asarray(new_counts, dtype=np.int32)]),
            np.concatenate([rows, np.asarray(new_rows, dtype=np.int16)]), codes,
        )

    def __len__(self) -> int:
        return int(len(self.chunk_ids))

    # -- searching -------------------------------------------------------------

    def _term_postings(self):
        """The chunk-by-term table turned term-major (built on first search):
        per term the rows holding it and their counts, and every row's length."""
        if self._postings is None:
            rows = np.repeat(np.arange(len(self.chunk_ids), dtype=np.int64), np.diff(self.offsets))
            order = np.argsort(self.terms, kind="stable")
            starts = np.zeros(len(self.vocab) + 1, dtype=np.int64)
            np.cumsum(np.bincount(self.terms, minlength=len(self.vocab)), out=starts[1:])
            doc_len = np.bincount(rows, weights=self.counts, minlength=len(self.chunk_ids))
            avg = float(doc_len.mean()) if len(doc_len) else 1.0
            self._postings = (starts, rows[order], self.counts[order], doc_len, avg or 1.0)
        return self._postings

    def domain(self, within: np.ndarray | None = None) -> Domain:
        """The statistics of the chunk ids ``within`` (None: of every chunk),
        computed once per set of ids (the last ``DOMAINS_KEPT``)."""
        if within is None:
            return Domain(None, len(self.chunk_ids), self._term_postings()[4], self.languages)
        key = ids_key(within)
        with self._domains_lock:
            found = self._domains.get(key)
            if found is not None:
                self._domains.move_to_end(key)
                return found
        rows = np.isin(self.chunk_ids, np.asarray(within, dtype=np.int64))
        lengths = self._term_postings()[3][rows]
        avg = float(lengths.mean()) if len(lengths) else 1.0
        languages = tuple(sorted({self.codes[i] for i in np.unique(self.langs[rows])}))
        found = Domain(rows, int(rows.sum()), avg or 1.0, languages)
        with self._domains_lock:
            self._domains[key] = found
            while len(self._domains) > DOMAINS_KEPT:
                self._domains.popitem(last=False)
        return found

    def search(self, query: str, k: int, allowed: np.ndarray | None = None,
               within: np.ndarray | None = None) -> list[tuple[int, float]]:
        """Up to ``k`` ``(chunk id, BM25 score)`` pairs, best first (ties by
        chunk id); only chunks sharing a term with ``query``, among the
        chunk ids ``within`` (None: all) and of those, ``allowed`` when
        given. Every statistic (document frequencies, the number of chunks,
        the mean length, the languages ``query`` is read in) is that of the
        chunks ``within``, whatever else the index holds; ``allowed`` only
        filters."""
        domain = self.domain(within)
        wanted = [self.vocab[t] for t in language.terms_in(query, domain.languages) if t in self.vocab]
        k = min(k, domain.n)
        if k <= 0 or not wanted:
            return []
        starts, rows, counts, doc_len, _ = self._term_postings()
        n = domain.n
        hit_rows, weights = [], []
        for term in wanted:  # a repeated query term counts again, as in bm25s
            a, b = starts[term], starts[term + 1]
            held, tf = rows[a:b], counts[a:b]
            if domain.rows is not None:  # the postings of other collections' chunks count for nothing
                kept = domain.rows[held]
                held, tf = held[kept], tf[kept]
            df = len(held)
            if df == 0:
                continue
            idf = np.log(1.0 + (n - df + 0.5) / (df + 0.5))
            tf = tf.astype(np.float64)
            norm = K1 * ((1 - B) + B * doc_len[held] / domain.avg)
            hit_rows.append(held)
            weights.append(idf * tf / (tf + norm))
        if not hit_rows:
            return []
        scores = np.bincount(np.concatenate(hit_rows), weights=np.concatenate(weights), minlength=len(self.chunk_ids))
        if allowed is not None and allowed is not within:
            scores[~np.isin(self.chunk_ids, allowed)] = 0.0
        found = np.flatnonzero(scores > 0)
        if len(found) > k:  # the k best, and every row tied with the k-th, then ordered by score and chunk id
            kth = np.partition(scores[found], len(found) - k)[len(found) - k]
            found = found[scores[found] >= kth]
        found = found[np.lexsort((self.chunk_ids[found], -scores[found]))][:k]
        return [(int(self.chunk_ids[r]), float(scores[r])) for r in found]

    def unheard(self, words: Sequence[str], within: np.ndarray | None = None) -> list[str]:
        """Those of ``words`` that no chunk ``within`` (None: any) holds:
        none of a word's terms, read in those chunks' languages, is in
        one of them. A word of stop words alone has no terms: it is heard."""
        domain = self.domain(within)
        starts, rows, _, _, _ = self._term_postings()

        def held(term: str) -> bool:
            at = self.vocab.get(term)
            if at is None:
                return False
            found = rows[starts[at]:starts[at + 1]]
            return bool(len(found)) if domain.rows is None else bool(domain.rows[found].any())

        out = []
        for word in words:
            terms = language.terms_in(word, domain.languages)
            if terms and not any(held(t) for t in terms):
                out.append(word)
        return out

    # -- on disk -----------------------------------------------------------------

    def save(self, folder: Path) -> None:
        """Write the index into ``folder`` (created; no pickle)."""
        folder.mkdir(parents=True, exist_ok=True)
        for name in _ARRAYS:
            np.save(folder / f"{name}.npy", getattr(self, name), allow_pickle=False)
        (folder / "vocab.json").write_text(json.dumps(self.vocab, ensure_ascii=False), encoding="utf-8")
        (folder / "format.json").write_text(json.dumps({"format": _FOLDER_FORMAT, "rows": len(self),
                                                        "languages": list(self.codes)}), encoding="utf-8")

    @classmethod
    def load(cls, folder: Path) -> "LexicalIndex":
        """The index saved in ``folder``; ValueError if it is missing,
        unreadable or of another format."""
        try:
            header = json.loads((folder / "format.json").read_text(encoding="utf-8"))
            if header.get("format") != _FOLDER_FORMAT:
                raise ValueError(f"BM25 folder format {header.get('format')!r}")
            arrays = {name: np.load(folder / f"{name}.npy", allow_pickle=False) for name in _ARRAYS}
            vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
        except (OSError, KeyError, TypeError, AttributeError, ValueError, EOFError, RecursionError) as exc:
            raise ValueError(f"{folder}: unreadable BM25 index ({exc})") from None
        codes = header.get("languages")
        if not isinstance(codes, list) or not all(isinstance(c, str) for c in codes):
            raise ValueError(f"{folder}: BM25 languages missing from its header")
        index = cls(vocab, **arrays, codes=codes)
        if len(index) != header.get("rows") or len(index.offsets) != len(index) + 1 or \
                index.offsets[-1] != len(index.terms) or len(index.terms) != len(index.counts):
            raise ValueError(f"{folder}: BM25 arrays do not match their header")
        if len(index.langs) != len(index) or (len(index.langs) and (index.langs.min() < 0
                                                                    or index.langs.max() >= len(codes))):
            raise ValueError(f"{folder}: BM25 languages do not match their rows")
        if len(index.terms) and (index.terms.min() < 0 or index.terms.max() >= len(vocab)):
            raise ValueError(f"{folder}: BM25 terms outside the vocabulary")
        return index

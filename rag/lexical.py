"""BM25 over chunk texts (bm25s), saved beside the vectors.

Dense embeddings miss exact names (``shutil.copytree``, ``SIGINT``); BM25
finds them. The index maps BM25 document rows to the store's chunk ids, and
is saved as bm25s's JSON vocabulary and parameters plus NumPy arrays,
written and read with ``allow_pickle=False``.

Does not: fuse rankings (``rag.retrieve``) or touch SQLite.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Sequence

import numpy as np

_FOLDER_FORMAT = 1
# Identifiers split on dots and underscores too, so ``os.path.join`` also
# matches a question about "path join"; the whole dotted name is kept as well.
_WORD = re.compile(r"[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*")
_PARTS = re.compile(r"[._]+")
_STOPWORDS = frozenset(
    "a an and are as at be but by can do does for from has have how i if in into is it its me my no not of on "
    "or so such than that the their then there these they this to was what when where which while who why will "
    "with you your".split()
)


def tokenize(text: str) -> list[str]:
    """The BM25 terms of ``text``: lower-cased words, identifiers whole and
    in parts, English stopwords left out.

    ``tokenize("Use os.path.join") -> ["use", "os.path.join", "os", "path", "join"]``
    """
    terms: list[str] = []
    for word in _WORD.findall(text.lower()):
        if "." in word or "_" in word:
            parts = [p for p in _PARTS.split(word) if len(p) > 1 and p not in _STOPWORDS]
            terms.append(word)
            terms.extend(parts)
        elif len(word) > 1 and word not in _STOPWORDS:
            terms.append(word)
    return terms


class LexicalIndex:
    """BM25 scores of chunks for a query, by chunk id."""

    def __init__(self, retriever, ids: np.ndarray) -> None:
        self._retriever = retriever
        self._ids = ids

    @classmethod
    def build(cls, ids: Sequence[int], texts: Sequence[str]) -> "LexicalIndex":
        """A BM25 index of ``texts``, row ``i`` standing for chunk ``ids[i]``."""
        import bm25s

        retriever = bm25s.BM25()
        if texts:
            retriever.index([tokenize(t) for t in texts], show_progress=False)
        return cls(retriever, np.asarray(ids, dtype=np.int64))

    def __len__(self) -> int:
        return int(len(self._ids))

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        """Up to ``k`` ``(chunk id, BM25 score)`` pairs, best first; only
        chunks sharing a term with ``query``."""
        terms = tokenize(query)
        k = min(k, len(self))
        if k <= 0 or not terms or not any(t in self._retriever.vocab_dict for t in terms):
            return []
        rows, scores = self._retriever.retrieve([terms], k=k, show_progress=False, n_threads=1)
        return [(int(self._ids[r]), float(s)) for r, s in zip(rows[0], scores[0]) if s > 0]

    def save(self, folder: Path) -> None:
        """Write the index into ``folder`` (created; no pickle)."""
        folder.mkdir(parents=True, exist_ok=True)
        if len(self):
            self._retriever.save(str(folder), allow_pickle=False)
        np.save(folder / "chunk_ids.npy", self._ids, allow_pickle=False)
        (folder / "format.json").write_text(json.dumps({"format": _FOLDER_FORMAT, "rows": len(self)}), encoding="utf-8")

    @classmethod
    def load(cls, folder: Path) -> "LexicalIndex":
        """The index saved in ``folder``; ValueError if it is missing or unreadable."""
        import bm25s

        try:
            header = json.loads((folder / "format.json").read_text(encoding="utf-8"))
            if header.get("format") != _FOLDER_FORMAT:
                raise ValueError(f"BM25 folder format {header.get('format')!r}")
            ids = np.load(folder / "chunk_ids.npy", allow_pickle=False)
            if len(ids) != header.get("rows"):
                raise ValueError("BM25 row count does not match its header")
            retriever = bm25s.BM25.load(str(folder), allow_pickle=False, mmap=False) if len(ids) else bm25s.BM25()
        except (OSError, KeyError, TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{folder}: unreadable BM25 index ({exc})") from None
        return cls(retriever, ids.astype(np.int64))

"""Ingesting files into an index, incrementally.

Finds the files under the given paths, skips those whose content hash the
index already holds, chunks and embeds new and changed ones, removes the
chunks of files that no longer exist, and publishes the result atomically
(``rag.store``). A file that cannot be read is reported and the rest go on.

Does not: decide where the index lives or which embedder to use (the
pipeline passes both in).
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Protocol, Sequence

import numpy as np

from .chunking import Chunker, TextChunk
from .embed import Embedder
from ..errors import DocumentError, RagError
from .loaders import is_supported, load_document
from ..index.store import FileRecord, IndexWriter, Manifest, NewChunk, open_writer

# Files are embedded in groups of at least this many chunks, so many small
# files still fill the embedder's batches.
EMBED_GROUP_CHUNKS = 64


class IngestProgress(Protocol):
    """Receives progress while an ingest runs (the CLI draws a bar from it)."""

    def start(self, total_files: int) -> None: ...

    def advance(self, files: int, chunks: int) -> None: ...


@dataclass
class IngestReport:
    """What an ingest did, by source path."""

    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (source, one-line error)
    chunks_added: int = 0
    chunks_removed: int = 0
    chunks_embedded: int = 0  # of chunks_added: the rest reused a vector (same text as before, or as another chunk)
    seconds: float = 0.0

    def counts(self) -> dict[str, int]:
        """``{"added": n, "updated": n, "removed": n, "skipped": n, "failed": n}``."""
        return {
            "added": len(self.added), "updated": len(self.updated), "removed": len(self.removed),
            "skipped": len(self.skipped), "failed": len(self.failed),
        }

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready account of the ingest."""
        return {
            **self.counts(),
            "chunks_added": self.chunks_added,
            "chunks_removed": self.chunks_removed,
            "chunks_embedded": self.chunks_embedded,
            "seconds": round(self.seconds, 3),
            "failures": [{"source": s, "error": e} for s, e in self.failed],
        }


@dataclass(frozen=True)
class SourceFile:
    """A file found for ingest: ``root / source`` is where it lies."""

    root: str
    source: str
    path: Path


DEFAULT_EXCLUDE = (".*", "*/.*", "__pycache__/*", "*/__pycache__/*")


def find_files(
    paths: Iterable[str | os.PathLike[str]],
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> tuple[list[SourceFile], list[str], list[tuple[str, str]]]:
    """The supported files under ``paths``, the directory roots walked, and
    ``(path, error)`` for paths that do not exist.

    A glob matches a file's source path or its name (``*.md`` matches
    ``a/b.md``). With ``include`` empty, every supported file is included;
    hidden files and folders are excluded unless named directly.
    """
    found: dict[tuple[str, str], SourceFile] = {}
    roots: list[str] = []
    missing: list[tuple[str, str]] = []
    excludes = tuple(exclude) + DEFAULT_EXCLUDE
    for raw in paths:
        path = Path(raw).expanduser()
        if path.is_dir():
            root = path.resolve()
            roots.append(str(root))
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames.sort()
                for name in sorted(filenames):
                    full = Path(dirpath) / name
                    source = full.relative_to(root).as_posix()
                    if is_supported(full) and _selected(source, include, excludes):
                        found.setdefault((str(root), source), SourceFile(str(root), source, full))
        elif path.is_file():
            full = path.resolve()
            found.setdefault((str(full.parent), full.name), SourceFile(str(full.parent), full.name, full))
        elif path.exists():
            missing.append((str(raw), "not a regular file or folder"))
        else:
            missing.append((str(raw), "no such file or folder; check the path"))
    return list(found.values()), roots, missing


def _matches(source: str, patterns: Sequence[str]) -> bool:
    name = source.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(source, p) or fnmatch.fnmatchcase(name, p) for p in patterns)


def _selected(source: str, include: Sequence[str], exclude: Sequence[str]) -> bool:
    return (not include or _matches(source, include)) and not _matches(source, exclude)


def chunk_id(root: str, source: str, position: int, chunk: TextChunk) -> str:
    """A stable id for a chunk: the same file content gives the same ids."""
    digest = hashlib.sha256(f"{root}\0{source}\0{position}\0{chunk.start}\0{chunk.text}".encode("utf-8"))
    return digest.hexdigest()[:16]


@dataclass
class _Pending:
    file: SourceFile
    sha256: str
    size: int
    chunks: list[TextChunk]
    replaces: FileRecord | None  # the record of the version it updates


def ingest(
    index_dir: Path,
    paths: Sequence[str | os.PathLike[str]],
    *,
    embedder: Embedder,
    chunker: Chunker,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    progress: IngestProgress | None = None,
) -> IngestReport:
    """Bring the index in ``index_dir`` up to date with the files under
    ``paths``, and say what changed.

    The index is replaced atomically at the end: an exception or a crash at
    any point leaves the previous index as it was. Unreadable files are
    reported in ``failed`` and do not stop the others.
    """
    started = time.perf_counter()
    report = IngestReport()
    files, roots, missing = find_files(paths, include, exclude)
    report.failed.extend(missing)
    manifest = Manifest(embedder=embedder.name, dim=embedder.dim, chunker=chunker.settings.to_dict())
    if progress:
        progress.start(len(files))
    with open_writer(index_dir, manifest) as writer:
        known = writer.files()
        pending: list[_Pending] = []
        for f in files:
            item = _prepare(f, known.get((f.root, f.source)), chunker, report)
            if item is None:
                if progress:
                    progress.advance(1, 0)
                continue
            pending.append(item)
            if sum(len(p.chunks) for p in pending) >= EMBED_GROUP_CHUNKS:
                _store(writer, pending, embedder, report, progress)
                pending = []
        _store(writer, pending, embedder, report, progress)
        for root in roots:
            for (_, source), record in writer.files(root).items():
                if not (Path(root) / source).exists():
                    writer.remove_file(record.id)
                    report.removed.append(source)
                    report.chunks_removed += record.n_chunks
        changed = report.added or report.updated or report.removed
        if changed or not (Path(index_dir) / "CURRENT").exists():
            writer.commit()
    report.seconds = time.perf_counter() - started
    return report


def _prepare(f: SourceFile, record: FileRecord | None, chunker: Chunker, report: IngestReport) -> _Pending | None:
    try:
        data = f.path.read_bytes()
    except OSError as exc:
        report.failed.append((f.source, f"cannot read ({exc.strerror or exc}); check its permissions"))
        return None
    digest = hashlib.sha256(data).hexdigest()
    if record is not None and record.sha256 == digest:
        report.skipped.append(f.source)
        return None
    try:
        chunks = chunker.split(load_document(f.source, f.path.suffix, data))
    except DocumentError as exc:
        report.failed.append((f.source, exc.problem))
        return None
    except RagError as exc:
        report.failed.append((f.source, str(exc)))
        return None
    return _Pending(f, digest, len(data), chunks, record)


def _store(writer: IndexWriter, pending: list[_Pending], embedder: Embedder, report: IngestReport, progress) -> None:
    if not pending:
        return
    texts = [c.text for p in pending for c in p.chunks]
    # A changed file mostly keeps its chunks' texts: their vectors are read
    # back instead of embedding them again; repeated texts are embedded once.
    known: dict[str, np.ndarray] = {}
    for p in pending:
        if p.replaces is not None:
            known.update(writer.vectors_by_text(p.replaces.id))
    fresh = list(dict.fromkeys(t for t in texts if t not in known))
    if fresh:
        known.update(zip(fresh, embedder.embed(fresh)))
    report.chunks_embedded += len(fresh)
    vectors = np.vstack([known[t] for t in texts]) if texts else np.zeros((0, embedder.dim), dtype=np.float32)
    row = 0
    for p in pending:
        n = len(p.chunks)
        if p.replaces is not None:
            writer.remove_file(p.replaces.id)
            report.chunks_removed += p.replaces.n_chunks
        writer.add_file(
            root=p.file.root, source=p.file.source, path=str(p.file.path), sha256=p.sha256, size=p.size,
            chunks=[
                NewChunk(chunk_id(p.file.root, p.file.source, i, c), i, c.start, c.end, c.page, c.n_tokens, c.text)
                for i, c in enumerate(p.chunks)
            ],
            vectors=vectors[row : row + n],
        )
        row += n
        (report.updated if p.replaces is not None else report.added).append(p.file.source)
        report.chunks_added += n
        if progress:
            progress.advance(1, n)

"""Ingesting files into an index, incrementally.

Finds the files under the given paths, skips those whose content hash the
index already holds, chunks and embeds new and changed ones, removes the
chunks of files that no longer exist, and publishes the result atomically
(``rag.store``). A file that cannot be read is reported and the rest go on.

Does not: decide where the index lives or which embedder to use (the
pipeline passes both in).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

from ..errors import DocumentError, RagError
from ..index.collection_names import DEFAULT_COLLECTION
from ..text.language import languages_of
from ..index.manifest import Manifest
from ..index.location import IndexLocation, index_exists, open_writer
from ..index.interface import IndexWriter
from ..index.records import FileRecord, NewChunk, embedded_text
from .chunking import Chunker, OverChunkLimit, TextChunk
from .embed import Embedder
from .files import DEFAULT_MAX_FILE_BYTES, FoundFiles, SourceFile, find_files, safe_name
from .formats import MAN_PAGES, SUPPORTED_SUFFIXES, format_suffix, load_document
from .formats.document import chunk_limit, text_limit
from .formats.sheets import rows_cut_note

# Files are embedded in groups of at least this many chunks, so many small
# files still fill the embedder's batches; a large file's chunks are embedded
# this many at a time, so a cancelled ingest stops within one such batch
# (about 0.7 s of embedding at the 95 chunks a second on 2 cores).
EMBED_GROUP_CHUNKS = 64


class IngestCancelled(RagError):
    """The ingest was stopped (its client left, or the server is stopping)
    before it published anything: the index is as it was."""


class IngestProgress(Protocol):
    """Receives progress while an ingest runs (the CLI draws a bar from it):
    files, chunks and bytes done, so a large file shows progress inside it."""

    def start(self, total_files: int, total_bytes: int) -> None: ...

    def advance(self, files: int, chunks: int, nbytes: int) -> None: ...


@dataclass
class IngestReport:
    """What an ingest did, by source path."""

    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (source, one-line error)
    ignored: list[tuple[str, str]] = field(default_factory=list)  # (source, why it was not read)
    warnings: list[tuple[str, str]] = field(default_factory=list)  # (source, what was left out of a file indexed)
    unsupported: dict[str, int] = field(default_factory=dict)  # suffix -> files of a type that cannot be read
    unmatched: list[str] = field(default_factory=list)  # globs that matched no file
    notes: list[str] = field(default_factory=list)  # what was wrong with the index it started from
    chunks_added: int = 0
    chunks_removed: int = 0
    chunks_embedded: int = 0  # of chunks_added: the rest reused a vector (same text as before, or as another chunk)
    seconds: float = 0.0
    seconds_reading: float = 0.0  # reading, parsing and chunking files
    seconds_embedding: float = 0.0

    def counts(self) -> dict[str, int]:
        """``{"added": n, "updated": n, "removed": n, "skipped": n, "failed": n}``."""
        return {
            "added": len(self.added), "updated": len(self.updated), "removed": len(self.removed),
            "skipped": len(self.skipped), "failed": len(self.failed),
        }

    def unsupported_text(self) -> str:
        """The files of types that cannot be read, by type: ``"3 .png, 1 .exe"``."""
        ordered = sorted(self.unsupported.items(), key=lambda kv: (-kv[1], kv[0]))
        return ", ".join(f"{n} {suffix}" for suffix, n in ordered)

    def nothing_indexed(self) -> str | None:
        """Why this run indexed nothing (no file added, updated or found
        unchanged), in one line; None when it indexed something."""
        if self.added or self.updated or self.skipped:
            return None
        why = []
        if self.failed:
            why.append(f"{len(self.failed)} could not be read (see the failed: lines)")
        if self.ignored:
            why.append(f"{len(self.ignored)} were passed over (see the skipped: lines)")
        if self.unsupported:
            n = sum(self.unsupported.values())
            why.append(f"{n} {'is' if n == 1 else 'are'} of types rag-budget cannot read ({self.unsupported_text()}; "
                       f"it reads {' '.join(sorted(SUPPORTED_SUFFIXES))} and {MAN_PAGES})")
        if self.unmatched:
            why.append(f"{', '.join(repr(g) for g in self.unmatched)} matched no file")
        if not why:
            return "nothing indexed: no files found (hidden files and folders are skipped)"
        return "nothing indexed: of the files found, " + "; ".join(why)

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready account of the ingest."""
        return {
            **self.counts(),
            "chunks_added": self.chunks_added,
            "chunks_removed": self.chunks_removed,
            "chunks_embedded": self.chunks_embedded,
            "seconds": round(self.seconds, 3),
            "seconds_reading": round(self.seconds_reading, 3),
            "seconds_embedding": round(self.seconds_embedding, 3),
            "failures": [{"source": s, "error": e} for s, e in self.failed],
            "ignored": [{"source": s, "reason": r} for s, r in self.ignored],
            "warnings": [{"source": s, "warning": w} for s, w in self.warnings],
            "unsupported": dict(sorted(self.unsupported.items())),
            "unmatched_globs": list(self.unmatched),
            "notes": list(self.notes),
            "nothing_indexed": self.nothing_indexed(),
        }


def chunk_id(root: str, source: str, position: int, chunk: TextChunk, collection: str = DEFAULT_COLLECTION) -> str:
    """A stable id for a chunk: the same file content in the same collection
    gives the same ids (those of the default collection are what they were
    before collections)."""
    within = "" if collection == DEFAULT_COLLECTION else f"{collection}\0"
    digest = hashlib.sha256(f"{within}{root}\0{source}\0{position}\0{chunk.start}\0{chunk.text}".encode("utf-8"))
    return digest.hexdigest()[:16]


@dataclass
class _Pending:
    file: SourceFile
    sha256: str
    size: int
    chunks: list[TextChunk]
    replaces: FileRecord | None  # the record of the version it updates


def ingest(
    index_location: IndexLocation,
    paths: Sequence[str | os.PathLike[str]],
    *,
    embedder: Embedder,
    chunker: Chunker,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    rebuild: bool = False,
    progress: IngestProgress | None = None,
    follow_links: bool = True,
    cancel: threading.Event | None = None,
    collection: str = DEFAULT_COLLECTION,
    skip: Sequence[Path] = (),
) -> IngestReport:
    """Bring the index in ``index_location`` (a folder, or a PostgreSQL URL: see
    ``rag.index.location``) up to date with the files under
    ``paths``, and say what changed.

    What one file may cost is bounded: its text by
    :func:`~rag.ingest.formats.document.text_limit` of its size (within
    ``max_file_bytes``), its chunks by ``chunk_limit`` of that; a file over
    either is refused (in ``failed``) as soon as it passes, before anything
    of it is embedded, except a sheet over its chunk limit: the rows of its
    first ``chunk_limit`` chunks are indexed, the rest said in ``warnings``
    (as rows past ``MAX_ROWS`` are). ``cancel``, once set, stops the ingest before the
    next file or batch of ``EMBED_GROUP_CHUNKS`` embedded: IngestCancelled,
    nothing published.

    The index is replaced atomically at the end: an exception or a crash at
    any point leaves the previous index as it was. Unreadable files are
    reported in ``failed``, files not read (special, too large) in
    ``ignored``, and neither stops the others. A folder's indexed files that
    are gone, or no longer match the globs, are removed; those in a folder
    that could not be listed are kept. ``rebuild`` starts from an empty index
    instead of the live one (a damaged index is repaired so). Symbolic
    links in a folder are read only when they lead to a file inside it, and
    never with ``follow_links`` False (see :func:`~rag.ingest.files.find_files`).
    Everything happens within ``collection``: the files of other
    collections are neither compared, removed nor rebuilt. The folders
    ``skip`` (the index's own) are never walked.
    """
    started = time.perf_counter()
    report = IngestReport()
    found = find_files(paths, include, exclude, max_file_bytes=max_file_bytes, follow_links=follow_links, skip=skip)
    report.failed.extend(found.failed)
    report.ignored.extend(found.ignored)
    report.unmatched.extend(found.unmatched)
    report.unsupported.update(found.unsupported)
    manifest = Manifest(embedder=embedder.name, dim=embedder.dim, chunker=chunker.settings.to_dict())
    if progress:
        progress.start(len(found.files), sum(f.size for f in found.files))
    with open_writer(index_location, manifest, fresh=rebuild, collection=collection) as writer:
        report.notes.extend(writer.notes)
        known = writer.files()
        pending: list[_Pending] = []
        for f in found.files:
            _check(cancel)
            item = _prepare(f, known.get((f.root, f.source)), chunker, report, progress, max_file_bytes)
            if item is None:
                if progress:
                    progress.advance(1, 0, 0)
                continue
            pending.append(item)
            if sum(len(p.chunks) for p in pending) >= EMBED_GROUP_CHUNKS:
                _store(writer, pending, embedder, report, progress, cancel)
                pending = []
        _store(writer, pending, embedder, report, progress, cancel)
        _remove_gone(writer, found, report)
        _check(cancel)
        changed = report.added or report.updated or report.removed
        # A damaged index (notes) is repaired by publishing the intact state anew.
        if changed or rebuild or writer.notes or not index_exists(index_location):
            writer.commit()
    report.seconds = time.perf_counter() - started
    return report


def _check(cancel: threading.Event | None) -> None:
    """IngestCancelled once ``cancel`` is set."""
    if cancel is not None and cancel.is_set():
        raise IngestCancelled("the ingest was stopped before it finished (its client left, or the server is "
                              "stopping); the index is as it was")


def _remove_gone(writer: IndexWriter, found: FoundFiles, report: IngestReport) -> None:
    """Remove the indexed files of each folder walked that this walk did not
    find (deleted, or no longer matching the globs), except under a folder
    that could not be listed."""
    present = {(f.root, f.source) for f in found.files}
    present |= {(root, source) for root in found.roots for source, _ in found.ignored}
    for root in found.roots:
        kept = [prefix for r, prefix in found.unlisted if r == root]
        for (_, source), record in writer.files(root).items():
            if (root, source) in present or any(prefix == "" or source.startswith(prefix) for prefix in kept):
                continue
            writer.remove_file(record.id)
            report.removed.append(source)
            report.chunks_removed += record.n_chunks


def _prepare(f: SourceFile, record: FileRecord | None, chunker: Chunker, report: IngestReport,
             progress: IngestProgress | None, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> _Pending | None:
    """The file read and chunked, or None when it is unchanged or cannot be
    read or is over its text or chunk limit (then reported); its bytes are
    counted as done either way."""
    done = 0

    def advance(fraction: float) -> None:
        nonlocal done
        now = min(int(f.size * fraction), f.size)
        if progress and now > done:
            progress.advance(0, 0, now - done)
            done = now

    started = time.perf_counter()
    try:
        data = _read(f)
        digest = hashlib.sha256(data).hexdigest()
        if record is not None and record.sha256 == digest:
            report.skipped.append(f.source)
            return None
        max_chars = text_limit(len(data), max_file_bytes)
        document = load_document(f.source, format_suffix(f.path.name), data, max_chars=max_chars)
        chunks, cut = _chunks(chunker, document, chunk_limit(max_chars), advance)
        report.warnings.extend((f.source, w) for w in (*document.warnings, *cut))
        return _Pending(f, digest, len(data), chunks, record)
    except FileNotFoundError:
        kept = "; what was indexed of it is kept" if record is not None else ""
        report.failed.append((f.source, f"disappeared while it was being read; ingest again when it is back{kept}"))
    except OSError as exc:
        report.failed.append((f.source, f"cannot read ({exc.strerror or exc}); check its permissions"))
    except DocumentError as exc:
        report.failed.append((f.source, exc.problem))
    except RagError as exc:
        report.failed.append((f.source, str(exc)))
    finally:
        advance(1.0)
        report.seconds_reading += time.perf_counter() - started
    return None


def _chunks(chunker: Chunker, document, limit: int, progress) -> tuple[list[TextChunk], tuple[str, ...]]:
    """The document's chunks and the note of what was cut: a sheet over
    ``limit`` chunks keeps its first ``limit`` (its first rows: whole
    records) and says so; any other document over it raises OverChunkLimit."""
    try:
        return chunker.split(document, progress=progress, max_chunks=limit), ()
    except OverChunkLimit as over:
        note = rows_cut_note(document, over.chunks[-1].end, over.limit) if over.chunks else None
        if note is None:
            raise
        return over.chunks, (note,)


def _store(writer: IndexWriter, pending: list[_Pending], embedder: Embedder, report: IngestReport, progress,
           cancel: threading.Event | None = None) -> None:
    """Embed the chunks of ``pending`` (``EMBED_GROUP_CHUNKS`` at a time,
    ``cancel`` checked before each) and stage them."""
    if not pending:
        return
    # Each chunk is embedded with its context (title and headings) before it.
    texts = [embedded_text(c.context, c.text) for p in pending for c in p.chunks]
    # A changed file mostly keeps its chunks' texts: their vectors are read
    # back instead of embedding them again; repeated texts are embedded once.
    known: dict[str, np.ndarray] = {}
    for p in pending:
        if p.replaces is not None:
            known.update(writer.vectors_by_text(p.replaces.id))
    fresh = list(dict.fromkeys(t for t in texts if t not in known))
    for at in range(0, len(fresh), EMBED_GROUP_CHUNKS):
        _check(cancel)
        batch = fresh[at:at + EMBED_GROUP_CHUNKS]
        started = time.perf_counter()
        known.update(zip(batch, embedder.embed(batch)))
        report.seconds_embedding += time.perf_counter() - started
    report.chunks_embedded += len(fresh)
    vectors = np.vstack([known[t] for t in texts]) if texts else np.zeros((0, embedder.dim), dtype=np.float32)
    row = 0
    for p in pending:
        n = len(p.chunks)
        if p.replaces is not None:
            writer.remove_file(p.replaces.id)
            report.chunks_removed += p.replaces.n_chunks
        langs = languages_of([c.text for c in p.chunks])
        writer.add_file(
            root=p.file.root, source=p.file.source, path=safe_name(str(p.file.path)), sha256=p.sha256, size=p.size,
            chunks=[
                NewChunk(chunk_id(p.file.root, p.file.source, i, c, writer.collection), i, c.start, c.end, c.page, c.n_tokens, c.text,
                         context=c.context, location=c.location.to_dict(), lang=lang, units=c.units)
                for i, (c, lang) in enumerate(zip(p.chunks, langs))
            ],
            vectors=vectors[row : row + n],
        )
        row += n
        (report.updated if p.replaces is not None else report.added).append(p.file.source)
        report.chunks_added += n
        if progress:
            progress.advance(1, n, 0)


GROWTH_BYTES = 1 << 20  # read of a file that grew since it was found


def _read(f: SourceFile) -> bytes:
    """The bytes of ``f``: a regular file only (one swapped for a pipe or a
    device since it was found is refused, without blocking), and at most
    ``GROWTH_BYTES`` more than its size when found. A file found as no link
    is opened without following one: a link swapped in since is refused."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | (0 if f.link else getattr(os, "O_NOFOLLOW", 0))
    fd = os.open(f.path, flags)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file any more")
        return fh.read(f.size + GROWTH_BYTES)

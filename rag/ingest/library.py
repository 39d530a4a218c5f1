"""The documents of one index: adding folders and files, uploads, listing
and removing them, each change published atomically as a new generation.

Does not: search, or decide which index or embedder (the pipeline passes
both in).
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from pathlib import Path
from typing import Callable, Sequence

from ..errors import DocumentNotFound, RagError
from ..index.generations import index_exists
from ..index.store import live_manifest, open_writer
from .chunking import Chunker, ChunkerSettings
from .content import DocumentFile, file_in
from .embed import Embedder
from .files import DEFAULT_MAX_FILE_BYTES
from .formats import SUPPORTED_SUFFIXES, is_supported
from .run import IngestProgress, IngestReport, ingest
from .watch import watch


def document_id(root: str, source: str) -> str:
    """The stable id of the document ``source`` ingested from ``root``."""
    return hashlib.sha256(f"{root}\0{source}".encode("utf-8")).hexdigest()[:16]


MAX_NAME_BYTES = 200  # the name of an upload; its temporary name adds about 40


def safe_file_name(name: str) -> str:
    """``name`` as a bare, harmless file name of a type that can be indexed:
    no folders, no leading dots, no control characters, at most
    ``MAX_NAME_BYTES`` bytes with its suffix kept; a RagError if nothing
    usable is left or the type cannot be read.

    ``safe_file_name("../../notes/plan.md") -> "plan.md"``
    """
    base = re.split(r"[\\/]", name or "")[-1]
    base = re.sub(r"[\x00-\x1f\x7f]", "", base).strip().lstrip(".")
    base = re.sub(r"[^\w.\- ]", "_", base)
    stem, suffix = os.path.splitext(base)
    if not stem or not any(c.isalnum() for c in stem):
        raise RagError(f"{name!r} is not a usable file name")
    if not is_supported(Path(base)):
        raise RagError(f"{name!r}: {suffix or 'no suffix'} is not a type rag-budget reads; "
                       f"upload one of {', '.join(sorted(SUPPORTED_SUFFIXES))}")
    room = MAX_NAME_BYTES - len(suffix.encode("utf-8"))
    stem = stem.encode("utf-8")[:room].decode("utf-8", "ignore").rstrip() or "upload"
    return stem + suffix


class DocumentLibrary:
    """The documents in the index at ``index_dir``, embedded by
    ``embedder()``; ``changed()`` is called after every published change."""

    def __init__(self, index_dir: Path, embedder: Callable[[], Embedder], changed: Callable[[], None]) -> None:
        self.index_dir = Path(index_dir)
        self._embedder = embedder
        self._changed = changed

    @property
    def uploads_dir(self) -> Path:
        """Where uploaded documents are kept: beside the index folder."""
        return self.index_dir.parent / f"{self.index_dir.name}-uploads"

    def chunker(self, chunk_tokens: int | None = None, overlap_tokens: int | None = None, *,
                fresh: bool = False) -> Chunker:
        """The chunker for this index: its own settings unless told otherwise
        (or ``fresh``: the defaults)."""
        settings = ChunkerSettings()
        if index_exists(self.index_dir) and not fresh:
            built = live_manifest(self.index_dir).chunker
            if set(built) == {"chunk_tokens", "overlap_tokens"}:
                settings = ChunkerSettings(**built)
        try:
            if chunk_tokens is not None or overlap_tokens is not None:
                size = chunk_tokens if chunk_tokens is not None else settings.chunk_tokens
                overlap = overlap_tokens if overlap_tokens is not None else min(settings.overlap_tokens, size // 4)
                settings = ChunkerSettings(size, overlap)
        except ValueError as exc:
            raise RagError(str(exc)) from None
        return Chunker(self._embedder().count_tokens, settings)

    def ingest(
        self,
        paths: Sequence[str | os.PathLike[str]],
        *,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        chunk_tokens: int | None = None,
        overlap_tokens: int | None = None,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        rebuild: bool = False,
        progress: IngestProgress | None = None,
    ) -> IngestReport:
        """Add, update and remove documents under ``paths``, incrementally
        and atomically; see :func:`rag.ingest.run.ingest`."""
        chunker = self.chunker(chunk_tokens, overlap_tokens, fresh=rebuild)
        report = ingest(self.index_dir, paths, embedder=self._embedder(), chunker=chunker, include=include,
                        exclude=exclude, max_file_bytes=max_file_bytes, rebuild=rebuild, progress=progress)
        self._changed()
        return report

    def watch(self, paths: Sequence[str | os.PathLike[str]],
              on_report: Callable[[IngestReport | None, str | None, int], None], *,
              stop: threading.Event | None = None, **options) -> None:
        """Ingest ``paths`` again (with the :meth:`ingest` ``options``) each
        time a file under them changes, debounced, until ``stop`` is set or
        Ctrl-C; see :func:`rag.ingest.watch.watch`. The index's own folders
        are not watched."""
        watch(paths, lambda: self.ingest(paths, **options), on_report,
              ignore=[self.index_dir.resolve(), self.uploads_dir.resolve()], stop=stop)

    def documents(self, files: dict) -> list[dict[str, object]]:
        """The files of an open index (``Index.files()``) as documents:
        ``id`` (stable, opaque), ``source``, ``root``, ``chunks`` and ``sha256``."""
        return [
            {"id": document_id(r.root, r.source), "source": r.source, "root": r.root,
             "chunks": r.n_chunks, "sha256": r.sha256}
            for r in files.values()
        ]

    def add(self, name: str, data: bytes) -> IngestReport:
        """Save ``data`` as the file ``name`` (sanitised: a bare file name,
        no folders, a type that can be read) in the uploads folder and ingest
        that folder. The file is written atomically; when it cannot be
        indexed, or the ingest fails, it is removed again (or its previous
        version restored): the folder never keeps what the index does not."""
        folder = self.uploads_dir
        safe = safe_file_name(name)
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / safe
        tmp = folder / f".{safe}.{os.getpid()}.{threading.get_ident()}.part"
        previous = target.read_bytes() if target.is_file() else None
        try:
            tmp.write_bytes(data)
            os.replace(tmp, target)
            report = self.ingest([folder])
        except BaseException:
            self._restore(target, previous)
            raise
        finally:
            tmp.unlink(missing_ok=True)
        if any(Path(path).name == safe for path, _ in report.failed):
            self._restore(target, previous)
        return report

    @staticmethod
    def _restore(target: Path, previous: bytes | None) -> None:
        if previous is None:
            target.unlink(missing_ok=True)
        else:
            target.write_bytes(previous)

    def remove(self, doc_id: str) -> dict[str, object]:
        """Remove the document ``doc_id`` from the index, atomically, and its
        file if it was uploaded; what was removed. DocumentNotFound if there
        is no such document."""
        manifest = live_manifest(self.index_dir) if index_exists(self.index_dir) else None
        if manifest is None:
            raise DocumentNotFound(f"no document {doc_id}: the index is empty")
        with open_writer(self.index_dir, manifest) as writer:
            found = [r for r in writer.files().values() if document_id(r.root, r.source) == doc_id]
            if not found:
                raise DocumentNotFound(f"no document {doc_id}; GET /v1/documents lists them")
            record = found[0]
            writer.remove_file(record.id)
            writer.commit()
        self._changed()
        uploaded = Path(record.root) / record.source
        if Path(record.root).resolve() == self.uploads_dir.resolve() and uploaded.is_file():
            uploaded.unlink()
        return {"id": doc_id, "source": record.source, "chunks": record.n_chunks}

    def locate(self, doc_id: str, files: dict) -> DocumentFile:
        """The file of the document ``doc_id`` among the files of an open
        index (``Index.files()``); DocumentNotFound if there is none. Only
        the index's records are looked at: no path comes from the caller."""
        for record in files.values():
            if document_id(record.root, record.source) == doc_id:
                return DocumentFile(doc_id, record.source, file_in(record.root, record.source), record.sha256)
        raise DocumentNotFound(f"no document {doc_id}; GET /v1/documents lists them")

    def is_upload(self, document: dict[str, object]) -> bool:
        """Whether ``document`` (of :meth:`documents`) lies in the uploads folder."""
        return Path(str(document["root"])).resolve() == self.uploads_dir.resolve()

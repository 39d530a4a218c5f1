"""The documents of one index: adding folders and files, uploads, listing
and removing them, each change published atomically as a new generation.

Does not: search, or decide which index or embedder (the pipeline passes
both in).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Callable, Iterator, Sequence

try:
    import fcntl
except ImportError:  # not on Windows: uploads are then serialised by the service alone
    fcntl = None  # type: ignore[assignment]

from ..index.collection_names import DEFAULT_COLLECTION
from ..errors import DocumentNotFound, RagError
from ..index.generations import open_lock_file
from ..index.location import IndexLocation, folder_of, index_exists, as_index_location, live_manifest, open_index, \
    open_writer
from ..index.manifest import Manifest
from .chunking import Chunker, ChunkerSettings
from .content import DocumentFile, file_in
from .embed import Embedder
from .files import DEFAULT_MAX_FILE_BYTES, safe_name
from .formats import SUPPORTED_SUFFIXES, is_supported
from .run import IngestProgress, IngestReport, ingest
from .watch import watch


def document_id(root: str, source: str) -> str:
    """The stable id of the document ``source`` ingested from ``root``."""
    return hashlib.sha256(f"{root}\0{source}".encode("utf-8")).hexdigest()[:16]


MAX_NAME_BYTES = 200  # the name of an upload; its temporary name adds about 40
PART_SUFFIX = ".part"  # an upload being written: ``.NAME.PID.THREAD.part``
PREVIOUS_SUFFIX = ".previous"  # the indexed version of a file an upload replaces: ``.NAME.previous``
UPLOADS_MARK = ".rag-uploads"  # in every uploads folder an upload made; only such a folder is ever deleted


@contextlib.contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    """Hold the uploads folder's lock (a ``flock`` on ``.lock`` in it): one
    upload at a time, across threads and processes; a killed holder's lock
    is released by the system. A link or an empty folder named ``.lock``
    is replaced; anything else there is a one-line error (see
    :func:`~rag.index.generations.open_lock_file`)."""
    fd = open_lock_file(folder / ".lock")
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _keep_copy(target: Path, backup: Path) -> None:
    """``backup`` as a second name of ``target`` (a copy where hard links cannot be made)."""
    backup.unlink(missing_ok=True)
    try:
        os.link(target, backup)
    except OSError:
        shutil.copyfile(target, backup)


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
    """The documents in the index at ``index_location`` (a folder, or a
    PostgreSQL URL), embedded by ``embedder()``; ``changed()`` is called
    after every published change. Uploads are kept in ``uploads_dir``
    (default: beside the index folder; a database index needs one given).
    :meth:`stop_ingests` stops every ingest it runs (a server told to exit)."""

    def __init__(self, index_location: IndexLocation, embedder: Callable[[], Embedder], changed: Callable[[], None],
                 *, uploads_dir: Path | None = None) -> None:
        self.index_location = as_index_location(index_location)
        self._uploads_dir = uploads_dir
        self._embedder = embedder
        self._changed = changed
        self.stopping = threading.Event()  # set by stop_ingests: every ingest stops, new ones at once
        self._running: set[threading.Event] = set()  # the cancel event of each ingest running
        self._guard = threading.Lock()

    def stop_ingests(self) -> None:
        """Stop every ingest running, each before its next file or batch
        embedded (nothing of it published), and every one started after."""
        with self._guard:
            self.stopping.set()
            for cancel in self._running:
                cancel.set()

    @contextlib.contextmanager
    def _cancellable(self, cancel: threading.Event | None) -> Iterator[threading.Event]:
        """``cancel`` (or a new event), also set by :meth:`stop_ingests`, for one ingest."""
        cancel = cancel if cancel is not None else threading.Event()
        with self._guard:
            self._running.add(cancel)
            if self.stopping.is_set():
                cancel.set()
        try:
            yield cancel
        finally:
            with self._guard:
                self._running.discard(cancel)

    @property
    def uploads_dir(self) -> Path:
        """Where uploaded documents are kept: beside the index folder (or
        where the pipeline says, for a database index)."""
        folder = folder_of(self.index_location)
        if self._uploads_dir is not None or folder is None:
            if self._uploads_dir is None:
                raise RagError("a database index keeps no uploads folder of its own; give DocumentLibrary one")
            return self._uploads_dir
        return folder.parent / f"{folder.name}-uploads"

    def chunker(self, chunk_tokens: int | None = None, overlap_tokens: int | None = None, *,
                fresh: bool = False) -> Chunker:
        """The chunker for this index: its own settings unless told otherwise
        (or ``fresh``: the defaults)."""
        settings = ChunkerSettings()
        if index_exists(self.index_location) and not fresh:
            built = live_manifest(self.index_location).chunker
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
        follow_links: bool = True,
        cancel: threading.Event | None = None,
        collection: str = DEFAULT_COLLECTION,
        skip: Sequence[Path] = (),
    ) -> IngestReport:
        """Add, update and remove documents under ``paths`` in
        ``collection``, incrementally and atomically (no other collection's
        documents are read or touched); see :func:`rag.ingest.run.ingest`
        (``cancel``, or :meth:`stop_ingests`, stops it: IngestCancelled,
        nothing published). The folders ``skip`` (another collection's,
        nested inside these) and the index's own (:meth:`own_folders`) are
        never walked."""
        chunker = self.chunker(chunk_tokens, overlap_tokens, fresh=rebuild)
        with self._cancellable(cancel) as cancel:
            report = ingest(self.index_location, paths, embedder=self._embedder(), chunker=chunker, include=include,
                            exclude=exclude, max_file_bytes=max_file_bytes, rebuild=rebuild, progress=progress,
                            follow_links=follow_links, cancel=cancel, collection=collection,
                            skip=[*self.own_folders(), *(Path(p).resolve() for p in skip)])
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
              ignore=[p.resolve() for p in (folder_of(self.index_location), self.uploads_dir) if p is not None]
              + [self.uploads_dir.resolve().with_name(self.uploads_dir.name + "-")], stop=stop)

    def own_folders(self) -> list[Path]:
        """The folders of the index itself: its own folder and every
        collection's uploads folder. An ingest never walks them, so a
        folder that holds the index (``rag serve --watch DIR``) does not
        take one collection's uploads into another."""
        folders = [p for p in (folder_of(self.index_location), self.uploads_dir) if p is not None]
        parent = self.uploads_dir.parent
        if parent.is_dir():
            folders += sorted(parent.glob(glob.escape(self.uploads_dir.name) + "-*"))
        return [p.resolve() for p in folders]

    def documents(self, files: dict, collection: str = DEFAULT_COLLECTION) -> list[dict[str, object]]:
        """The files of an open index (``IndexReader.files()``, of
        ``collection``) as documents: ``id`` (stable, opaque), ``source``,
        ``root``, ``collection``, ``chunks`` and ``sha256``."""
        return [
            {"id": document_id(r.root, r.source), "source": r.source, "root": r.root, "collection": collection,
             "chunks": r.n_chunks, "sha256": r.sha256}
            for r in files.values()
        ]

    def upload_folder(self, collection: str = DEFAULT_COLLECTION) -> Path:
        """Where uploads to ``collection`` are kept: the uploads folder for
        the default one, a folder beside it for each other (never inside:
        ingesting one collection's folder must not walk into another's)."""
        if collection == DEFAULT_COLLECTION:
            return self.uploads_dir
        return self.uploads_dir.with_name(f"{self.uploads_dir.name}-{collection}")

    def add(self, name: str, data: bytes, *, cancel: threading.Event | None = None,
            collection: str = DEFAULT_COLLECTION) -> IngestReport:
        """Save ``data`` as the file ``name`` (sanitised: a bare file name,
        no folders, a type that can be read) in the uploads folder of
        ``collection`` (:meth:`upload_folder`) and ingest that folder into it. The file is written under a temporary name and renamed
        when complete; when it cannot be indexed (unreadable, over the size
        limit: in ``failed``), or the ingest fails, it is removed again (or
        its previous version restored): the folder never keeps what the index
        does not. Uploads to one folder run one at a time, and each first
        accounts for what an upload that did not finish (a killed process)
        left behind: see :meth:`sweep_uploads`; symbolic links in the folder
        are never followed. ``cancel`` (its client left) stops the ingest:
        IngestCancelled, the file removed or its previous version restored."""
        folder = self.upload_folder(collection)
        safe = safe_file_name(name)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / UPLOADS_MARK).touch()  # made by this library: deleting the collection may remove it
        target = folder / safe
        with _folder_lock(folder):
            notes = self.sweep_uploads(collection)
            tmp = folder / f".{safe}.{os.getpid()}.{threading.get_ident()}{PART_SUFFIX}"
            backup = folder / f".{safe}{PREVIOUS_SUFFIX}"
            try:
                tmp.write_bytes(data)
                if target.is_file() and not target.is_symlink():
                    _keep_copy(target, backup)  # restored by the next upload if this process dies
                os.replace(tmp, target)
                report = self.ingest([folder], follow_links=False, cancel=cancel, collection=collection)
            except BaseException:
                self._restore(target, backup)
                raise
            finally:
                tmp.unlink(missing_ok=True)
            refused = [(source, why) for source, why in report.ignored if source == safe]
            if refused:  # over the size limit: a failure of this upload, not a file to keep
                report.ignored = [item for item in report.ignored if item not in refused]
                report.failed.extend(refused)
            if any(Path(path).name == safe for path, _ in report.failed):
                self._restore(target, backup)
            else:
                backup.unlink(missing_ok=True)
            report.notes.extend(notes)
        return report

    def sweep_uploads(self, collection: str = DEFAULT_COLLECTION) -> list[str]:
        """Account for what uploads that did not finish left in the uploads
        folder, and say what was done, a line each: partial files removed,
        a replaced file's indexed version restored, and files the index does
        not hold (and symbolic links) removed, so the next ingest of the
        folder does not index them unasked. With no index yet nothing is
        removed: those files are indexed, and said so. Call it with the
        folder locked (:meth:`add` does). ``collection``: the one whose
        uploads folder it is."""
        folder = self.upload_folder(collection)
        if not folder.is_dir():
            return []
        notes: list[str] = []
        for entry in sorted(folder.iterdir()):
            name = entry.name
            if name.startswith(".") and name.endswith(PART_SUFFIX):
                entry.unlink(missing_ok=True)
                notes.append(f"removed {safe_name(name)}: the partial file of an upload that did not finish")
            elif name.startswith(".") and name.endswith(PREVIOUS_SUFFIX) and not entry.is_symlink():
                original = name[1:-len(PREVIOUS_SUFFIX)]
                os.replace(entry, folder / original)
                notes.append(f"restored {safe_name(original)} as indexed: an upload replacing it did not finish")
        indexed = self._indexed_uploads(collection)
        for entry in sorted(folder.iterdir()):
            if entry.name.startswith(".") or (entry.is_dir() and not entry.is_symlink()):
                continue
            shown = safe_name(entry.name)
            if entry.is_symlink():
                entry.unlink()
                notes.append(f"removed {shown}: a symbolic link, never followed in the uploads folder")
            elif indexed is None:
                notes.append(f"indexed {shown} too: it was in the uploads folder before this upload")
            elif shown not in indexed:
                entry.unlink(missing_ok=True)
                notes.append(f"removed {shown}: left in the uploads folder by an upload that did not finish "
                             "(never indexed); upload it again")
        return notes

    def _indexed_uploads(self, collection: str = DEFAULT_COLLECTION) -> set[str] | None:
        """The sources the index holds from ``collection``'s uploads folder (None: no index)."""
        if not index_exists(self.index_location):
            return None
        manifest = live_manifest(self.index_location)
        index = open_index(self.index_location, embedder=manifest.embedder, dim=manifest.dim)
        try:
            root = safe_name(str(self.upload_folder(collection).resolve()))
            return {source for _, source in index.files(root, collection)}
        finally:
            index.close()

    @staticmethod
    def _restore(target: Path, backup: Path) -> None:
        if backup.is_file():
            os.replace(backup, target)
        else:
            target.unlink(missing_ok=True)

    def remove(self, doc_id: str, collection: str = DEFAULT_COLLECTION) -> dict[str, object]:
        """Remove the document ``doc_id`` from the index, atomically, and its
        file if it was uploaded; what was removed. DocumentNotFound if there
        is no such document."""
        manifest = live_manifest(self.index_location) if index_exists(self.index_location) else None
        if manifest is None:
            raise DocumentNotFound(f"no document {doc_id}: the index is empty")
        with open_writer(self.index_location, manifest, collection=collection) as writer:
            found = [r for r in writer.files().values() if document_id(r.root, r.source) == doc_id]
            if not found:
                raise DocumentNotFound(f"no document {doc_id}; GET /v1/documents lists them")
            record = found[0]
            writer.remove_file(record.id)
            writer.commit()
        self._changed()
        uploaded = Path(record.root) / record.source
        if Path(record.root).resolve() == self.upload_folder(collection).resolve() and uploaded.is_file():
            uploaded.unlink()
        return {"id": doc_id, "source": record.source, "chunks": record.n_chunks}

    def remove_collection(self, collection: str) -> int:
        """Remove ``collection`` from the index, atomically, with every
        document in it and their chunks, then the files uploaded into it
        (its uploads folder); how many documents. DocumentNotFound when
        there is no such collection."""
        if not index_exists(self.index_location):
            raise DocumentNotFound(f"no collection {collection!r}: the index is empty")
        with open_writer(self.index_location, live_manifest(self.index_location), collection=collection) as writer:
            removed = writer.remove_collection()
            if removed is None:
                raise DocumentNotFound(f"no collection {collection!r} (rag collections lists them)")
            writer.commit()
        self._changed()
        self._remove_uploads(collection)
        return removed

    def _remove_uploads(self, collection: str) -> None:
        """Delete what was uploaded into ``collection``: its uploads folder,
        under the folder's lock (so no upload is half written meanwhile),
        only where an upload made it (it holds :data:`UPLOADS_MARK`): a
        folder that merely has its name, or a link there, is left alone."""
        folder = self.upload_folder(collection)
        if folder.is_symlink() or not (folder / UPLOADS_MARK).is_file():
            return
        with _folder_lock(folder):
            for entry in folder.iterdir():
                if entry.name == ".lock":
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink(missing_ok=True)
        shutil.rmtree(folder, ignore_errors=True)  # the lock file last, once no upload holds it

    def _manifest(self) -> Manifest:
        """The live index's manifest, or what an ingest would write one with."""
        if index_exists(self.index_location):
            return live_manifest(self.index_location)
        embedder = self._embedder()
        return Manifest(embedder=embedder.name, dim=embedder.dim, chunker=self.chunker().settings.to_dict())

    def create_collection(self, collection: str) -> bool:
        """Make ``collection`` in the index, holding no documents yet (the
        index is made too if there is none); whether it is new (False: it
        was there already, and is left as it is)."""
        with open_writer(self.index_location, self._manifest(), collection=collection) as writer:
            new = writer.create_collection()
            if new:
                writer.commit()
        if new:
            self._changed()
        return new

    def locate(self, doc_id: str, files: dict) -> DocumentFile:
        """The file of the document ``doc_id`` among the files of an open
        index (``IndexReader.files()``); DocumentNotFound if there is none. Only
        the index's records are looked at: no path comes from the caller."""
        for record in files.values():
            if document_id(record.root, record.source) == doc_id:
                return DocumentFile(doc_id, record.source, file_in(record.root, record.source), record.sha256)
        raise DocumentNotFound(f"no document {doc_id}; GET /v1/documents lists them")

    def is_upload(self, document: dict[str, object]) -> bool:
        """Whether ``document`` (of :meth:`documents`) lies in the uploads folder of its collection."""
        folder = self.upload_folder(str(document.get("collection", DEFAULT_COLLECTION)))
        return Path(str(document["root"])).resolve() == folder.resolve()

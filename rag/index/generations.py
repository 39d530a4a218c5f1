"""The generations of an index directory: which one is live, whether one is
intact, falling back to the last intact one, publishing a new one, and the
lock that lets one process write at a time.

    DIR/CURRENT            name of the live generation (one line)
    DIR/gen-000007/        manifest.json, vectors.faiss, chunks.sqlite, bm25/
    DIR/gen-000006/        the one before it, kept to fall back to
    DIR/.lock              held by the one process writing

Does not: read vectors or chunks (``store`` does).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..errors import IndexBusy, IndexDamaged, IndexMismatch, IndexNotFound
from .manifest import Manifest, sha256_of

CHECKSUM_AT_OPEN_BYTES = 64 << 20  # generations this small are checksummed whenever opened
REQUIRED = ("vectors.faiss", "chunks.sqlite")


def index_exists(directory: Path) -> bool:
    """Whether ``directory`` holds a published index (intact or not)."""
    return (Path(directory) / "CURRENT").is_file()


def number(generation: Path) -> int:
    """The number of a generation folder (``gen-000007`` -> 7); -1 if not one."""
    digits = generation.name[4:]
    return int(digits) if generation.name.startswith("gen-") and digits.isdigit() else -1


def generations(directory: Path) -> list[Path]:
    """The generation folders of ``directory``, newest first."""
    found = [p for p in Path(directory).glob("gen-*") if p.is_dir() and number(p) >= 0]
    return sorted(found, key=number, reverse=True)


def current_name(directory: Path) -> str | None:
    """The generation ``CURRENT`` names (None when it is missing, empty or garbage)."""
    try:
        name = (Path(directory) / "CURRENT").read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None
    return name if name.startswith("gen-") and name[4:].isdigit() else None


def problem(generation: Path, *, full: bool | None = None) -> str | None:
    """What is wrong with ``generation`` (None if nothing found): a missing
    or unreadable manifest or file, a size or, with ``full`` (default: when
    the generation is small enough to read quickly), a checksum that differs
    from what its manifest recorded."""
    if not generation.is_dir():
        return "the folder is missing"
    try:
        manifest = Manifest.read(generation / "manifest.json")
    except IndexMismatch:
        return "manifest.json is missing or unreadable"
    for name in REQUIRED:
        if not (generation / name).is_file():
            return f"{name} is missing"
    # The BM25 folder is optional: its damage is found, and mended, when it is loaded.
    recorded = {name: facts for name, facts in manifest.files.items() if "/" not in name}
    if not recorded:
        return None  # written before checksums were recorded: nothing to compare
    sizes = {}
    for name, facts in recorded.items():
        try:
            sizes[name] = (generation / name).stat().st_size
        except OSError:
            return f"{name} is missing"
        if sizes[name] != facts.get("bytes"):
            return f"{name} has {sizes[name]} bytes, its manifest says {facts.get('bytes')}"
    if full is None:
        full = sum(sizes.values()) <= CHECKSUM_AT_OPEN_BYTES
    if full:
        for name, facts in recorded.items():
            try:
                if sha256_of(generation / name) != facts.get("sha256"):
                    return f"{name} does not match its checksum"
            except OSError as exc:
                return f"{name} cannot be read ({exc.strerror or exc})"
    return None


@dataclass(frozen=True)
class Chosen:
    """The generation to read, and what was wrong with newer ones (empty
    when it is the live one and intact)."""

    generation: Path
    notes: tuple[str, ...] = ()


def choose(directory: Path, *, full: bool | None = None, skip: dict[str, str] | None = None) -> Chosen:
    """The generation to read: the live one if intact, else the newest
    intact one before it, with a note of what was damaged. ``skip`` names
    generations already found damaged, with what was wrong. IndexNotFound if
    there is no index, IndexDamaged if no generation is intact."""
    skip = skip or {}
    directory = Path(directory)
    if not index_exists(directory):
        raise IndexNotFound(f"no index at {directory}; build one with `rag ingest PATH --index {directory}`")
    live = current_name(directory)
    candidates = generations(directory)
    if live is not None:
        # Never a newer one: it was not published (an ingest stopped before its end).
        candidates = [g for g in candidates if number(g) <= int(live[4:])]
    notes: list[str] = []
    if live is None:
        notes.append("CURRENT does not name a generation")
    elif not (directory / live).is_dir():
        notes.append(f"CURRENT names {live}, which is missing")
    for generation in candidates:
        trouble = skip.get(generation.name) or problem(generation, full=full)
        if trouble is None:
            if notes:
                notes.append(f"answering from {generation.name}, the index as it was before the last change; "
                             f"repair it with `rag ingest --rebuild PATH --index {directory}`")
            return Chosen(generation, tuple(notes))
        notes.append(f"{generation.name}: {trouble}")
    raise IndexDamaged(f"{directory}: no intact index generation ({'; '.join(notes) or 'none found'}); "
                       f"rebuild it with `rag ingest --rebuild PATH --index {directory}`")


def next_name(directory: Path) -> str:
    """The name of a new generation, after every existing one."""
    return f"gen-{max((number(g) for g in generations(directory)), default=0) + 1:06d}"


def publish(directory: Path, generation: Path) -> None:
    """Make ``generation`` (complete and synced) the live one, atomically."""
    tmp = directory / "CURRENT.tmp"
    tmp.write_text(generation.name + "\n", encoding="utf-8")
    fsync_file(tmp)
    os.replace(tmp, directory / "CURRENT")
    fsync_dir(directory)


def remove_others(directory: Path, keep: set[str]) -> None:
    """Remove every generation folder but ``keep``: leftovers of interrupted
    writes and generations older than the one kept to fall back to."""
    for generation in Path(directory).glob("gen-*"):
        if generation.name not in keep and generation.is_dir():
            shutil.rmtree(generation, ignore_errors=True)


def open_lock_file(path: Path) -> int:
    """A descriptor of the lock file ``path`` (created, mode 0600), never
    opened through a symbolic link. A link or an empty folder found there
    (left by hand or by a tool: no process holds a lock through either) is
    replaced by a fresh file, atomically; anything else there is an
    IndexDamaged naming the path and what to do."""
    path = Path(path)
    for _ in range(3):  # another process may replace it at the same moment: then its file is opened
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.EACCES, errno.EPERM):
                raise
            if exc.errno in (errno.EACCES, errno.EPERM) and not _link_or_folder(path):
                raise PermissionError(exc.errno, f"cannot open the lock file {path}: permission denied; give this "
                                                 f"user write access to {path.parent} and {path}, or run as their "
                                                 "owner", str(path)) from None
            _replace_odd_lock(path, exc)
    raise IndexDamaged(f"{path} is not a lock file and could not be replaced; remove it and try again")


def _link_or_folder(path: Path) -> bool:
    """Whether ``path`` is a symbolic link or a folder (a permission error
    on anything else, or on a missing file in an unwritable folder, is just
    that: not a lock file to replace)."""
    try:
        mode = path.lstat().st_mode
    except OSError:
        return False
    return stat.S_ISLNK(mode) or stat.S_ISDIR(mode)


def _replace_odd_lock(path: Path, exc: OSError) -> None:
    """Put a fresh lock file where ``path`` is a symbolic link or an empty
    folder; IndexDamaged for anything else."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return  # gone meanwhile: opened afresh
    if stat.S_ISLNK(info.st_mode):
        fresh = path.with_name(f"{path.name}.{os.getpid()}.new")
        os.close(os.open(fresh, os.O_RDWR | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600))
        os.replace(fresh, path)  # the link goes and the file comes in one step
        return
    if stat.S_ISDIR(info.st_mode):
        try:
            os.rmdir(path)  # only an empty one: nothing in it is lost
            return
        except OSError:
            raise IndexDamaged(f"{path} is a folder, not a lock file; remove it (rm -r '{path}') "
                               "and try again") from None
    raise IndexDamaged(f"{path} cannot be used as a lock file ({exc.strerror or exc}); remove it "
                       "and try again") from None


@contextlib.contextmanager
def write_lock(directory: Path) -> Iterator[None]:
    """Hold the index's write lock (IndexBusy if another process holds it;
    see :func:`open_lock_file` for a lock file that is not a file)."""
    fd = open_lock_file(Path(directory) / ".lock")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise IndexBusy(f"{directory}: another process is writing this index; wait for it to finish") from None
        yield
    finally:
        os.close(fd)  # releases the lock


def fsync_file(path: Path) -> None:
    """Flush a file's data to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def verify(directory: Path) -> dict[str, object]:
    """Every generation of ``directory`` checked in full (sizes and
    checksums): ``{"live": name, "generations": {name: "ok" or the problem}}``."""
    return {"live": current_name(directory),
            "generations": {g.name: problem(g, full=True) or "ok" for g in generations(directory)}}

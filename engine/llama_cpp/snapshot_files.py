"""KV snapshots on disk: the file format, and the folder of them one or
several processes share.

A file is ``RBKV`` + a little-endian u32 header length + a JSON header
(format, key, token count, state bytes, CRC-32 of the state, and the cache
scope of the prompt it holds) + the tokens (int32) + the state bytes:
nothing is unpickled, and a file whose bytes do not match its header is
deleted, never handed to the engine. A file written before snapshots had
scopes has none in its header: it is read back as of no known scope
(``None``), which no prompt's scope matches (see ``snapshots``). A file is
written under a temporary name and renamed into place, so a reader in any
process sees a whole file or none; a file may vanish or be replaced between
any two calls (another process evicted or rewrote it), and that is a miss,
never an error.

Does not: hold snapshots in RAM, run threads, or lock (``snapshots``
calls this with its lock held, and reads files outside it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import threading
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = b"RBKV"
FORMAT = 2  # 2: the header holds a CRC-32 of the state bytes
STALE_TMP_S = 3600.0  # a temporary file this old was left by a process that died while writing it
MAX_HEADER_BYTES = 1 << 16
log = logging.getLogger("rag_budget.cache")


@dataclass(frozen=True)
class Snapshot:
    """An engine state and the tokens it holds, in order."""

    tokens: np.ndarray  # int32, the tokens whose KV the state holds
    data: bytes | bytearray  # the engine's own state bytes (as saved: not copied again, never changed)
    # Whose prompt it holds (``engine.backend``, cache scopes): "" the local user's; None: not known (a
    # file written before snapshots had scopes), so no prompt's scope is its.
    scope: str | None = ""

    @property
    def nbytes(self) -> int:
        """Bytes this snapshot takes in memory."""
        return len(self.data) + self.tokens.nbytes


@dataclass
class DiskEntry:
    """One snapshot file as the folder knows it, without its state bytes."""

    path: Path
    tokens: np.ndarray
    nbytes: int
    inode: int = 0  # of the file this entry describes: one another process put in its place is not ours to drop
    scope: str | None = ""  # as its header says (None: a file written before snapshots had scopes)


class SnapshotFolder:
    """The snapshot files in one folder, by key, least recently used first
    (``entries``), within ``max_bytes``; what other processes wrote or
    evicted is taken in on :meth:`refresh`. Not thread safe: its owner locks."""

    def __init__(self, folder: Path, max_bytes: int) -> None:
        self.folder, self.max_bytes = Path(folder), max_bytes
        self.entries: OrderedDict[str, DiskEntry] = OrderedDict()
        self.evictions = 0
        self._seen_ns = -1  # the folder's mtime when last scanned: another process's write changes it
        self.scan()

    @property
    def nbytes(self) -> int:
        """Bytes of the files known."""
        return sum(e.nbytes for e in self.entries.values())

    def path_of(self, key: str) -> Path:
        """The file ``key``'s snapshot is written to."""
        return self.folder / (hashlib.sha256(key.encode("utf-8")).hexdigest()[:32] + ".kv")

    def add(self, key: str, entry: DiskEntry) -> None:
        """Count a file just written as the most recently used, evicting the oldest beyond ``max_bytes``."""
        self.entries.pop(key, None)
        self.entries[key] = entry
        self.evict()

    def evict(self) -> None:
        """Delete the least recently used files until the folder is within ``max_bytes``."""
        total = self.nbytes
        for key in list(self.entries):
            if total <= self.max_bytes:
                break
            total -= self.entries[key].nbytes
            self.drop(key)
            self.evictions += 1

    def drop(self, key: str) -> None:
        """Forget ``key`` and delete its file (unless another process has put a newer one there)."""
        entry = self.entries.pop(key, None)
        if entry is not None:
            try:
                if not entry.inode or entry.path.stat().st_ino == entry.inode:
                    entry.path.unlink()
            except OSError:
                pass

    def refresh(self) -> None:
        """Take in what other processes wrote or evicted since the last look
        (one stat when nothing changed)."""
        try:
            changed = self.folder.stat().st_mtime_ns != self._seen_ns
        except OSError:
            changed = False
        if changed:
            self.scan()

    def scan(self) -> None:
        """Index the folder's files: new ones (ours or another process's)
        read by header, gone ones forgotten, orphaned temporary files of a
        process that died while writing removed."""
        try:
            self._seen_ns = self.folder.stat().st_mtime_ns
            names = os.listdir(self.folder)
        except OSError:
            return
        present = {n for n in names if n.endswith(".kv")}
        for key in [k for k, e in self.entries.items() if e.path.name not in present]:
            self.entries.pop(key)
        known = {e.path.name for e in self.entries.values()}
        found: list[tuple[float, str, DiskEntry]] = []
        for name in sorted(present - known):
            path = self.folder / name
            head = read_header(path)
            if head is None:
                continue
            key, tokens, scope = head
            try:
                st = path.stat()
            except OSError:
                continue
            found.append((st.st_mtime, key, DiskEntry(path, tokens, st.st_size, st.st_ino, scope)))
        for _, key, entry in sorted(found, key=lambda f: f[0]):
            self.entries.pop(key, None)
            self.entries[key] = entry
        now = time.time()
        for name in names:
            if name.endswith(".tmp"):
                try:
                    if now - os.stat(self.folder / name).st_mtime > STALE_TMP_S:
                        os.unlink(self.folder / name)
                except OSError:
                    pass
        self.evict()


def write_file(path: Path, key: str, snapshot: Snapshot) -> DiskEntry | None:
    """Write ``snapshot``'s file at ``path`` atomically; its entry, or None
    when the disk refused (a full or read-only disk loses a cache entry,
    nothing else)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # The format stays 2, the scope an optional field: this release reads an older one's files as of
        # no known scope (neither deleted as damaged nor reused), and an older process sharing the
        # folder reads these as before, scope ignored (the engine README: upgrade them together).
        header = json.dumps({"format": FORMAT, "key": key, "n_tokens": len(snapshot.tokens),
                             "data_bytes": len(snapshot.data), "crc32": zlib.crc32(snapshot.data),
                             **({"scope": snapshot.scope} if snapshot.scope is not None else {})}).encode("utf-8")
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            with open(tmp, "wb") as fh:
                fh.write(MAGIC + struct.pack("<I", len(header)) + header)
                fh.write(snapshot.tokens.astype("<i4").tobytes())
                fh.write(snapshot.data)
                inode = os.fstat(fh.fileno()).st_ino
            os.replace(tmp, path)  # readers in any process see the old file or this one, never a part
        finally:
            if tmp.exists():
                tmp.unlink()
    except OSError:
        return None
    # Its size from what was written: another process may have evicted it already.
    size = 8 + len(header) + snapshot.tokens.size * 4 + len(snapshot.data)
    return DiskEntry(path, snapshot.tokens.copy(), size, inode, snapshot.scope)


def read_file(path: Path, *, data: bool) -> tuple[str, np.ndarray, bytes | None, str | None] | None:
    """The key, tokens, (with ``data``) state bytes and cache scope of a
    snapshot file (None for a file written before snapshots had scopes), or
    None if it is not one or is damaged (then it is deleted, with one line
    in the log: a cache entry is only ever recomputed, never trusted)."""
    inode = None
    try:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())  # the file opened, whatever is renamed over its name meanwhile
            total, inode = st.st_size, st.st_ino
            if fh.read(4) != MAGIC:
                raise ValueError("not a snapshot file")
            (size,) = struct.unpack("<I", fh.read(4))
            if size > MAX_HEADER_BYTES:
                raise ValueError(f"a header of {size} bytes")
            header = json.loads(fh.read(size))
            if not isinstance(header, dict) or header.get("format") != FORMAT:
                raise ValueError("not a snapshot header of this format")
            n, d = header.get("n_tokens"), header.get("data_bytes")
            if not isinstance(n, int) or not isinstance(d, int) or n < 0 or d < 0 or \
                    8 + size + 4 * n + d != total or not isinstance(header.get("key"), str):
                raise ValueError("its header does not match its size")
            scope = header.get("scope")
            if scope is not None and not isinstance(scope, str):
                raise ValueError("its scope is not a string")
            raw = fh.read(4 * n)
            state = fh.read(d) if data else None
            if len(raw) != 4 * n or (state is not None and len(state) != d):
                raise ValueError("it is shorter than its header says")
            if state is not None and zlib.crc32(state) != header.get("crc32"):
                raise ValueError("its state bytes do not match their checksum")
            return header["key"], np.frombuffer(raw, dtype="<i4").astype(np.int32), state, scope
    except FileNotFoundError:
        return None
    except (OSError, ValueError, struct.error, UnicodeDecodeError, MemoryError, RecursionError) as exc:
        # RecursionError: a header of deeply nested brackets (issue 27).
        log.warning("dropped a damaged KV snapshot %s (%s)", path, exc)
        try:
            if inode is None or path.stat().st_ino == inode:  # not a good file another process put there since
                path.unlink()
        except OSError:
            pass
        return None


def read_header(path: Path) -> tuple[str, np.ndarray, str | None] | None:
    """The key, tokens and cache scope (None: not known) of a snapshot file,
    or None if it is not one."""
    found = read_file(path, data=False)
    return None if found is None else (found[0], found[1], found[3])


def read_snapshot(path: Path) -> Snapshot | None:
    """A whole snapshot file (its scope None when it names none), or None if it is damaged."""
    found = read_file(path, data=True)
    return None if found is None or found[2] is None else Snapshot(found[1], found[2], found[3])


def touch(path: Path) -> None:
    """Mark ``path`` as the most recently used, for every process's eviction
    (one already gone is no error: it is a miss at the next look)."""
    try:
        os.utime(path)
    except OSError:
        pass


def unlink_quietly(path: Path) -> None:
    """Delete ``path``; one already gone (or not ours to delete) is no error."""
    try:
        path.unlink()
    except OSError:
        pass

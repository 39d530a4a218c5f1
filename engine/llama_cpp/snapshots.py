"""KV-cache snapshots kept across requests: a byte-bounded LRU in RAM, and
optionally on disk.

An engine holds one KV cache; when two conversations take turns, each
overwrites the other's. A snapshot is the engine's saved state for a token
sequence, so a conversation that comes back finds its prefix again instead
of prefilling it. Snapshots are stored under a key (one per conversation:
a newer state replaces the older one) and found by the longest common token
prefix with a new prompt, so a new conversation finds the shared system
prompt's snapshot.

Disk files are ``RBKV`` + a JSON header (with a CRC-32 of the state) + the
tokens (int32) + the state bytes: nothing is unpickled, and a file whose
bytes do not match is dropped, never handed to the engine. They survive a
restart of the process; the engine must check that a snapshot belongs to it
(the directory is per model and context, see the backend).

Disk writes happen on a writer thread of the cache's own: ``put`` returns as
soon as the snapshot is in RAM, so the engine's loop (which saves a state
after each answer, tens of MB) never waits for the disk. A snapshot waiting
to be written is found like one on disk, and the writes still pending when
the process exits are finished first. The writes waiting count against the
RAM cap with the snapshots in RAM: when the disk is slower than answers the
oldest waiting writes give way (counted in ``disk_dropped``), so memory
stays within the cap however many keys come.

Disk reads happen on a reader thread of the cache's own, outside the
cache's lock (the planners' ``best`` never waits behind a read):
``read_ahead`` starts one and returns, so the engine's loop can place other
work until the snapshot is in RAM; ``get`` of a snapshot only the disk
holds waits for its read. A snapshot read back is also held apart until
the next ``get`` of its key takes it (or a put or discard of the key makes
it stale), so puts that evict RAM meanwhile cannot send the loop back to
the disk, and one too large for RAM is read ahead too; what is held apart
and not in RAM stays within ``max_bytes`` (the newest always kept).

Several processes may share the folder (the service, the resident server,
``--no-server`` runs): a file is written under a temporary name and renamed
into place, so a reader sees a whole file or none; a file may vanish or be
replaced between any two calls (another process evicted or rewrote it), and
that is a miss, never an error; each process sees the others' files when the
folder changes, and evicts by the same LRU over all of them.

Does not: talk to an engine (the backend saves and restores the bytes).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import struct
import threading
import time
import weakref
import zlib
from collections import OrderedDict, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..tokens import common_prefix

MAGIC = b"RBKV"
FORMAT = 2  # 2: the header holds a CRC-32 of the state bytes
log = logging.getLogger("rag_budget.cache")


@dataclass(frozen=True)
class Snapshot:
    """An engine state and the tokens it holds, in order."""

    tokens: np.ndarray  # int32, the tokens whose KV the state holds
    data: bytes | bytearray  # the engine's own state bytes (as saved: not copied again, never changed)

    @property
    def nbytes(self) -> int:
        """Bytes this snapshot takes in memory."""
        return len(self.data) + self.tokens.nbytes


@dataclass
class _DiskEntry:
    path: Path
    tokens: np.ndarray
    nbytes: int
    inode: int = 0  # of the file this entry describes: one another process put in its place is not ours to drop


class _Read:
    """A disk read asked of the reader thread: the entry read, and once
    ``done``, the snapshot (None: gone or damaged)."""

    def __init__(self, key: str, entry: _DiskEntry) -> None:
        self.key, self.entry = key, entry
        self.done, self.snapshot = False, None


class SnapshotCache:
    """Snapshots by key, at most ``max_bytes`` in RAM and, with ``disk_dir``,
    at most ``disk_max_bytes`` on disk; the least recently used go first.
    The writes waiting for the disk count against ``max_bytes`` too (the
    newest one is always kept, however large).

    Pinned snapshots (the system prompt's) are never evicted from RAM. Thread
    safe.
    """

    def __init__(self, max_bytes: int = 512 << 20, disk_dir: Path | None = None, disk_max_bytes: int = 2 << 30) -> None:
        if max_bytes < 0 or disk_max_bytes < 0:
            raise ValueError("snapshot cache sizes must be >= 0 bytes")
        self.max_bytes = max_bytes
        self.disk_dir = Path(disk_dir) if disk_dir else None
        self.disk_max_bytes = disk_max_bytes
        self._ram: OrderedDict[str, Snapshot] = OrderedDict()  # oldest first
        self._pinned: set[str] = set()
        self._disk: OrderedDict[str, _DiskEntry] = OrderedDict()
        self._lock = threading.RLock()
        self._written = threading.Condition(self._lock)  # a pending write finished
        self._pending: OrderedDict[str, Snapshot] = OrderedDict()  # key -> snapshot to write, oldest first
        # Key -> whether the write in flight is still its newest (a put or discard since makes it stale).
        self._in_flight: dict[str, bool] = {}
        self._writer: threading.Thread | None = None
        self._landed = threading.Condition(self._lock)  # a read finished
        self._reads: dict[str, _Read] = {}  # key -> its read, asked or running
        self._read_queue: deque[_Read] = deque()
        # Key -> a snapshot read back and not yet taken by ``get``, oldest first (see ``_keep_read_back``).
        self._read_back: OrderedDict[str, Snapshot] = OrderedDict()
        self._reader: threading.Thread | None = None
        self.evictions = 0
        self.disk_evictions = 0
        self.disk_dropped = 0  # writes given up because the disk was slower than puts
        self._seen_ns = -1  # the folder's mtime when last scanned: another process's write changes it
        if self.disk_dir is not None:
            self._scan_disk()

    # -- what is held ------------------------------------------------------

    @property
    def ram_bytes(self) -> int:
        """Bytes held in RAM."""
        with self._lock:
            return sum(s.nbytes for s in self._ram.values())

    @property
    def disk_bytes(self) -> int:
        """Bytes held on disk, once the writes pending now have landed."""
        self.flush()
        with self._lock:
            return sum(e.nbytes for e in self._disk.values())

    def entries(self) -> int:
        """Distinct keys held in RAM, on disk or waiting to be written (no
        file is read)."""
        with self._lock:
            return len(self._ram.keys() | self._disk.keys() | self._pending.keys() | self._read_back.keys())

    def keys(self) -> list[str]:
        """Keys held in RAM, least recently used first."""
        with self._lock:
            return list(self._ram)

    def disk_keys(self) -> list[str]:
        """Keys held on disk, least recently used first, once the writes
        pending now have landed."""
        self.flush()
        with self._lock:
            return list(self._disk)

    def flush(self, timeout: float | None = 60.0) -> bool:
        """Wait until every disk write asked for so far has landed (or
        ``timeout`` seconds passed); whether none is left pending."""
        with self._written:
            return self._written.wait_for(lambda: not self._pending and not self._in_flight, timeout)

    def _waiting_bytes(self) -> int:
        """Bytes kept alive only for their write (not in RAM)."""
        return sum(s.nbytes for k, s in self._pending.items() if k not in self._ram)

    def stats(self) -> dict[str, int]:
        """Entries and bytes in RAM and on disk (written so far; the writes
        still pending are counted apart), and evictions so far."""
        with self._lock:
            return {
                "ram_entries": len(self._ram), "ram_bytes": self.ram_bytes, "ram_max_bytes": self.max_bytes,
                "disk_entries": len(self._disk), "disk_bytes": sum(e.nbytes for e in self._disk.values()),
                "disk_pending": len(self._pending) + len(self._in_flight),
                "disk_pending_bytes": self._waiting_bytes(), "disk_dropped": self.disk_dropped,
                "evictions": self.evictions, "disk_evictions": self.disk_evictions,
            }

    # -- lookup --------------------------------------------------------------

    def holds(self, key: str) -> bool:
        """Whether ``key`` is held in RAM or on disk (nothing is read)."""
        with self._lock:
            if key in self._ram or key in self._pending or key in self._read_back:
                return True
            self._refresh()
            return key in self._disk

    def pinned(self) -> Snapshot | None:
        """The most recently kept pinned snapshot in RAM (the system prompt's), or None."""
        with self._lock:
            for key in reversed(self._ram):
                if key in self._pinned:
                    return self._ram[key]
        return None

    def best(self, tokens: Sequence[int] | np.ndarray) -> tuple[str | None, int]:
        """The key of the snapshot sharing the longest prefix with
        ``tokens``, and that prefix's length (``(None, 0)`` if none does)."""
        wanted = np.asarray(tokens, dtype=np.int32)
        best_key, best_n = None, 0
        with self._lock:
            self._refresh()
            for key, snap in self._ram.items():
                n = common_prefix(snap.tokens, wanted)
                if n > best_n:
                    best_key, best_n = key, n
            for key, entry in self._disk.items():
                n = common_prefix(entry.tokens, wanted)
                if n > best_n:
                    best_key, best_n = key, n
            for key, snap in self._pending.items():
                n = common_prefix(snap.tokens, wanted)
                if n > best_n:
                    best_key, best_n = key, n
        return best_key, best_n

    def get(self, key: str) -> Snapshot | None:
        """The snapshot under ``key``, now the most recently used: one read
        back ahead (taken: the next get finds it in RAM or reads again), or
        in RAM, or read back from disk when only the disk holds it (by the
        reader thread, outside the lock: this waits for that read)."""
        with self._lock:
            snap = self._take_read_back(key)
            if snap is not None:
                return snap
            read = self._ask_read(key)
            if read is None:
                return None
            # 600 s: a hang guard only (the reader finishes every read it takes, found or not).
            self._landed.wait_for(lambda: read.done, 600.0)
            return self._take_read_back(key) or read.snapshot  # a put meanwhile is newer than the file

    def read_ahead(self, key: str | None) -> bool:
        """Whether ``get(key)`` answers now without waiting for the disk; if
        only the disk holds ``key``, its read is started on the reader
        thread first (and this returns False at once). The snapshot read is
        held for that ``get`` whatever the RAM cap evicts meanwhile, one
        too large for RAM included."""
        if key is None:
            return True
        with self._lock:
            if key in self._read_back or self._held(key) is not None:
                return True
            if key in self._reads:
                return False  # its read is under way
            return self._ask_read(key) is None

    def _take_read_back(self, key: str) -> Snapshot | None:
        """The snapshot read back ahead for ``key`` (no longer held apart),
        else the one held in RAM or waiting to be written, or None. Called
        with the lock held."""
        snap = self._read_back.pop(key, None)
        if snap is None:
            return self._held(key)
        if key in self._ram:
            self._ram.move_to_end(key)
        if key in self._disk:
            self._disk.move_to_end(key)
        return snap

    def _keep_read_back(self, key: str, snap: Snapshot) -> None:
        """Hold ``snap``, just read back, until ``get(key)`` takes it. Those
        not also in RAM are brought within ``max_bytes``, the oldest dropped first
        (the newest always kept: it may be one too large for RAM), so reads
        asked for and never taken (a request cancelled) cannot pile up.
        Called with the lock held."""
        self._read_back.pop(key, None)
        self._read_back[key] = snap
        apart = sum(s.nbytes for k, s in self._read_back.items() if self._ram.get(k) is not s)
        for old in list(self._read_back)[:-1]:
            if apart <= self.max_bytes:
                return
            held = self._read_back[old]
            if self._ram.get(old) is not held:  # (one still in RAM costs nothing apart)
                del self._read_back[old]
                apart -= held.nbytes

    def _held(self, key: str) -> Snapshot | None:
        """The snapshot under ``key`` in RAM or waiting to be written (now the
        most recently used), or None. Called with the lock held."""
        snap = self._ram.get(key)
        if snap is not None:
            self._ram.move_to_end(key)
            if key in self._disk:
                self._disk.move_to_end(key)
            return snap
        return self._pending.get(key)  # too large for RAM (or pushed out of it), and not written yet

    def _ask_read(self, key: str) -> _Read | None:
        """The read of ``key``'s file, started if it was not; None when the
        disk does not hold it. Called with the lock held."""
        read = self._reads.get(key)
        if read is not None:
            return read
        self._refresh()
        entry = self._disk.get(key)
        if entry is None:
            return None
        read = self._reads[key] = _Read(key, entry)
        self._read_queue.append(read)
        if self._reader is None:
            self._reader = threading.Thread(
                target=_serve_jobs, name="rag-kv-reader", daemon=True,
                args=(weakref.ref(self), SnapshotCache._next_read, SnapshotCache._read_one,
                      lambda read: f"reading KV snapshot {read.key}"))
            self._reader.start()
        self._landed.notify_all()
        return read

    def _next_read(self, wait_s: float) -> _Read | None:
        """The oldest read asked for (None: none came in ``wait_s``)."""
        with self._landed:
            if not self._landed.wait_for(lambda: self._read_queue, wait_s):
                return None
            return self._read_queue.popleft()

    def _read_one(self, read: _Read) -> None:
        """Read and check one file outside the lock, then keep it in RAM
        unless the key was put, discarded or replaced on disk meanwhile."""
        snap = None
        try:
            snap = _read(read.entry.path)
            if snap is not None:
                try:
                    os.utime(read.entry.path)  # most recently used, for the other processes' eviction too
                except OSError:
                    pass
        finally:
            with self._landed:
                current = self._disk.get(read.key) is read.entry
                if snap is None and current:  # gone (another process evicted it) or damaged (then deleted): a miss
                    self._disk.pop(read.key, None)
                elif snap is not None and current and read.key not in self._ram and read.key not in self._pending:
                    self._disk.move_to_end(read.key)
                    if snap.nbytes <= self.max_bytes:
                        self._ram[read.key] = snap
                        self._evict()
                    self._keep_read_back(read.key, snap)  # for the get it was read for, whatever puts evict
                read.snapshot, read.done = snap, True
                if self._reads.get(read.key) is read:
                    del self._reads[read.key]
                self._landed.notify_all()

    # -- storing -------------------------------------------------------------

    def put(self, key: str, snapshot: Snapshot, *, pin: bool = False) -> None:
        """Keep ``snapshot`` under ``key`` (replacing what was there), as the
        most recently used; written to disk too when there is a disk
        directory (by the writer thread: this returns without waiting for
        the disk). A snapshot larger than the RAM cap is kept on disk only."""
        with self._lock:
            self._ram.pop(key, None)
            self._pending.pop(key, None)
            self._read_back.pop(key, None)  # an older state
            if key in self._in_flight:
                self._in_flight[key] = False  # the write in flight now is of an older state
            if pin:
                self._pinned.add(key)
            if snapshot.nbytes <= self.max_bytes or pin:
                self._ram[key] = snapshot
            if self.disk_dir is not None and snapshot.nbytes <= self.disk_max_bytes:
                self._pending[key] = snapshot
                self._start_writer()
                self._written.notify_all()
            self._evict()

    def discard(self, key: str) -> None:
        """Forget the snapshot under ``key`` in RAM and on disk."""
        with self._lock:
            self._ram.pop(key, None)
            self._pinned.discard(key)
            self._pending.pop(key, None)
            self._read_back.pop(key, None)
            if key in self._in_flight:
                self._in_flight[key] = False  # its file is removed once written
            self._drop_disk(key)

    def _evict(self) -> None:
        """Keep the snapshots in RAM and the writes waiting (not in RAM)
        within ``max_bytes``: the least recently used in RAM go first (a
        waiting one still waits for its write), then the oldest waiting
        writes, never the newest. Called with the lock held."""
        ram = sum(s.nbytes for s in self._ram.values())
        waiting = self._waiting_bytes()
        for key in list(self._ram):
            if ram + waiting <= self.max_bytes:
                return
            if key in self._pinned:
                continue
            gone = self._ram.pop(key).nbytes
            ram -= gone
            if key in self._pending:
                waiting += gone
            self.evictions += 1
        for key in list(self._pending)[:-1]:
            if ram + waiting <= self.max_bytes:
                return
            if key not in self._ram:
                waiting -= self._pending.pop(key).nbytes
                self.disk_dropped += 1

    # -- disk ----------------------------------------------------------------

    def _file(self, key: str) -> Path:
        assert self.disk_dir is not None
        return self.disk_dir / (hashlib.sha256(key.encode("utf-8")).hexdigest()[:32] + ".kv")

    def _start_writer(self) -> None:
        if self._writer is None:
            self._writer = threading.Thread(
                target=_serve_jobs, name="rag-kv-writer", daemon=True,
                args=(weakref.ref(self), SnapshotCache._next_write, lambda cache, job: cache._write_one(*job),
                      lambda job: f"writing KV snapshot {job[0]}"))
            self._writer.start()
            atexit.register(_flush_at_exit, weakref.ref(self))

    def _next_write(self, wait_s: float) -> tuple[str, Snapshot] | None:
        """The oldest pending write, now in flight (None: none came in ``wait_s``)."""
        with self._written:
            if not self._written.wait_for(lambda: self._pending, wait_s):
                return None
            key, snapshot = self._pending.popitem(last=False)
            self._in_flight[key] = True
            return key, snapshot

    def _write_one(self, key: str, snapshot: Snapshot) -> None:
        """Write one snapshot, then count it on disk unless it was replaced
        or discarded meanwhile (a discarded one's file is removed)."""
        written = None
        try:
            written = self._write_file(key, snapshot)
        finally:
            with self._written:
                current = self._in_flight.pop(key, False)
                if written is not None and current:
                    self._disk.pop(key, None)
                    self._disk[key] = written
                    self._evict_disk()
                elif written is not None and key not in self._pending and key not in self._ram:
                    _unlink(written.path)  # discarded while it was written
                self._written.notify_all()

    def _write_file(self, key: str, snapshot: Snapshot) -> _DiskEntry | None:
        """Write ``snapshot``'s file atomically; its entry, or None when the
        disk refused (a full or read-only disk loses a cache entry, nothing else)."""
        path = self._file(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            header = json.dumps({"format": FORMAT, "key": key, "n_tokens": len(snapshot.tokens),
                                 "data_bytes": len(snapshot.data), "crc32": zlib.crc32(snapshot.data)}).encode("utf-8")
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
        return _DiskEntry(path, snapshot.tokens.copy(), size, inode)

    def _evict_disk(self) -> None:
        total = sum(e.nbytes for e in self._disk.values())
        for key in list(self._disk):
            if total <= self.disk_max_bytes:
                break
            total -= self._disk[key].nbytes
            self._drop_disk(key)
            self.disk_evictions += 1

    def _drop_disk(self, key: str) -> None:
        entry = self._disk.pop(key, None)
        if entry is not None:
            try:
                if not entry.inode or entry.path.stat().st_ino == entry.inode:
                    entry.path.unlink()  # (a newer file another process wrote since is its to keep)
            except OSError:
                pass

    def _refresh(self) -> None:
        """Take in what other processes wrote or evicted since the last look
        (one stat when nothing changed)."""
        if self.disk_dir is None:
            return
        try:
            changed = self.disk_dir.stat().st_mtime_ns != self._seen_ns
        except OSError:
            changed = False
        if changed:
            self._scan_disk()

    def _scan_disk(self) -> None:
        """Index the folder's files: new ones (ours or another process's)
        read by header, gone ones forgotten, orphaned temporary files of a
        process that died while writing removed."""
        assert self.disk_dir is not None
        try:
            self._seen_ns = self.disk_dir.stat().st_mtime_ns
            names = os.listdir(self.disk_dir)
        except OSError:
            return
        present = {n for n in names if n.endswith(".kv")}
        for key in [k for k, e in self._disk.items() if e.path.name not in present]:
            self._disk.pop(key)
        known = {e.path.name for e in self._disk.values()}
        found: list[tuple[float, str, _DiskEntry]] = []
        for name in sorted(present - known):
            path = self.disk_dir / name
            head = _read_header(path)
            if head is None:
                continue
            key, tokens = head
            try:
                st = path.stat()
            except OSError:
                continue
            found.append((st.st_mtime, key, _DiskEntry(path, tokens, st.st_size, st.st_ino)))
        for _, key, entry in sorted(found, key=lambda f: f[0]):
            self._disk.pop(key, None)
            self._disk[key] = entry
        now = time.time()
        for name in names:
            if name.endswith(".tmp"):
                try:
                    if now - os.stat(self.disk_dir / name).st_mtime > STALE_TMP_S:
                        os.unlink(self.disk_dir / name)
                except OSError:
                    pass
        self._evict_disk()


def _serve_jobs(ref: "weakref.ref[SnapshotCache]", take: Callable, do: Callable, what: Callable[..., str]) -> None:
    """A worker thread of the cache (its writer, its reader): ``take`` its
    next job, oldest first, and ``do`` it, for as long as the cache lives
    (held weakly, so a dropped cache ends it). A job that fails is logged
    and the worker goes on: a write lost is a cache entry lost, a read that
    fails is a miss (``_read_one`` marks its read done whatever happens)."""
    while True:
        cache = ref()
        if cache is None:
            return
        job = take(cache, 1.0)
        if job is not None:
            try:
                do(cache, job)
            except Exception as exc:  # noqa: BLE001 - one job's failure, not the worker's
                log.warning("%s failed: %r", what(job), exc)
        del cache


def _flush_at_exit(ref: "weakref.ref[SnapshotCache]") -> None:
    cache = ref()
    if cache is not None:
        cache.flush(timeout=30.0)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


STALE_TMP_S = 3600.0  # a temporary file this old was left by a process that died while writing it
MAX_HEADER_BYTES = 1 << 16


def _read_file(path: Path, *, data: bool) -> tuple[str, np.ndarray, bytes | None] | None:
    """The key, tokens and (with ``data``) state bytes of a snapshot file,
    or None if it is not one or is damaged (then it is deleted, with one line
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
            raw = fh.read(4 * n)
            state = fh.read(d) if data else None
            if len(raw) != 4 * n or (state is not None and len(state) != d):
                raise ValueError("it is shorter than its header says")
            if state is not None and zlib.crc32(state) != header.get("crc32"):
                raise ValueError("its state bytes do not match their checksum")
            return header["key"], np.frombuffer(raw, dtype="<i4").astype(np.int32), state
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


def _read_header(path: Path) -> tuple[str, np.ndarray] | None:
    """The key and tokens of a snapshot file, or None if it is not one."""
    found = _read_file(path, data=False)
    return None if found is None else (found[0], found[1])


def _read(path: Path) -> Snapshot | None:
    """A whole snapshot file, or None if it is damaged."""
    found = _read_file(path, data=True)
    return None if found is None or found[2] is None else Snapshot(found[1], found[2])

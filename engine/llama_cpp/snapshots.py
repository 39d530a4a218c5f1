"""KV-cache snapshots kept across requests: a byte-bounded LRU in RAM, and
optionally on disk.

An engine holds one KV cache; when two conversations take turns, each
overwrites the other's. A snapshot is the engine's saved state for a token
sequence, so a conversation that comes back finds its prefix again instead
of prefilling it. Snapshots are stored under a key (one per conversation:
a newer state replaces the older one) and found by the longest common token
prefix with a new prompt, so a new conversation finds the shared system
prompt's snapshot.

Each snapshot holds the cache scope of the prompt it was saved after
(``engine.backend``, cache scopes: a holder's questions and conversations
are its own): ``best`` finds, for a prompt of one scope, only the
snapshots of that scope and the pinned ones (the system prompt's, which
every prompt shares), so no prompt is served, and so timed, from another
scope's state. A file written before snapshots had scopes is of no known
scope and found for none (a conversation it held is evaluated once again).

Disk files (their format and the folder's index: ``snapshot_files``) are
checked before the engine sees them and survive a restart of the process;
the engine must check that a snapshot belongs to it (the directory is per
model and context, see the backend).

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

Does not: talk to an engine (the backend saves and restores the bytes),
read or write a file itself (``snapshot_files``), or run its own thread
loop (``job_worker``).
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from collections import OrderedDict, deque
from pathlib import Path
from typing import Sequence

import numpy as np

from ..settings import DEFAULT_SNAPSHOT_DISK_BYTES, DEFAULT_SNAPSHOT_RAM_BYTES
from ..tokens import common_prefix
from . import snapshot_files
from .job_worker import start_worker
from .snapshot_files import MAGIC, DiskEntry, Snapshot, SnapshotFolder, unlink_quietly

__all__ = ["MAGIC", "Snapshot", "SnapshotCache"]
log = logging.getLogger("rag_budget.cache")


class _Read:
    """A disk read asked of the reader thread: the entry read, and once
    ``done``, the snapshot (None: gone or damaged)."""

    def __init__(self, key: str, entry: DiskEntry) -> None:
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

    def __init__(self, max_bytes: int = DEFAULT_SNAPSHOT_RAM_BYTES, disk_dir: Path | None = None,
                 disk_max_bytes: int = DEFAULT_SNAPSHOT_DISK_BYTES) -> None:
        if max_bytes < 0 or disk_max_bytes < 0:
            raise ValueError("snapshot cache sizes must be >= 0 bytes")
        self.max_bytes = max_bytes
        self.disk_dir = Path(disk_dir) if disk_dir else None
        self.disk_max_bytes = disk_max_bytes
        self._ram: OrderedDict[str, Snapshot] = OrderedDict()  # oldest first
        self._pinned: set[str] = set()
        self._folder = SnapshotFolder(self.disk_dir, disk_max_bytes) if self.disk_dir is not None else None
        # The folder's files by key, least recently used first (empty without a folder).
        self._disk: OrderedDict[str, DiskEntry] = self._folder.entries if self._folder else OrderedDict()
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
        self.disk_dropped = 0  # writes given up because the disk was slower than puts

    # -- what is held ------------------------------------------------------

    @property
    def disk_evictions(self) -> int:
        """Files deleted to keep the folder within ``disk_max_bytes``."""
        return self._folder.evictions if self._folder else 0

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

    def best(self, tokens: Sequence[int] | np.ndarray, scope: str = "") -> tuple[str | None, int]:
        """The key of the snapshot of cache ``scope`` (or pinned) sharing the
        longest prefix with ``tokens``, and that prefix's length (``(None,
        0)`` if none does).

        Does not: find another scope's snapshot, nor one of no known scope
        (a file written before scopes), however many tokens it shares: what
        a prompt shares with every other, the system prompt, is the pinned
        snapshot's and sequence 0's to give."""
        wanted = np.asarray(tokens, dtype=np.int32)
        best_key, best_n = None, 0
        with self._lock:
            self._refresh()
            held = [*self._ram.items(), *self._disk.items(), *self._pending.items()]
            for key, snap in held:
                if snap.scope != scope and key not in self._pinned:
                    continue
                n = common_prefix(snap.tokens, wanted)
                if n > best_n:
                    best_key, best_n = key, n
        return best_key, best_n

    def readable(self, key: str, snapshot: Snapshot, scope: str) -> bool:
        """Whether a prompt of cache ``scope`` may start from ``snapshot``,
        held under ``key``: one of its own scope, or pinned (the system
        prompt's). For the loader to check again what it got: the key may
        have been put again, by another scope, since ``best`` named it."""
        with self._lock:
            return snapshot.scope == scope or key in self._pinned

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
            self._reader = start_worker(self, "rag-kv-reader", SnapshotCache._next_read, SnapshotCache._read_one,
                                        lambda read: f"reading KV snapshot {read.key}")
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
            snap = snapshot_files.read_snapshot(read.entry.path)
            if snap is not None:
                snapshot_files.touch(read.entry.path)  # most recently used, for the other processes' eviction too
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

    def _start_writer(self) -> None:
        if self._writer is None:
            self._writer = start_worker(self, "rag-kv-writer", SnapshotCache._next_write,
                                        lambda cache, job: cache._write_one(*job),
                                        lambda job: f"writing KV snapshot {job[0]}")
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
                    self._folder.add(key, written)
                elif written is not None and key not in self._pending and key not in self._ram:
                    unlink_quietly(written.path)  # discarded while it was written
                self._written.notify_all()

    def _write_file(self, key: str, snapshot: Snapshot) -> DiskEntry | None:
        """Write ``snapshot``'s file (on the writer thread, outside the lock); its entry, or None."""
        return snapshot_files.write_file(self._folder.path_of(key), key, snapshot)

    def _drop_disk(self, key: str) -> None:
        if self._folder is not None:
            self._folder.drop(key)

    def _refresh(self) -> None:
        """Take in what other processes wrote or evicted since the last look."""
        if self._folder is not None:
            self._folder.refresh()


def _flush_at_exit(ref: "weakref.ref[SnapshotCache]") -> None:
    cache = ref()
    if cache is not None:
        cache.flush(timeout=30.0)

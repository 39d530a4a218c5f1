"""The snapshot LRU: byte caps, eviction order, pinning, the disk copy."""

from __future__ import annotations

import numpy as np
import pytest

from engine.llama_cpp.snapshots import Snapshot, SnapshotCache
from engine.tokens import common_prefix


def snap(tokens, size=100) -> Snapshot:
    return Snapshot(np.asarray(tokens, dtype=np.int32), bytes(size))


def test_common_prefix():
    a = np.array([1, 2, 3, 4], dtype=np.int32)
    assert common_prefix(a, np.array([1, 2, 9], dtype=np.int32)) == 2
    assert common_prefix(a, a[:2]) == 2
    assert common_prefix(a, np.array([], dtype=np.int32)) == 0


def test_ram_cap_evicts_least_recently_used_first():
    one = snap([1], 100).nbytes
    cache = SnapshotCache(max_bytes=3 * one)
    for key in "abc":
        cache.put(key, snap([1], 100))
    cache.get("a")  # a is now the most recent: b goes first
    cache.put("d", snap([1], 100))
    assert cache.keys() == ["c", "a", "d"]
    assert cache.ram_bytes <= cache.max_bytes
    assert cache.evictions == 1


def test_pinned_snapshots_are_never_evicted():
    one = snap([1], 100).nbytes
    cache = SnapshotCache(max_bytes=2 * one)
    cache.put("system", snap([1], 100), pin=True)
    for key in "abcd":
        cache.put(key, snap([2], 100))
    assert "system" in cache.keys() and cache.keys()[-1] == "d"
    assert cache.ram_bytes <= cache.max_bytes


def test_a_key_holds_one_snapshot_and_best_finds_the_longest_prefix():
    cache = SnapshotCache()
    cache.put("system", snap([1, 2]))
    cache.put("session:a", snap([1, 2, 3, 4]))
    cache.put("session:a", snap([1, 2, 3, 4, 5, 6]))  # replaces, not adds
    cache.put("session:b", snap([1, 2, 7]))
    assert len(cache.keys()) == 3
    assert cache.best([1, 2, 3, 4, 5, 6, 8]) == ("session:a", 6)
    assert cache.best([1, 2, 7, 7]) == ("session:b", 3)
    assert cache.best([9]) == (None, 0)


def test_disk_copy_survives_a_new_cache_and_respects_its_cap(tmp_path):
    one = snap([1, 2, 3], 1000)
    first = SnapshotCache(max_bytes=1 << 20, disk_dir=tmp_path, disk_max_bytes=2500)
    first.put("a", one)
    first.put("b", snap([4, 5], 1000))
    first.put("c", snap([6], 1000))  # over the disk cap: a, the oldest, goes
    assert first.disk_keys() == ["b", "c"]
    assert first.disk_bytes <= 2500
    again = SnapshotCache(max_bytes=1 << 20, disk_dir=tmp_path, disk_max_bytes=2500)
    assert sorted(again.disk_keys()) == ["b", "c"] and again.keys() == []
    assert again.best([4, 5, 9]) == ("b", 2)
    loaded = again.get("b")
    assert loaded is not None and loaded.data == bytes(1000) and list(loaded.tokens) == [4, 5]
    assert again.keys() == ["b"]  # read back into RAM


def test_damaged_disk_files_are_ignored(tmp_path):
    cache = SnapshotCache(disk_dir=tmp_path)
    cache.put("a", snap([1, 2], 50))
    assert cache.flush()
    (path,) = tmp_path.glob("*.kv")
    path.write_bytes(path.read_bytes()[:20])  # truncated by a crash
    (tmp_path / "junk.kv").write_bytes(b"not a snapshot")
    again = SnapshotCache(disk_dir=tmp_path)
    assert again.disk_keys() == []
    assert again.get("a") is None


def test_a_snapshot_over_the_ram_cap_lives_on_disk_only(tmp_path):
    cache = SnapshotCache(max_bytes=10, disk_dir=tmp_path)
    cache.put("big", snap([1], 100))
    assert cache.keys() == [] and cache.disk_keys() == ["big"]


def test_negative_caps_are_refused():
    with pytest.raises(ValueError):
        SnapshotCache(max_bytes=-1)


def _state_of(tokens: np.ndarray) -> bytes:
    """The state bytes a worker writes for ``tokens``: any reader can tell a torn or mixed one."""
    import hashlib

    return hashlib.sha256(tokens.tobytes()).digest() * (64 + int(tokens[0]) % 64)


def _hammer(folder: str, seed: int, rounds: int) -> None:
    """One process of the test below: puts, gets and evicts in the shared folder; prints its counts."""
    import json
    import random

    rng = random.Random(seed)
    cache = SnapshotCache(16 << 10, __import__("pathlib").Path(folder), disk_max_bytes=48 << 10)  # evicts all along
    hits = misses = 0
    for i in range(rounds):
        key = f"k{rng.randrange(12)}"  # both processes use the same keys
        if rng.random() < 0.5:
            tokens = np.arange(rng.randrange(1, 200), dtype=np.int32) + rng.randrange(1000)
            cache.put(key, Snapshot(tokens, _state_of(tokens)))
        else:
            cache.best(np.arange(50, dtype=np.int32))
            snap = cache.get(key)
            if snap is None:
                misses += 1
            else:
                assert snap.data == _state_of(snap.tokens), "a snapshot read back is not one that was written"
                hits += 1
        if i % 20 == 0:
            cache = SnapshotCache(16 << 10, cache.disk_dir, disk_max_bytes=48 << 10)  # as a new process would
    print(json.dumps({"hits": hits, "misses": misses}))


@pytest.mark.model  # starts rag in processes of its own, which load the models
def test_two_processes_sharing_the_cache_folder_never_read_a_torn_snapshot_or_fail(tmp_path):
    # The service, the resident server and --no-server runs share one folder: each writes, reads
    # and evicts while the others do; a file may vanish or be replaced between any two calls.
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = os.environ | {"PYTHONPATH": str(root)}
    code = "import sys; from tests.test_kv_snapshots import _hammer; _hammer(sys.argv[1], int(sys.argv[2]), 20000)"
    workers = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path), str(seed)], cwd=root, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for seed in (1, 2)]
    results = [w.communicate(timeout=600) for w in workers]
    for w, (out, err) in zip(workers, results):
        assert w.returncode == 0, err[-2000:]
    counts = [json.loads(out.strip().splitlines()[-1]) for out, _ in results]
    assert all(c["hits"] > 0 for c in counts), counts
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))  # no half-written file left


def test_a_cache_sees_what_another_process_wrote_and_evicted(tmp_path):
    ours, theirs = SnapshotCache(1 << 20, tmp_path), SnapshotCache(1 << 20, tmp_path)  # as two processes
    tokens = np.arange(40, dtype=np.int32)
    theirs.put("passage:a", Snapshot(tokens, b"state" * 10))
    assert theirs.flush()  # written by its writer thread
    assert ours.holds("passage:a") and ours.best(tokens) == ("passage:a", 40)
    assert ours.get("passage:a").data == b"state" * 10
    theirs.discard("passage:a")
    fresh = SnapshotCache(1 << 20, tmp_path)
    assert not fresh.holds("passage:a") and fresh.get("passage:a") is None


def _held_in_memory(cache: SnapshotCache) -> int:
    """Bytes of the distinct snapshots the cache keeps alive: those in RAM
    and those waiting for the writer (one object counted once)."""
    alive = {id(s): s.nbytes for s in cache._ram.values()}
    waiting = [v[1] if isinstance(v, tuple) else v for v in cache._pending.values()]  # (serial, snapshot) until issue 37
    alive |= {id(s): s.nbytes for s in waiting}
    return sum(alive.values())


def test_writes_waiting_for_a_slow_disk_stay_within_the_ram_cap(tmp_path, monkeypatch):
    # Exact segments get a key per prompt: with a disk slower than answers, the writes waiting
    # must not hold memory past the cap (the oldest waiting writes give way, and are counted).
    import threading

    gate, entered = threading.Event(), threading.Event()
    write_file = SnapshotCache._write_file

    def slow(self, key, snapshot):
        entered.set()
        assert gate.wait(60), "the test never opened the gate"
        return write_file(self, key, snapshot)

    monkeypatch.setattr(SnapshotCache, "_write_file", slow)
    one = snap([1, 2], 1000).nbytes
    cache = SnapshotCache(max_bytes=10 * one, disk_dir=tmp_path, disk_max_bytes=1 << 30)
    worst = 0
    try:
        cache.put("first", snap([1, 2], 1000))
        assert entered.wait(30)  # the writer holds the first one: every later put waits
        for i in range(200):
            cache.put(f"segment:{i}", snap([3, i], 1000))
            worst = max(worst, _held_in_memory(cache))
    finally:
        gate.set()
    assert worst <= cache.max_bytes, f"{worst} bytes held for {cache.max_bytes} allowed"
    assert cache.flush()
    stats = cache.stats()
    assert stats["disk_dropped"] >= 190 and stats["disk_entries"] <= 11
    assert cache.get("segment:199") is not None  # the newest is kept


def _per_key_entries(obj) -> int:
    """Entries of every per-key structure (dict or set) an object keeps."""
    return sum(len(v) for v in vars(obj).values() if isinstance(v, (dict, set)))


def test_the_cache_keeps_no_bookkeeping_for_keys_it_no_longer_holds(tmp_path):
    cache = SnapshotCache(max_bytes=1 << 20, disk_dir=tmp_path, disk_max_bytes=1 << 30)
    for i in range(300):
        cache.put(f"session:{i}", snap([i], 10))
        cache.discard(f"session:{i}")  # forgotten while (or before) it was written
    assert cache.flush()
    assert cache.keys() == [] and cache.disk_keys() == []
    assert _per_key_entries(cache) <= 2, {k: len(v) for k, v in vars(cache).items() if isinstance(v, (dict, set))}


def test_a_snapshot_read_back_from_disk_is_read_outside_the_cache_lock(tmp_path, monkeypatch):
    import threading

    from engine.llama_cpp import snapshot_files as snapshots

    writer = SnapshotCache(disk_dir=tmp_path)
    writer.put("a", snap([1, 2], 5000))
    assert writer.flush()
    cache = SnapshotCache(disk_dir=tmp_path)  # as after a restart: the disk only
    reads: list[tuple[str, bool]] = []
    read_file = snapshots.read_file

    def spy(path, *, data):
        if data:
            reads.append((threading.current_thread().name, cache._lock._is_owned()))
        return read_file(path, data=data)

    monkeypatch.setattr(snapshots, "read_file", spy)
    got = cache.get("a")
    assert got is not None and got.data == bytes(5000)
    assert reads == [("rag-kv-reader", False)]  # (thread, the lock held) of each read of the state
    assert cache.keys() == ["a"] and cache.read_ahead("a") is True  # in RAM now: nothing more to read
    cache.discard("a")
    writer.put("b", snap([3], 5000))
    assert writer.flush()
    assert cache.read_ahead("b") is False  # only the disk holds it: its read starts, on the reader
    assert cache.get("b") is not None and len(reads) == 2 and reads[-1] == ("rag-kv-reader", False)


def _count_reads(monkeypatch, cache, gate=None):
    """Each read of a state file: (thread, whether the cache lock was held); ``gate`` holds each read."""
    import threading

    from engine.llama_cpp import snapshot_files as snapshots

    reads: list[tuple[str, bool]] = []
    read_file = snapshots.read_file

    def spy(path, *, data):
        if data:
            reads.append((threading.current_thread().name, cache._lock._is_owned()))
            if gate is not None:
                gate.wait(60)
        return read_file(path, data=data)

    monkeypatch.setattr(snapshots, "read_file", spy)
    return reads


def _landed(cache) -> None:
    """Wait until no read the cache was asked for is under way (a guard, not a timing)."""
    with cache._landed:
        assert cache._landed.wait_for(lambda: not cache._reads and not cache._read_queue, 60)


def test_a_snapshot_read_ahead_is_kept_for_its_get_whatever_puts_evict_meanwhile(tmp_path, monkeypatch):
    one = snap([1, 2], 5000).nbytes
    writer = SnapshotCache(disk_dir=tmp_path)
    writer.put("a", snap([1, 2], 5000))
    assert writer.flush()
    # As after a restart: the disk alone holds "a"; room in RAM for one (its file, header and all), not two.
    cache = SnapshotCache(max_bytes=one + 1000, disk_dir=tmp_path)
    reads = _count_reads(monkeypatch, cache)
    assert cache.read_ahead("a") is False  # its read starts on the reader
    _landed(cache)
    assert cache.read_ahead("a") is True
    cache.put("b", snap([3], 5000))  # the loop saves a state meanwhile: "a" leaves RAM
    assert cache.keys() == ["b"] and cache.read_ahead("a") is True  # still here for its get
    got = cache.get("a")
    assert got is not None and got.data == bytes(5000)
    assert reads == [("rag-kv-reader", False)]  # read once, by the reader, never again
    assert not cache._read_back  # taken: nothing held apart any more


def test_a_snapshot_too_large_for_ram_is_read_ahead_by_the_reader_too(tmp_path, monkeypatch):
    import threading

    writer = SnapshotCache(disk_dir=tmp_path)
    writer.put("big", snap([1, 2], 50_000))
    assert writer.flush()
    cache = SnapshotCache(max_bytes=1000, disk_dir=tmp_path)  # far too small for it
    gate = threading.Event()
    reads = _count_reads(monkeypatch, cache, gate)
    try:
        assert cache.read_ahead("big") is False  # read ahead, not left for the caller's get
    finally:
        gate.set()
    _landed(cache)
    assert cache.read_ahead("big") is True and cache.keys() == []  # held for its get, not in RAM
    got = cache.get("big")
    assert got is not None and len(got.data) == 50_000
    assert reads == [("rag-kv-reader", False)]


def test_a_snapshot_read_ahead_is_dropped_when_its_key_is_replaced_or_discarded(tmp_path):
    writer = SnapshotCache(disk_dir=tmp_path)
    for key in "ab":
        writer.put(key, snap([1], 5000))
    assert writer.flush()
    cache = SnapshotCache(max_bytes=100, disk_dir=tmp_path)  # none fits RAM: each is held apart
    assert cache.read_ahead("a") is False and cache.read_ahead("b") is False
    _landed(cache)
    cache.put("a", snap([2], 50))  # newer than the file read
    assert cache.get("a").data == bytes(50)
    cache.discard("b")
    assert not cache._read_back and cache.get("b") is None


def test_a_snapshot_read_back_from_disk_is_marked_most_recently_used_for_every_process(tmp_path, caplog):
    # Other processes evict the folder by file times: a file read back must look recently used to them.
    import logging
    import os

    writer = SnapshotCache(disk_dir=tmp_path)
    writer.put("a", snap([1, 2], 5000))
    assert writer.flush()
    (path,) = tmp_path.glob("*.kv")
    os.utime(path, (1_000_000, 1_000_000))  # as if written long ago
    cache = SnapshotCache(disk_dir=tmp_path)
    with caplog.at_level(logging.WARNING, logger="rag_budget.cache"):
        assert cache.get("a") is not None
    assert path.stat().st_mtime > 1_000_000
    assert not [r for r in caplog.records if "failed" in r.getMessage()]

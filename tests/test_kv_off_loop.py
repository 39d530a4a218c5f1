"""The engine's snapshot and state copies cost the loop thread nothing but
the load: a snapshot on disk is read and checked by the cache's reader
thread, outside the cache's lock, while other streams go on; a state saved
after an answer is copied once (issue 37)."""

from __future__ import annotations

import threading
import tracemalloc

import pytest

from engine.errors import GenerationCancelled
from engine.llama_cpp import snapshot_files as snapshots_module
from engine.llama_cpp.faults import settle
from engine.llama_cpp.snapshots import SnapshotCache

PROMPT = ("A snapshot holds the state of a conversation. The engine saves it after each answer "
          "and loads it when the conversation comes back, so its prompt is not evaluated again. ") * 3


def _swap(backend, cache: SnapshotCache) -> SnapshotCache:
    """Make ``cache`` the engine's snapshot cache (the loop waits for nothing); the one it had."""
    settle(backend.loop)
    before = backend.snapshots
    backend.snapshots = backend.loop.snapshots = backend.loop.placement.snapshots = cache
    return before


@pytest.fixture
def on_disk(backend, tmp_path):
    """A session's snapshot written to disk, and a fresh cache over that
    folder (as after a restart) made the engine's: the disk alone holds it."""
    first = SnapshotCache(64 << 20, tmp_path, 1 << 30)
    before = _swap(backend, first)
    try:
        backend.generate(PROMPT, max_tokens=2, session="session:on-disk").result()
        assert first.flush() and first.disk_keys() == ["session:on-disk"]
        again = SnapshotCache(64 << 20, tmp_path, 1 << 30)
        _swap(backend, again)
        backend.forget_prompts()  # no idle sequence holds the prompt: only the snapshot does
        yield again
    finally:
        _swap(backend, before)


def _spy_reads(monkeypatch, cache: SnapshotCache, gate: threading.Event | None = None):
    reads: list[tuple[str, bool]] = []
    entered = threading.Event()
    read_file = snapshots_module.read_file

    def spy(path, *, data):
        if data:
            reads.append((threading.current_thread().name, cache._lock._is_owned()))
            entered.set()
            if gate is not None:
                gate.wait(60)
        return read_file(path, data=data)

    monkeypatch.setattr(snapshots_module, "read_file", spy)
    return reads, entered


def test_a_restored_snapshot_is_read_off_the_loop_thread_and_outside_the_cache_lock(backend, on_disk, monkeypatch):
    reads, _ = _spy_reads(monkeypatch, on_disk)
    _, timings = backend.generate(PROMPT + "Then", max_tokens=2, session="session:on-disk").result()
    assert timings.restored_tokens > 0
    assert reads, "the snapshot was never read from disk"
    assert all(name != "rag-engine" for name, _ in reads), reads
    assert not any(locked for _, locked in reads), reads


def test_other_streams_go_on_while_a_snapshot_is_read_from_disk(backend, on_disk, monkeypatch):
    gate = threading.Event()
    reads, entered = _spy_reads(monkeypatch, on_disk, gate)
    other = backend.generate("1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", max_tokens=400)
    pieces: list[str] = []
    later = threading.Event()

    def consume():
        try:
            for piece in other:
                pieces.append(piece)
                if entered.is_set() and len(pieces) >= seen + 5:
                    later.set()
        except GenerationCancelled:  # cancelled by the test once it has seen enough
            pass

    seen = 10 ** 9
    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    try:
        restored = backend.generate(PROMPT + "Then", max_tokens=2, session="session:on-disk")
        try:
            assert entered.wait(60), "the snapshot was never read"
            seen = len(pieces)
            # Five more pieces of the other stream while the read is held: the loop did not wait for the disk.
            assert later.wait(60), f"the other stream got {len(pieces) - seen} pieces while the snapshot was read"
        finally:
            gate.set()
        _, timings = restored.result()
        assert timings.restored_tokens > 0  # placed once its snapshot was in RAM
        assert reads and all(name != "rag-engine" for name, _ in reads)
    finally:
        gate.set()
        other.cancel()
        reader.join(60)


def test_a_saved_state_is_copied_once_and_loaded_without_a_copy(backend):
    backend.generate(PROMPT, max_tokens=2).result()
    loop = backend.loop
    settle(loop)  # the loop waits: its context may be read from here
    ctx = loop.ctx
    seq = next(s for s in range(1, ctx.n_seq_max - 1) if ctx.last_pos(s) >= 0)
    size = ctx._lc.llama_state_seq_get_size(ctx.ctx, seq)
    assert size > 100_000
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        data = ctx.save(seq)
        saved_peak = tracemalloc.get_traced_memory()[1] - base
        assert len(data) > 0.9 * size
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        assert ctx.load(ctx.n_seq_max - 1, data)
        loaded_peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
        ctx.remove(ctx.n_seq_max - 1)
    assert saved_peak < 1.5 * size, f"saving {size} bytes allocated {saved_peak} at once"
    assert loaded_peak < 0.5 * size, f"loading {size} bytes allocated {loaded_peak}"


def _stream(generation, pieces: list[str], got: threading.Event, each=lambda: None) -> threading.Thread:
    """Read ``generation`` on a thread of its own into ``pieces``, ``got``
    set at the first piece, ``each`` called after every piece."""

    def consume():
        try:
            for piece in generation:
                pieces.append(piece)
                got.set()
                each()
        except GenerationCancelled:  # cancelled by the test once it has seen enough
            pass

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    return thread


def test_a_request_waiting_for_its_snapshot_holds_back_no_request_behind_it(backend, on_disk, monkeypatch):
    gate = threading.Event()
    reads, entered = _spy_reads(monkeypatch, on_disk, gate)
    running, running_pieces, running_got = backend.generate("1, 2, 3, 4, 5, 6, 7, 8,", max_tokens=400), [], \
        threading.Event()
    behind, behind_pieces, behind_got = None, [], threading.Event()
    threads = [_stream(running, running_pieces, running_got)]
    try:
        assert running_got.wait(60)  # it holds a sequence: the restore below is read ahead, not waited for
        restored = backend.generate(PROMPT + "Then", max_tokens=2, session="session:on-disk")
        assert entered.wait(60), "the snapshot was never read"
        behind = backend.generate("a, b, c, d, e, f, g, h,", max_tokens=400)  # submitted after it
        threads.append(_stream(behind, behind_pieces, behind_got))
        # Placed and streaming while the snapshot ahead of it is still held on the disk.
        assert behind_got.wait(60), "the request behind the one waiting for the disk was never placed"
        assert not gate.is_set() and len(reads) == 1
        gate.set()
        _, timings = restored.result()
        assert timings.restored_tokens > 0  # and it was placed once its snapshot landed
    finally:
        gate.set()
        for generation in (running, behind):
            if generation is not None:
                generation.cancel()
        for thread in threads:
            thread.join(60)


@pytest.fixture
def segments_on_disk(backend, tmp_path):
    """A prompt with passages answered once with the system prompt pinned, so
    its exact segments were kept and written; then a fresh store over that
    folder (as after a restart): the disk alone holds them. The prompt's
    tokens and passages."""
    from prompt_budget import ContextPassage, build_messages, system_message
    from prompt_budget.layout import passage_body
    from rag.conversations.memory import stable_prefix
    from rag.qa.engine_setup import SYSTEM_STATE_KEY

    backend.prefill(stable_prefix(backend, [system_message()]), session=SYSTEM_STATE_KEY, pin=True)
    passages = [ContextPassage("notes/cat.md", "The cat named Tom sleeps on the red mat every afternoon. " * 3),
                ContextPassage("notes/tea.md", "Green tea is steeped for two minutes in water at eighty degrees. " * 3)]
    bodies = [passage_body(p) for p in passages]
    prompt = backend.tokenize(backend.render(build_messages("Where does the cat sleep?", passages)))
    store = backend.passages
    mode = store.fresh, store.exact
    store.use(fresh=None, exact=True)
    first = SnapshotCache(1 << 30, tmp_path, 1 << 30)
    before = store.start_over(first)
    try:
        backend.forget_prompts()
        backend.generate(prompt, max_tokens=2, passages=bodies).result()
        assert first.flush() and first.disk_keys(), "no segment was kept"
        store.start_over(SnapshotCache(1 << 30, tmp_path, 1 << 30))
        backend.forget_prompts()  # no idle sequence holds the prompt: only the store does
        yield prompt, bodies
    finally:
        settle(backend.loop)
        store.start_over(*before)
        store.use(fresh=mode[0], exact=mode[1])


def test_other_streams_go_on_while_a_passage_to_splice_is_read_from_disk(backend, segments_on_disk, monkeypatch):
    prompt, bodies = segments_on_disk
    gate = threading.Event()
    reads, entered = _spy_reads(monkeypatch, backend.passages.cache, gate)
    pieces, got, more, seen = [], threading.Event(), threading.Event(), [10 ** 9]
    other = backend.generate("1, 2, 3, 4, 5, 6, 7, 8,", max_tokens=400)
    thread = _stream(other, pieces, got, lambda: len(pieces) >= seen[0] + 5 and more.set())
    try:
        assert got.wait(60)
        spliced = backend.generate(prompt, max_tokens=2, passages=bodies)
        assert entered.wait(60), "no stored passage was read"
        seen[0] = len(pieces)
        # Five more pieces of the other stream while the passage's read is held: the loop did not wait for it.
        assert more.wait(60), f"the other stream got {len(pieces) - seen[0]} pieces while a passage was read"
        assert not gate.is_set() and len(reads) == 1
        gate.set()
        _, timings = spliced.result()
        assert timings.spliced_passages > 0  # spliced once its passage landed
        assert all(name != "rag-engine" for name, _ in reads)
    finally:
        gate.set()
        other.cancel()
        thread.join(60)


def test_a_lone_request_waits_for_its_passage_in_one_turn_instead_of_turning(backend, segments_on_disk, monkeypatch):
    prompt, bodies = segments_on_disk
    cache = backend.passages.cache
    gate = threading.Event()
    reads, entered = _spy_reads(monkeypatch, cache, gate)
    waits, waiting = [], threading.Event()
    get = cache.get

    def spy_get(key):
        waits.append(threading.current_thread().name)
        waiting.set()
        return get(key)

    monkeypatch.setattr(cache, "get", spy_get)
    settle(backend.loop)
    turns = backend.loop._turns
    try:
        spliced = backend.generate(prompt, max_tokens=2, passages=bodies)
        assert entered.wait(60) and waiting.wait(60), "the loop never asked for the passage"
        # Nothing else to run: the loop waits in get for the read, within a turn or two of the request.
        assert backend.loop._turns - turns <= 3 and waits == ["rag-engine"]
    finally:
        gate.set()
    _, timings = spliced.result()
    assert timings.spliced_passages > 0 and len(reads) == timings.spliced_passages  # each read once

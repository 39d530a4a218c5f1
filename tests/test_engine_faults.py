"""The engine under faults, on the real model: whatever fails (a decode, a
state saved or loaded, a store read or written), every request is told how
it ended, no sequence or KV cell leaks, and the shared system prompt stays.
Each test is one defect of issue 25, reproduced with ``engine.llama_cpp.faults``."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from engine.backend import Message
from engine.llama_cpp.snapshots import Snapshot, SnapshotCache
from engine.llama_cpp.passage_kv import PassageStore
from engine.llama_cpp.requests import Request
from tests.faults import HANG_S, faulty_backend, outcome, settled

pytestmark = pytest.mark.model

SYSTEM = Message("system", "You are a terse assistant. Answer in one short sentence.")
PASSAGE = "Prefill reads the whole prompt in one parallel pass and fills the KV cache of the engine."


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """Two sequences, splicing on, snapshots on disk; faults only where a test plans them."""
    b = faulty_backend(n_ctx=512, slots=2, splice_fresh=0, snapshot_dir=tmp_path_factory.mktemp("kv"))
    yield b
    b.close()


@pytest.fixture
def system(engine):
    """The system prompt pinned as sequence 0 (the shared prefix), its tokens."""
    prefix = engine.tokenize(engine.render([SYSTEM, Message("user", "x")]))
    prefix = prefix[: prefix.index(engine.tokenize("<|im_start|>")[0], 1)]
    engine.prefill(prefix, session="system", pin=True)
    settled(engine.loop)
    return prefix


def prompt(engine, question: str) -> list[int]:
    return engine.tokenize(engine.render([SYSTEM, Message("user", question)]))


def ask(engine, tokens, max_tokens: int = 4, **options) -> Request:
    return engine.loop.submit(Request(0, list(tokens), max_tokens, **options))


def test_a_state_that_cannot_be_saved_still_answers_and_frees_its_sequence(engine):
    for op in ("save", "snapshot_put"):
        engine.faults.fail_next(op)
        kind, _ = outcome(ask(engine, prompt(engine, f"Name a colour ({op})."), session=f"s-{op}"))
        assert kind == "done"  # the answer stands: only its cache entry is lost
        settled(engine.loop)
        assert engine.faults.injected[op] >= 1


def test_a_passage_that_cannot_be_kept_is_an_error_and_frees_its_sequence(engine, system):
    tokens = engine.tokenize(PASSAGE)
    key = engine.passages.key(system, tokens)
    engine.faults.fail_next("passage_put")
    kind, error = outcome(ask(engine, [*system, *tokens], 0, store=key, background=True))
    assert kind == "error" and "injected" in str(error)
    settled(engine.loop)
    assert not engine.passages.holds(key) and engine.loop.system == system


class _KeyProbe(int):
    """A request key counter that notes each increment made without the lock ``submit`` holds."""

    def __new__(cls, value: int, cv: threading.Condition, unlocked: list):
        probe = super().__new__(cls, value)
        probe.cv, probe.unlocked = cv, unlocked
        return probe

    def __add__(self, other):
        if not self.cv._is_owned():
            self.unlocked.append(threading.current_thread().name)
        return _KeyProbe(int(self) + other, self.cv, self.unlocked)


def test_request_keys_are_counted_under_the_lock_submit_holds(engine, system):
    # Two requests sharing a key: one placed twice, a sequence leaked, every request in flight failed.
    unlocked: list[str] = []
    loop = engine.loop
    with loop._cv:
        loop._keys = _KeyProbe(loop._keys, loop._cv, unlocked)
    assert engine.keep_passages([PASSAGE + " (warmed)"]) == 1  # the loop queues a warming request itself
    settled(loop)
    assert outcome(ask(engine, prompt(engine, "Name a fruit.")))[0] == "done"
    settled(loop)
    assert unlocked == []


def test_a_snapshot_load_that_raises_costs_a_prefill_not_the_request(engine):
    first = prompt(engine, "What is two plus two?")
    assert outcome(ask(engine, first, session="s-load"))[0] == "done"
    engine.forget_prompts()  # the next prompt finds the snapshot, not an idle sequence's cache
    for op in ("load", "snapshot_get"):
        engine.faults.fail_next(op)
        kind, timings = outcome(ask(engine, first + engine.tokenize(" And three?")))
        assert kind == "done" and timings.restored_tokens == 0
        settled(engine.loop)  # its sequence went back
        assert engine.snapshots.holds("s-load")  # a failing read is not a bad snapshot


def test_a_load_refused_while_others_hold_cells_keeps_the_snapshot(engine):
    # llama.cpp restores into contiguous free cells: refused for want of a run, not for a bad state.
    first = prompt(engine, "What colour is grass?")
    assert outcome(ask(engine, first, session="s-refused"))[0] == "done"
    engine.forget_prompts()
    long = ask(engine, prompt(engine, "Count slowly from one to two hundred."), 200)
    assert long.events.get(timeout=60)[0] == "piece"  # it holds cells while the next is placed
    engine.faults.fail_next("load", how="refuse")
    kind, timings = outcome(ask(engine, first + engine.tokenize(" Why?")))
    engine.loop.cancel(long)
    assert kind == "done" and timings.restored_tokens > 0  # given room, the same state loads
    assert engine.snapshots.holds("s-refused")
    settled(engine.loop)


def test_a_failed_step_keeps_the_shared_system_prompt(engine, system):
    engine.faults.fail_next("decode")
    kind, error = outcome(ask(engine, prompt(engine, "Say hello to Ada.")))
    assert kind == "error" and "injected" in str(error)
    settled(engine.loop)
    assert engine.loop.system == system
    kind, timings = outcome(ask(engine, prompt(engine, "Say hello to Bob.")))
    assert kind == "done" and timings.cached_tokens >= len(system) - 1
    # A failure while the system prompt itself is rebuilt brings the one before back.
    engine.faults.fail_next("decode")
    with pytest.raises(Exception, match="injected"):
        engine.prefill(system, session="system", pin=True)
    settled(engine.loop)
    assert engine.loop.system == system


def test_a_prompt_that_ends_with_a_stored_passage_is_not_spliced_to_its_end():
    # Its last token must be evaluated for the answer's first token; spliced, nothing was left to schedule.
    store = PassageStore("test", SnapshotCache(1 << 20), fresh=0)
    system, passage = [1, 2, 3], [7, 8, 9, 10]
    store.put(store.key(system, passage), passage, b"state")
    inside = [*system, 5, *passage, 6]
    assert [(s.start, s.end) for s in store.splices(system, inside, [(4, 8)], 3)] == [(4, 8)]
    assert store.splices(system, [*system, 5, *passage], [(4, 8)], 3) == []


def test_a_request_submitted_after_stop_is_told():
    from engine.llama_cpp.backend import LlamaCppBackend

    b = LlamaCppBackend(n_ctx=256, slots=1)
    b.close()
    kind, error = outcome(b.loop.submit(Request(0, [1, 2, 3], 2)))
    assert kind == "error" and "stopped" in str(error)


def test_the_pinned_snapshot_is_the_newest_pinned_one():
    cache = SnapshotCache(1 << 20)
    snap = lambda n: Snapshot(np.arange(n, dtype=np.int32), b"x" * n)  # noqa: E731
    assert cache.pinned() is None
    cache.put("old", snap(3), pin=True)
    cache.put("other", snap(4))
    assert cache.pinned().data == b"xxx"


def test_a_short_soak_under_faults_holds_every_invariant():
    # The long one is `rag bench faults --steps 5000`; this is the same command, shorter. It opens an
    # engine of its own (three slots, splicing on, snapshots in a temporary folder), not the shared one.
    import json

    from typer.testing import CliRunner

    from rag import cli

    out = CliRunner().invoke(cli.app, ["bench", "faults", "--steps", "150", "--seed", "7", "--bound", "60", "--json"])
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout)
    summary, calls = result["summary"], {row["op"]: row["calls"] for row in result["rows"]}
    assert calls.get("passage_get", 0) > 0 and calls.get("load", 0) > 0  # splicing and restoring were exercised
    assert summary["held"], summary["broken"]
    assert summary["faults_injected"] > 0 and sum(summary["ended"].values()) == summary["requests"]
    assert summary["checks"]["cells_conserved"] == summary["rounds"]


# -- issue 37: failures that hang or hide ------------------------------------------------------------


def _raising(real, times: int, what: str):
    """``real`` that raises RuntimeError on its next ``times`` calls, then is itself again; its calls counted."""
    calls: list[int] = []

    def call(*args, **kwargs):
        calls.append(1)
        if len(calls) <= times:
            raise RuntimeError(f"{what} failed (injected)")
        return real(*args, **kwargs)

    call.calls = calls
    return call


def _filling(engine) -> list[Request]:
    """Long answers holding every sequence (the first piece of each has come): the next request waits."""
    held = [ask(engine, prompt(engine, f"Count slowly from {i} to two hundred."), 120)
            for i in range(1, engine.loop.slots.size + 1)]
    for request in held:
        assert request.events.get(timeout=HANG_S)[0] == "piece"
    assert engine.loop.slots.free == 0
    return held


def _queued(engine, question: str) -> Request:
    """A request the loop has taken and holds waiting for a sequence (none is free)."""
    request = ask(engine, prompt(engine, question))
    guard = threading.Event()
    while request not in engine.loop._waiting:  # a hang guard, not a timing claim
        assert not guard.wait(0.01) and not request.released.is_set(), "the request was never queued"
    return request


def _watching_waiting(loop, failing):
    """``failing`` that first notes the keys of the requests waiting (not yet placed) at each call."""
    seen: list[list[int]] = []

    def call(*args, **kwargs):
        seen.append([r.key for r in loop._waiting])
        return failing(*args, **kwargs)

    call.calls, call.seen = failing.calls, seen
    return call


def test_a_failure_on_the_forget_path_ends_the_requests_held_serves_those_waiting_and_the_loop_goes_on(
        engine, system, monkeypatch):
    # The forget path ran outside the step's try: one exception there and the loop's thread was gone,
    # every consumer waiting for ever. Then its recovery failed every queued request too, though none
    # had touched the context: only those held are ended, the queued ones are served.
    loop = engine.loop
    held = _filling(engine)
    waiting = _queued(engine, "Say hello to Eve.")
    failing = _watching_waiting(loop, _raising(loop._give_up_idle, 1, "forgetting idle prompts"))
    monkeypatch.setattr(loop, "_give_up_idle", failing)
    loop.forget_prompts(wait_s=HANG_S)  # answered, not left to wait out its guard
    for request in held:
        kind, error = outcome(request)
        assert kind == "error" and "injected" in str(error) and len(failing.calls) >= 1
    assert waiting.key in failing.seen[0]  # queued, not placed, when the forget path failed
    kind, error = outcome(waiting)
    assert kind == "done", error
    settled(loop)
    assert loop._thread.is_alive()
    assert outcome(ask(engine, prompt(engine, "Say hello to Eve.")))[0] == "done"
    settled(loop)
    assert loop.system == system


def test_a_publish_that_raises_outside_a_step_ends_its_requests_and_those_waiting_are_served(
        engine, system, monkeypatch):
    # The second publish of a turn ran outside the try: the first raising there was recovered from, the
    # second killed the thread. Then that recovery failed every queued request as well.
    loop = engine.loop
    held = _filling(engine)
    waiting = _queued(engine, "Say hello to Max.")
    failing = _watching_waiting(loop, _raising(loop._publish, 2, "publishing"))
    monkeypatch.setattr(loop, "_publish", failing)
    for request in held:
        kind, error = outcome(request)
        assert kind == "error" and "injected" in str(error)
    kind, error = outcome(waiting)
    assert waiting.key in failing.seen[0]  # queued, not placed, when publishing failed
    assert kind == "done", error
    kind, _ = outcome(ask(engine, prompt(engine, "Say hello to Max.")))
    assert kind == "done" and len(failing.calls) > 2
    settled(loop)


def test_a_queued_request_that_fails_every_turn_is_told_and_the_loop_goes_on(engine, system):
    # A request whose own figures raise at every publish (as a poisoned one would) was kept queued
    # through each recovery until the loop gave up, failing every later request with it.
    loop = engine.loop
    poison = Request(0, prompt(engine, "Say hello to Max."), 4)

    def broken():
        raise RuntimeError("this request cannot say what it needs (injected)")

    poison.work = broken
    kind, error = outcome(loop.submit(poison))
    assert kind == "error" and "injected" in str(error)
    assert loop.alive()
    kind, error = outcome(ask(engine, prompt(engine, "Say hello to Max.")))
    assert kind == "done", error
    settled(loop)


def test_a_loop_that_cannot_go_on_tells_every_request_and_refuses_the_next_at_once():
    from engine.errors import GenerationFailed
    from engine.llama_cpp.backend import LlamaCppBackend

    b = LlamaCppBackend(n_ctx=256, slots=1)
    try:
        loop = b.loop
        loop._publish = _raising(loop._publish, 10 ** 6, "publishing")  # every turn fails, its recovery too
        kind, error = outcome(loop.submit(Request(0, [1, 2, 3], 2)))
        assert kind == "error" and "injected" in str(error)
        loop._thread.join(HANG_S)
        assert not loop._thread.is_alive()
        kind, error = outcome(loop.submit(Request(0, [1, 2, 3], 2)))
        assert kind == "error" and "restart" in str(error)  # refused at once, and says why
        with pytest.raises(GenerationFailed, match="restart"):
            b.generate([1, 2, 3], max_tokens=2).result()
        # A request the dead loop never took (none can be now): its consumer is told, not left waiting.
        kind, error = loop.next_event(Request(0, [1, 2, 3], 2), poll_s=0.01)
        assert kind == "error" and "ended" in str(error)
    finally:
        b.close()


def test_a_step_that_did_not_run_is_not_left_in_flight():
    from engine.scheduler import Step, StepStats

    stats = StepStats()
    stats.begin(Step((1,), ((2, 5),)), 10.0)
    stats.abandon()
    assert stats.in_flight(10.5) == (None, 0.0)
    assert stats.counters["steps"] == 0 and stats.counters["steps_not_run"] == 1
    stats.abandon()  # nothing in flight: nothing to end
    assert stats.counters["steps_not_run"] == 1


def test_a_refused_or_failed_step_is_not_in_the_load_as_running(engine, system, monkeypatch):
    # load() advanced the work by a step in flight that had never run, for as long as the engine idled.
    loop = engine.loop
    refused: list[int] = []

    def refuse(entries) -> int:
        refused.append(len(entries))
        return 1  # llama_decode: no KV slot for the batch

    monkeypatch.setattr(loop.ctx, "decode", refuse)
    kind, error = outcome(ask(engine, prompt(engine, "Name a tree.")))
    monkeypatch.undo()
    assert kind == "error" and "full" in str(error) and refused
    settled(loop)
    assert loop.load().in_flight is None
    engine.faults.fail_next("decode")
    assert outcome(ask(engine, prompt(engine, "Name a river.")))[0] == "error"
    settled(loop)
    assert loop.load().in_flight is None
    assert outcome(ask(engine, prompt(engine, "Name a hill.")))[0] == "done"  # budgets back once a step runs


def _lose_system(engine, system, loads: int) -> None:
    """Fail the system prompt's rebuild, and the next ``loads`` loads of its pinned snapshot."""
    engine.faults.fail_next("decode")  # the pin's step fails: sequence 0 is loaded again from its snapshot
    engine.faults.fail_next("load", times=loads)
    with pytest.raises(Exception, match="injected"):
        engine.prefill(system, session="system", pin=True)
    settled(engine.loop)


def test_a_system_prompt_lost_to_quick_failed_loads_is_loaded_again_at_later_steps(engine, system):
    # Three quick failures and it was gone for the life of the process, warming and splicing with it.
    from engine.llama_cpp.system_prompt import SYSTEM_TRIES

    loop, text = engine.loop, PASSAGE + " (kept after the loss)"
    _lose_system(engine, system, SYSTEM_TRIES + 1)
    assert loop.system == [] and engine.keep_passages([text]) == 0  # lost for now: nothing warmed
    asked = 0
    while loop.system != system and asked < 8:
        assert outcome(ask(engine, prompt(engine, f"Name the number {asked}.")))[0] == "done"
        settled(loop)
        asked += 1
    assert loop.system == system
    assert engine.keep_passages([text]) == 1  # warming again
    settled(loop)
    assert engine.stored_passages([text])[0] > 0  # and a prompt holding it would splice it


def test_a_lost_system_prompt_is_reported_with_its_failed_loads(engine, system):
    loop = engine.loop
    _lose_system(engine, system, 3)
    lost = engine.describe()["system_prompt"]
    assert lost.startswith("lost") and "3 failed loads" in lost
    assert engine.engine_stats()["system_retries"] == 3
    for n in range(8):
        if loop.system:
            break
        outcome(ask(engine, prompt(engine, f"Name the letter {n}.")))
        settled(loop)
    assert engine.describe()["system_prompt"] == f"held, {len(system)} tokens"
    assert engine.engine_stats()["system_retries"] == 0

"""Cache scopes (engine.backend): a prompt starts from another scope's
cached cells only as far as the shared system prompt. Before, reuse took
the longest common token prefix from any idle sequence, session snapshot
or exact passage segment, whoever's, and a caller read another holder's
question word by word from ``timings.cached_tokens`` (74 tokens cached for
a wrong guess, the system prompt; 82 when the first words of the other's
question matched; 110 for the exact question).

The rule on small token arrays (idle sequences, snapshots in RAM and on
disk, placement, exact segment keys), its wiring from the options to the
engines (planner, dispatcher, fake, remote) without a model; the leak
itself on the real model, through the pipeline, last."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from engine import FakeBackend
from engine.llama_cpp.passage_kv import PassageStore, segments
from engine.llama_cpp.placement import Placement
from engine.llama_cpp.requests import Request
from engine.llama_cpp.slots import SlotTable
from engine.llama_cpp.snapshot_files import read_snapshot, write_file
from engine.llama_cpp.snapshots import Snapshot, SnapshotCache
from engine.remote.backend import RemoteBackend
from prompt_budget import PrefillCostModel
from prompt_budget.cost import PrefillSample, fit_samples
from rag.index.store import Hit
from rag.qa.dispatch import Dispatcher
from rag.qa.options import AskOptions
from rag.qa.planner import PromptPlanner
from tests.conftest import write_corpus

SYSTEM = [1, 2, 3, 4]
SECRET = [*SYSTEM, 50, 51, 52, 53, 54, 55]  # another holder's question, after the system prompt
GUESS = [*SYSTEM, 50, 51, 52, 60, 61]  # its first three words guessed right


def _snap(tokens, scope: str | None = "") -> Snapshot:
    return Snapshot(np.asarray(tokens, dtype=np.int32), b"state" * 4, scope)


# -- idle sequences ------------------------------------------------------------------


def test_an_idle_sequence_is_found_only_by_prompts_of_its_scope():
    table = SlotTable(3)
    seq, _ = table.take()
    table.release(seq, SECRET, "aaaa")
    assert table.best(GUESS, "aaaa") == (seq, 7)  # its own scope's: the whole common prefix
    assert table.best(GUESS, "bbbb") == (None, 0)  # another's: not even its system prompt (sequence 0's)
    assert table.best(SECRET) == (None, 0)  # nor the local user's
    assert table.held() == [(table.held()[0][0], "aaaa")] and list(table.held()[0][0]) == SECRET
    table.release(seq, SECRET)  # the same prompt left by the local user: the local user's
    assert table.best(GUESS) == (seq, 7) and table.best(GUESS, "aaaa") == (None, 0)


# -- snapshots -------------------------------------------------------------------------


def test_a_snapshot_is_found_only_by_its_scope_and_the_pinned_system_prompt_by_every_scope():
    cache = SnapshotCache(max_bytes=1 << 20)
    cache.put("system", _snap(SYSTEM), pin=True)
    cache.put("session:a1", _snap(SECRET, "aaaa"))
    assert cache.best(GUESS, "aaaa") == ("session:a1", 7)
    assert cache.best(GUESS, "bbbb") == ("system", len(SYSTEM))  # what every prompt shares, no more
    assert cache.best(SECRET) == ("system", len(SYSTEM))
    snap = cache.get("session:a1")
    assert cache.readable("session:a1", snap, "aaaa") and not cache.readable("session:a1", snap, "bbbb")
    assert cache.readable("system", cache.get("system"), "bbbb")
    cache.put("session:a1", _snap(SECRET, "bbbb"))  # the key put again by another scope: now that one's
    assert cache.best(GUESS, "aaaa") == ("system", len(SYSTEM)) and cache.best(GUESS, "bbbb")[1] == 7


def test_a_snapshot_keeps_its_scope_on_disk_and_one_written_before_scopes_is_no_ones(tmp_path):
    cache = SnapshotCache(max_bytes=1 << 20, disk_dir=tmp_path)
    cache.put("session:a1", _snap(SECRET, "aaaa"))
    cache.put("session:l1", _snap(SECRET))
    cache.flush()
    again = SnapshotCache(max_bytes=1 << 20, disk_dir=tmp_path)  # a new process: the files only
    assert again.best(GUESS, "aaaa") == ("session:a1", 7)
    assert again.best(GUESS, "bbbb") == (None, 0)
    assert again.best(GUESS) == ("session:l1", 7)
    assert again.get("session:a1").scope == "aaaa"
    # A file as an older release wrote it: format 2, no scope in its header.
    old = tmp_path / "old.kv"
    assert write_file(old, "session:old", _snap([80, 81, 82, 83], None)) is not None
    header = json.loads(old.read_bytes()[8:8 + int.from_bytes(old.read_bytes()[4:8], "little")])
    assert header["format"] == 2 and "scope" not in header
    assert read_snapshot(old).scope is None  # read back, not dropped as damaged
    third = SnapshotCache(max_bytes=1 << 20, disk_dir=tmp_path)
    assert third.holds("session:old") and old.exists()
    for scope in ("", "aaaa"):  # of no known scope: found by none, the local user's included
        assert third.best([80, 81, 82, 83, 84], scope) == (None, 0)


# -- placement -------------------------------------------------------------------------


class _Cells:
    """A stand-in for the llama.cpp context that placement drives: it only records."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def remove(self, seq, p0=0, p1=-1):
        self.calls.append(("remove", seq, p0, p1))

    def share(self, src, dst, p0, p1):
        self.calls.append(("share", src, dst, p0, p1))

    def load(self, seq, data):
        self.calls.append(("load", seq))
        return True


def _placement() -> tuple[Placement, SlotTable, SnapshotCache, _Cells]:
    slots, snapshots, ctx = SlotTable(2), SnapshotCache(max_bytes=1 << 20), _Cells()
    return Placement(ctx, slots, snapshots, kv_cells=1000), slots, snapshots, ctx


@pytest.mark.parametrize("source", ["idle", "snapshot"])
def test_a_request_starts_from_another_scopes_cells_only_as_far_as_the_system_prompt(source):
    placement, slots, snapshots, ctx = _placement()
    if source == "idle":
        seq, _ = slots.take()
        slots.release(seq, [*SECRET, 99], "aaaa")  # its prompt and the answer's first token
    else:
        snapshots.put("session:a1", _snap([*SECRET, 99], "aaaa"))
    theirs = placement.place(Request(1, list(SECRET), 4, cache_scope="bbbb"), SYSTEM, 0)
    assert (theirs.cached, theirs.next) == (len(SYSTEM), len(SYSTEM))  # sequence 0's cells, shared
    assert ("share", 0, theirs.seq, 0, len(SYSTEM)) in ctx.calls and ("load", theirs.seq) not in ctx.calls
    placement, slots, snapshots, ctx = _placement()
    if source == "idle":
        seq, _ = slots.take()
        slots.release(seq, [*SECRET, 99], "aaaa")
    else:
        snapshots.put("session:a1", _snap([*SECRET, 99], "aaaa"))
    own = placement.place(Request(2, list(SECRET), 4, cache_scope="aaaa"), SYSTEM, 0)
    assert own.cached == len(SECRET) - 1  # its own scope's: all but the last token, as before scopes


def test_a_snapshot_put_by_another_scope_after_it_was_found_is_not_loaded():
    placement, _, snapshots, ctx = _placement()
    snapshots.put("session:x", _snap([*SECRET, 99], "aaaa"))
    found = snapshots.best(SECRET, "aaaa")
    snapshots.put("session:x", _snap([*SECRET, 99], "bbbb"))  # between the look-up and the load
    assert not placement._restore(1, found[0], 0, "aaaa") and not any(c[0] == "load" for c in ctx.calls)


# -- exact passage segments --------------------------------------------------------------


def test_an_exact_segment_is_keyed_by_its_prompts_scope_and_found_by_that_scope_only():
    store = PassageStore("model|ctx", SnapshotCache(max_bytes=1 << 20), fresh=None, exact=True)
    prompt = [*SYSTEM, 9, 40, 41, 42, 43, 44, 8, 7]
    spans = [(5, 10)]
    bounds = segments(prompt, spans, len(SYSTEM))
    keys = {s: store.segment_keys(prompt, bounds, scope=s)[0] for s in ("", "aaaa", "bbbb")}
    assert len(set(keys.values())) == 3
    store.put(keys["aaaa"], prompt[4:10], b"state")
    store.note_bodies([prompt[5:10]], scope="aaaa")
    assert [s.key for s in store.splices(SYSTEM, prompt, spans, len(SYSTEM), scope="aaaa")] == [keys["aaaa"]]
    assert store.splices(SYSTEM, prompt, spans, len(SYSTEM), scope="bbbb") == []
    assert store.splices(SYSTEM, prompt, spans, len(SYSTEM)) == []
    assert store.held_chain(prompt, bounds, len(SYSTEM), scope="bbbb") == (len(SYSTEM), 0)
    assert store.held_chain(prompt, bounds, len(SYSTEM), scope="aaaa") == (10, 1)
    assert store.may_hold(prompt[5:10], scope="aaaa") and not store.may_hold(prompt[5:10], scope="bbbb")


def test_a_lossy_passage_is_the_same_for_every_scope():
    # Computed behind the system prompt alone: it holds no question, only its collection's text.
    store = PassageStore("model|ctx", SnapshotCache(max_bytes=1 << 20), fresh=0)
    prompt = [*SYSTEM, 9, 40, 41, 42, 43, 44, 8, 7]
    key = store.key(SYSTEM, prompt[5:10])
    store.put(key, prompt[5:10], b"state")
    for scope in ("", "aaaa", "bbbb"):
        assert [s.key for s in store.splices(SYSTEM, prompt, [(5, 10)], len(SYSTEM), scope=scope)] == [key]


# -- from the options to the engines --------------------------------------------------------


def _cost() -> PrefillCostModel:
    samples = [PrefillSample(0, n, 0.01 + 0.005 * n) for n in (16, 64, 256, 1024)]
    return PrefillCostModel(fit_samples(samples, "linear"), anchors=samples)


def _hits(n: int = 3) -> list[Hit]:
    return [Hit(chunk_id=f"c{i}", source=f"doc{i}.md", score=1.0 - i / 100, text=f"Passage {i}: " + "word " * 40,
                char_start=0, char_end=100, position=i) for i in range(n)]


def _plan(backend, options: AskOptions):
    return PromptPlanner(backend).plan("What is the secret price?", _hits(), options, target_ttft=None,
                                       cost=_cost(), elapsed=lambda: 0.0)


class _Recording(FakeBackend):
    """The fake engine, recording the cache scope of every cache call."""

    def __init__(self, **kw) -> None:
        super().__init__(n_ctx=4096, **kw)
        self.asked: list[tuple[str, str]] = []

    def cached_prefix(self, tokens, cache_scope=""):
        self.asked.append(("cached", cache_scope))
        return super().cached_prefix(tokens, cache_scope)

    def generate(self, prompt, *, cache_scope="", **kw):
        self.asked.append(("generate", cache_scope))
        return super().generate(prompt, cache_scope=cache_scope, **kw)


def test_the_planner_predicts_and_the_dispatcher_asks_for_the_prompts_own_scope():
    backend = _Recording()
    theirs = AskOptions.of(cache_scope="aaaa", max_tokens=4)
    plan = _plan(backend, theirs)
    Dispatcher._generate(backend, plan, theirs, None, None).result()
    assert set(backend.asked) == {("cached", "aaaa"), ("generate", "aaaa")}
    # Planned again: its own scope finds its prompt cached (up to its passages), another scope nothing
    # (the fake engine has no system prompt pinned here), the local user's neither.
    assert _plan(backend, theirs).budget.cached_tokens > 50
    assert _plan(backend, AskOptions.of(cache_scope="bbbb")).budget.cached_tokens == 0
    assert _plan(backend, AskOptions.of()).budget.cached_tokens == 0
    # The local user's prompt names no scope: an engine written before scopes still serves it.
    from engine.backend import scoped as for_scope

    assert for_scope("") == {} and for_scope("aaaa") == {"cache_scope": "aaaa"}
    backend.asked.clear()
    Dispatcher._generate(backend, _plan(backend, AskOptions.of()), AskOptions.of(), None, None).result()
    assert set(backend.asked) == {("cached", ""), ("generate", "")}


def test_the_windows_a_scopes_prompts_showed_are_remembered_for_that_scope_only():
    from prompt_budget import ContextPassage
    from rag.qa.planner import ShownForms

    forms = ShownForms()
    window = ContextPassage("contract.md", "the window the holder's question cut")
    forms.note([("c1", window)], "aaaa")
    assert forms.get("c1", "aaaa") == window
    assert forms.get("c1", "bbbb") is None and forms.get("c1") is None


def test_the_fake_engine_keeps_scopes_apart_and_its_pinned_state_is_every_scopes():
    fake = FakeBackend()
    system = fake.tokenize("<|system|> be terse")
    fake.prefill(system, session="system", pin=True)
    secret = fake.tokenize("<|system|> be terse <|user|> the secret price is high")
    fake.generate(secret, session="a1", cache_scope="aaaa").result()
    assert fake.cached_prefix(secret, "aaaa") == len(secret) - 1
    assert fake.cached_prefix(secret, "bbbb") == fake.cached_prefix(secret) == len(system)


def _server(kind: str, bodies: list[dict]) -> httpx.MockTransport:
    """A stand-in for an OpenAI-compatible server of ``kind`` that records each completion's body."""

    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/props":
            return httpx.Response(200, json={"default_generation_settings": {"n_ctx": 1024}, "total_slots": 2}) \
                if kind == "llama-server" else httpx.Response(404)
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": 1024}]})
        if path == "/v1/completions":
            bodies.append(json.loads(request.content))
            events = [{"choices": [{"text": "ok"}]},
                      {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 1}}]
            text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
            return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})
        return httpx.Response(404)

    return httpx.MockTransport(handle)


def test_a_scope_goes_to_vllm_as_its_cache_salt_and_the_local_users_as_none():
    bodies: list[dict] = []
    remote = RemoteBackend("http://vllm.test", transport=_server("openai", bodies))
    tokens = [1, 2, 3, 4, 5]
    remote.generate(tokens, max_tokens=1, cache_scope="aaaa").result()
    remote.generate(tokens, max_tokens=1).result()
    assert bodies[0]["cache_salt"] == "aaaa" and "cache_salt" not in bodies[1]
    remote.close()
    # Predicted as vLLM keeps them: a prompt reuses only what its own salt computed.
    remote = RemoteBackend("http://vllm.test", transport=_server("openai", bodies))
    remote.generate(tokens, max_tokens=1, cache_scope="aaaa").result()
    assert remote.cached_prefix(tokens, "aaaa") == 4 and remote.cached_prefix(tokens, "bbbb") == 0
    assert remote.cached_prefix(tokens) == 0
    remote.close()


def test_llama_server_takes_no_scope_and_its_prediction_says_it_shares_every_prompt():
    bodies: list[dict] = []
    remote = RemoteBackend("http://llama.test", transport=_server("llama-server", bodies))
    tokens = [1, 2, 3, 4, 5]
    remote.generate(tokens, max_tokens=1, cache_scope="aaaa").result()
    assert "cache_salt" not in bodies[0]  # no such field: see the engine README
    assert remote.cached_prefix(tokens, "bbbb") == 4  # what that server will really do
    remote.close()


# -- the real model: the leak, through the pipeline ------------------------------------------

SCOPED_CORPUS = {
    "contract.md": ("# Maintenance contract\n\nThe maintenance contract of the boiler renews every March. "
                    "Dana Reyes signs it, and the price is agreed with the supplier each year.\n"),
    "garden.md": "# Garden\n\nTomatoes need full sun and regular watering. Stake the plants.\n",
}
# Another holder's question, which a caller of another scope guesses whole.
SECRET_QUESTION = "Does Dana Reyes still sign the boiler contract after the March renewal?"


@pytest.fixture
def scoped_pipeline(tmp_path, pipeline_factory):
    p = pipeline_factory(tmp_path / "index", conversations=tmp_path / "c.sqlite", learn=False)
    p.ingest([write_corpus(tmp_path / "corpus", SCOPED_CORPUS)])
    p.prepare()
    yield p
    p.close()


def test_another_scopes_question_is_never_read_back_through_the_cache(scoped_pipeline, backend):
    p = scoped_pipeline
    system = len(backend.loop.system)
    assert system > 0  # the shared system prompt, pinned at prepare

    planned: dict[str, list[int]] = {}  # the cached tokens each scope's plans counted on

    def cached(question: str, scope: str, session: str | None = None) -> int:
        answer = p.ask(question, session=session, cache_scope=scope, no_target=True, max_tokens=4)
        t = answer.timings
        assert t.cached_tokens + t.prefill_tokens == t.prompt_tokens
        planned.setdefault(scope, []).append(answer.budget.cached_tokens)
        return t.cached_tokens

    # The holder asks, in a conversation of two turns: its prompts stay in idle sequences, in its
    # session's snapshot and in the exact segments of its passages. A turn's prompt replays the turns
    # before it, so its second turn starts from its first (its own scope's).
    holder = [cached(SECRET_QUESTION, "aaaa", "a1"), cached(SECRET_QUESTION, "aaaa", "a1")]
    assert holder[1] > system + 20
    # Another scope guesses that question whole: as a plain question, then as a conversation's two
    # turns, prompts token for token the holder's (the old engine found them all but their last
    # token cached). A scope that never saw the holder's prompts does the same: what the guesser
    # finds cached is what it would find had the holder never asked.
    guesser = [cached(SECRET_QUESTION, "bbbb"), cached(SECRET_QUESTION, "bbbb", "b1"),
               cached(SECRET_QUESTION, "bbbb", "b1")]
    control = [cached(SECRET_QUESTION, "cccc"), cached(SECRET_QUESTION, "cccc", "c1"),
               cached(SECRET_QUESTION, "cccc", "c1")]
    assert guesser == control, (guesser, control)
    assert guesser[0] <= system  # its first prompt: the system prompt at most, which every prompt holds
    assert planned["bbbb"][0] <= system  # and its plan counted on no more: the planner asks for its scope
    # Its first turn is its own plain question again, found in its own scope; its second turn finds
    # its own first turn, as the holder's did, and not the holder's second turn whole.
    assert guesser[1] > system + 20 and guesser[2] <= holder[1]
    # And the holder's own conversation, asked on, still starts from its own cells.
    assert cached(SECRET_QUESTION, "aaaa", "a1") > holder[1]

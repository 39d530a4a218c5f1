"""The passage store keeps collections apart (issue 55): every passage it
keeps, lossy or exact, is keyed by its collection, the default one's
included, so a passage of the default collection that has exactly the
tokens of a named collection's passage (the default one names no
collection in its text) is never served from, nor counted as stored by,
the other's KV. The keys and the wiring from the planner and dispatcher
to the engine are pure; the last tests run the real model."""

from __future__ import annotations

import pytest

from engine import FakeBackend
from engine.backend import DEFAULT_COLLECTION, PassageKV
from engine.llama_cpp.passage_kv import PassageStore, segments
from engine.llama_cpp.snapshots import SnapshotCache
from prompt_budget import ContextPassage, PrefillCostModel, build_messages, passage_body, system_message
from prompt_budget.cost import PrefillSample, fit_samples
from rag.conversations import History
from rag.conversations.memory import stable_prefix
from rag.index import collection_names
from rag.index.store import Hit
from rag.qa.dispatch import Dispatcher
from rag.qa.options import AskOptions
from rag.qa.planner import PromptPlanner
from tests.conftest import write_corpus

SYSTEM = [1, 2, 3, 4]
BODY = [40, 41, 42, 43, 44]
SECRET = "The maintenance contract renews every March; the price is 41,000 euros and Dana Reyes signs it."
# Two files whose passages read the same, token for token: ``acme``'s "a.md" (a named collection's
# passage names it: " (a.md; collection acme)\n" + its text) and a default-collection file whose
# name carries the rest (its passage names no collection: " (" + name + ")\n" + its text).
NAMED = {"a.md": "b.md)\n" + SECRET}
TWIN = {"a.md; collection acme)\nb.md": SECRET}
PASSAGES = [ContextPassage(next(iter(TWIN)), SECRET),
            ContextPassage("notes/tea.md", "Green tea is steeped for two minutes in water at eighty degrees.")]


def _store(**use) -> PassageStore:
    return PassageStore("model|ctx", SnapshotCache(max_bytes=1 << 20), **({"fresh": 0} | use))


def test_a_passage_is_keyed_by_its_collection_the_default_one_included():
    store = _store()
    keys = {c: store.key(SYSTEM, BODY, collection=c) for c in (DEFAULT_COLLECTION, "acme", "twin")}
    assert len(set(keys.values())) == 3  # the same tokens in three collections: three keys
    assert store.key(SYSTEM, BODY, collection="acme") == keys["acme"]  # one collection: one key
    assert store.key(SYSTEM, BODY) == keys[DEFAULT_COLLECTION]  # none named: the default collection's
    assert collection_names.DEFAULT_COLLECTION == DEFAULT_COLLECTION  # rag's default one, named or not


def test_an_exact_segment_is_keyed_by_its_prompts_collection():
    store = _store(fresh=None, exact=True)
    prompt = [*SYSTEM, 9, *BODY, 8, 7]
    bounds = segments(prompt, [(5, 10)], len(SYSTEM))
    assert bounds == [(4, 10)]
    keys = {c: store.segment_keys(prompt, bounds, collection=c)[0] for c in (DEFAULT_COLLECTION, "acme")}
    assert keys[DEFAULT_COLLECTION] != keys["acme"]
    assert store.segment_keys(prompt, bounds, collection="acme") == [keys["acme"]]
    assert store.segment_keys(prompt, bounds) == [keys[DEFAULT_COLLECTION]]
    # The hint the planner reads is kept per collection too.
    store.put(keys["acme"], prompt[4:10], b"state")
    store.note_bodies([BODY], collection="acme")
    assert store.may_hold(BODY, collection="acme") and not store.may_hold(BODY)


@pytest.mark.parametrize("exact", [False, True])
def test_a_prompt_finds_only_its_own_collections_passages(exact):
    store = _store(fresh=None, exact=True) if exact else _store()
    prompt = [*SYSTEM, 9, *BODY, 8, 7]
    spans = [(5, 10)]
    key = (store.segment_keys(prompt, segments(prompt, spans, len(SYSTEM)), collection="acme")[0] if exact
           else store.key(SYSTEM, BODY, collection="acme"))
    store.put(key, BODY, b"state")
    assert [s.key for s in store.splices(SYSTEM, prompt, spans, len(SYSTEM), collection="acme")] == [key]
    assert store.splices(SYSTEM, prompt, spans, len(SYSTEM)) == []
    assert store.splices(SYSTEM, prompt, spans, len(SYSTEM), collection="twin") == []


class _KeyingFake(FakeBackend):
    """The fake engine with a passage store keyed as the real one is: by
    collection and text; it records the collection each call names."""

    splice_fresh = 0

    def __init__(self, stored=(), **kw) -> None:
        super().__init__(n_ctx=4096, **kw)
        self.stored = set(stored)  # (collection, passage text)
        self.asked: list[tuple[str, str]] = []  # (call, collection)

    def generate(self, prompt, *, passages=(), collection=DEFAULT_COLLECTION, **kw):
        self.asked.append(("generate", collection))
        return super().generate(prompt, **kw)

    def stored_passages(self, texts, *, collection=DEFAULT_COLLECTION):
        self.asked.append(("stored", collection))
        return [len(self.tokenize(t)) if (collection, t) in self.stored else 0 for t in texts]

    def keep_passages(self, texts, *, collection=DEFAULT_COLLECTION):
        self.asked.append(("keep", collection))
        return len(texts)

    def precompute_passages(self, texts, progress=None, *, collection=DEFAULT_COLLECTION):
        return {}


def _plan(backend, options: AskOptions):
    samples = [PrefillSample(0, n, 0.01 + 0.005 * n) for n in (16, 64, 256, 1024)]
    hits = [Hit(chunk_id=f"c{i}", source=f"doc{i}.md", score=1.0 - i / 100, text=f"Passage {i}: " + "word " * 40,
                char_start=0, char_end=100, position=i) for i in range(3)]
    return PromptPlanner(backend).plan("What is prefill?", hits, options, target_ttft=None,
                                       cost=PrefillCostModel(fit_samples(samples, "linear"), anchors=samples),
                                       elapsed=lambda: 0.0, history=History(None, (), ()))


def test_the_planner_and_the_dispatcher_name_the_prompts_collection_to_the_engine():
    acme = AskOptions.of(collection="acme")
    body = passage_body(ContextPassage("doc0.md", "Passage 0: " + "word " * 40, None, "acme"))
    backend = _KeyingFake(stored=[("acme", body)])
    assert isinstance(backend, PassageKV)
    plan = _plan(backend, acme)
    assert body in plan.passages and [d.spliced for d in plan.budget.decisions if d.chunk_id == "c0"] == [True]
    Dispatcher._generate(backend, plan, acme, None, None).result()
    assert set(backend.asked) == {("stored", "acme"), ("generate", "acme"), ("keep", "acme")}
    # The default collection's prompt names none: the engine keys it as the default collection.
    backend.asked.clear()
    plan = _plan(backend, AskOptions.of())
    assert not any(d.spliced for d in plan.budget.decisions)
    Dispatcher._generate(backend, plan, AskOptions.of(), None, None).result()
    assert set(backend.asked) == {("stored", DEFAULT_COLLECTION), ("generate", DEFAULT_COLLECTION),
                                  ("keep", DEFAULT_COLLECTION)}


# -- the real model -----------------------------------------------------------------


@pytest.fixture(scope="module")
def splicing(tmp_path_factory):
    """An engine of its own that splices stored passages (R = 0), with its system prompt cached."""
    from engine.llama_cpp.backend import LlamaCppBackend

    b = LlamaCppBackend(n_ctx=1024, slots=2, splice_fresh=0, snapshot_dir=tmp_path_factory.mktemp("kv"))
    b.prefill(stable_prefix(b, [system_message()]), session="system", pin=True)
    yield b
    b.close()


@pytest.fixture
def store(splicing, tmp_path):
    """A fresh, empty passage store for one test, lossy at R = 0 (a test may turn exact reuse on)."""
    splicing.passages.start_over(SnapshotCache(1 << 30, tmp_path / "passages", 1 << 30))
    splicing.passages.use(fresh=0, exact=False)
    yield splicing.passages
    splicing.passages.use(fresh=0, exact=False)


def test_a_default_collection_passage_with_a_named_ones_tokens_is_never_spliced_from_it(
        splicing, store, embedder, tmp_path):
    from rag import Pipeline

    p = Pipeline.open(tmp_path / "index", embedder=embedder, backend=splicing, conversations=tmp_path / "c.sqlite",
                      learn=False)
    p.ingest([write_corpus(tmp_path / "acme", NAMED)], collection="acme")
    p.warm_up()
    assert p.passages.precompute()["computed"] == 1
    p.ingest([write_corpus(tmp_path / "mine", TWIN)])  # the default collection
    (name, _), = TWIN.items()
    body = passage_body(ContextPassage(name, SECRET))
    assert body == passage_body(ContextPassage("a.md", NAMED["a.md"], None, "acme"))  # the same text, and tokens
    assert splicing.stored_passages([body]) == [0]  # the default collection's passage is not stored
    question = "When does the maintenance contract renew?"
    mine = p.ask(question, no_target=True, max_tokens=4)
    assert [s.source for s in mine.sources] == [name]
    assert mine.timings.spliced_tokens == 0 and not any(d.spliced for d in mine.budget.decisions)
    assert splicing.stored_passages([body], collection="acme")[0] > 0  # acme's is, under acme's key
    own = p.ask(question, collection="acme", no_target=True, max_tokens=4)
    assert own.timings.spliced_tokens > 0  # its own collection's stored passage is spliced
    # Each collection's passages are precomputed under its own keys: the default one's stored beside
    # acme's (the engine may have warmed it since it was asked, so it may be counted as stored before).
    report = p.passages.precompute()
    assert report["passages"] == report["computed"] + report["stored_before"] == 2 and report["stored_before"] >= 1
    assert splicing.stored_passages([body])[0] > 0


def test_an_exact_segment_kept_for_one_collection_is_not_taken_by_another(splicing, store):
    store.use(fresh=None, exact=True)
    bodies = [passage_body(p) for p in PASSAGES]
    prompt = splicing.tokenize(splicing.render(build_messages("When does the contract renew?", PASSAGES)))

    def answer(**collection):
        splicing.forget_prompts()  # nothing held by an idle sequence: only the store can supply passages
        return splicing.generate(prompt, max_tokens=2, passages=bodies, **collection).result()[1]

    assert answer(collection="acme").spliced_tokens == 0  # the first: nothing kept yet
    splicing.forget_prompts()
    assert splicing.held_prefix(prompt, bodies, collection="acme")[1] == 2
    assert splicing.held_prefix(prompt, bodies)[1] == 0 and splicing.held_passages(bodies) == [False, False]
    assert answer().spliced_tokens == 0  # the same tokens in the default collection: not taken
    assert answer(collection="twin").spliced_tokens == 0
    assert answer(collection="acme").spliced_tokens > 0  # its own collection's segments are

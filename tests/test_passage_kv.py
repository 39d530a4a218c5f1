"""Passage KV reuse on the real model: stored passages spliced into new
prompts (engine.llama_cpp.passage_kv, engine.llama_cpp.splicing), the pipeline's side of it
(rag.qa.passages), `rag ingest --precompute-kv`, and the measurement hooks
of `rag bench splice` (teacher forcing)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.llama_cpp.snapshots import SnapshotCache
from engine.llama_cpp.passage_kv import find_spans
from engine.llama_cpp.requests import Trace
from prompt_budget import ContextPassage, build_messages, system_message
from prompt_budget.layout import PastTurn, passage_body
from rag.conversations.memory import stable_prefix
from tests.conftest import assert_clean_error

PASSAGES = [
    ContextPassage("library/collections.rst.txt",
                   "A Counter is a dict subclass for counting hashable objects. Elements are stored as dictionary "
                   "keys and their counts are stored as dictionary values."),
    ContextPassage("library/gzip.rst.txt",
                   "This module provides a simple interface to compress and decompress files just like the GNU "
                   "programs gzip and gunzip would:"),
    ContextPassage("guide/code.md", "Call it so:\n\n   >>> gzip.open('f.gz', 'rt')\n   <_io.TextIOWrapper>", page=3),
    ContextPassage("notes/unicode.txt", "Größe – naïve café (déjà vu) «quoted» 数据"),
]
QUESTION = "How do I count how many times each item occurs in a list?"


@pytest.fixture(scope="module")
def splicing(tmp_path_factory):
    """An engine of its own that splices stored passages (R = 0), with its
    system prompt cached; each test sets R and the store it needs."""
    from engine.llama_cpp.backend import LlamaCppBackend

    b = LlamaCppBackend(n_ctx=1024, slots=2, splice_fresh=0, snapshot_dir=tmp_path_factory.mktemp("kv"))
    b.prefill(stable_prefix(b, [system_message()]), session="system", pin=True)
    yield b
    b.close()


@pytest.fixture
def store(splicing, tmp_path):
    """A fresh, empty passage store (RAM and disk) for one test, at R = 0."""
    splicing.passages.cache = SnapshotCache(1 << 30, tmp_path / "passages", 1 << 30)
    splicing.passages.fresh = 0
    return splicing.passages


def bodies(passages=PASSAGES) -> list[str]:
    return [passage_body(p) for p in passages]


def answer(b, prompt, passages=(), max_tokens=12):
    b.forget_prompts()  # nothing of the prompt held by an idle sequence: a cold start
    text, timings = b.generate(prompt, max_tokens=max_tokens, passages=passages).result()
    assert timings.cached_tokens + timings.prefill_tokens == timings.prompt_tokens
    return text, timings


def test_a_passage_inside_a_rendered_prompt_has_exactly_its_stored_tokens(backend):
    # Canonical tokenization: whatever stands before and after a passage (its number, the blank
    # line, the question, a conversation's turns), its tokens are those of its body alone.
    cases = [(build_messages(QUESTION, PASSAGES), PASSAGES),
             (build_messages("Why?", PASSAGES[::-1], summary="We spoke of gzip.", turns=[PastTurn("Hi", "Hello.")]),
              PASSAGES[::-1])]
    for messages, shown in cases:
        tokens = backend.tokenize(backend.render(messages))
        spans = find_spans(tokens, [backend.tokenize(b) for b in bodies(shown)])
        assert None not in spans
        for (start, end), body in zip(spans, bodies(shown)):
            assert tokens[start:end] == backend.tokenize(body)
            assert backend._llm.detokenize(tokens[start - 1:start]).endswith(b"]")  # right after its number


def test_spliced_tokens_count_as_cached_and_R_equal_to_the_passage_gives_the_full_answer(splicing, store):
    prompt = splicing.render(build_messages(QUESTION, PASSAGES[:2]))
    full, full_t = answer(splicing, prompt)
    report = splicing.precompute_passages(bodies(PASSAGES[:2]))
    assert report["computed"] == 2 and report["ram_bytes"] > 0 and report["disk_bytes"] > 0
    assert all(n > 0 for n in splicing.stored_passages(bodies(PASSAGES[:2])))

    _, spliced = answer(splicing, prompt, bodies(PASSAGES[:2]))
    assert spliced.spliced_tokens == sum(len(splicing.tokenize(b)) for b in bodies(PASSAGES[:2]))
    assert spliced.prefill_tokens == full_t.prefill_tokens - spliced.spliced_tokens

    store.fresh = max(len(splicing.tokenize(b)) for b in bodies(PASSAGES[:2]))  # every token evaluated again
    same, t = answer(splicing, prompt, bodies(PASSAGES[:2]))
    assert t.spliced_tokens == 0 and same == full


def test_a_passage_spliced_where_it_was_computed_answers_as_a_full_prefill(splicing, store):
    # Right behind the system prompt the stored cells are those a full prefill computes (no shift,
    # nothing else to attend to), so loading, placing and sharing them must change nothing.
    system = list(splicing.loop.system)
    body = bodies()[0]
    tail = splicing.tokenize(f"\n\nQuestion: {QUESTION}<|im_end|>\n<|im_start|>assistant\n")
    tokens = system + splicing.tokenize(body) + tail
    full, _ = answer(splicing, tokens)
    splicing.precompute_passages([body])
    spliced, t = answer(splicing, tokens, [body])
    assert t.spliced_tokens == len(splicing.tokenize(body)) and spliced == full


def test_a_passage_whose_head_an_idle_sequence_holds_is_spliced_from_there(splicing, store):
    # The previous prompt began with the same "[1] (source)" tokens: the prefix cache holds the
    # passage's head, and the rest of it must still come from the store, not be evaluated.
    body = bodies()[0]
    kin = ContextPassage(PASSAGES[0].source, "An OrderedDict remembers the order its keys were inserted in.")
    splicing.precompute_passages([body])
    splicing.forget_prompts()
    splicing.generate(splicing.render(build_messages(QUESTION, [kin])), max_tokens=2).result()
    tokens = splicing.tokenize(splicing.render(build_messages(QUESTION, PASSAGES[:1])))
    ((start, end),) = find_spans(tokens, [splicing.tokenize(body)])
    t = splicing.generate(tokens, max_tokens=2, passages=[body]).result()[1]
    head = t.cached_tokens - t.spliced_tokens - start  # of the passage, found in the prefix cache
    assert 0 < head < end - start and t.spliced_tokens == end - start - head
    assert t.cached_tokens + t.prefill_tokens == t.prompt_tokens


def test_warming_the_store_is_not_load_a_new_request_waits_behind(splicing, store):
    # Warming gives way to any request at the next step, so the load a plan sees leaves it out
    # (else eight clients and one warming passage look like nine and the ninth is refused).
    import time

    texts = [passage_body(ContextPassage(f"w{i}.md", f"Shelf {i} holds {i * 7} jars of plum jam and a lamp.")) for i in range(12)]
    assert splicing.keep_passages(texts) == 12
    seen = False
    deadline = time.monotonic() + 30
    while not seen and time.monotonic() < deadline:
        if splicing.loop.warming():
            load = splicing.load()
            assert not load.active and not load.waiting
            seen = True
    assert seen and splicing.cache_stats()["passage_warm_queue"] > 0
    while splicing.cache_stats()["passage_warm_queue"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert splicing.stored_passages(texts) == [len(splicing.tokenize(t)) for t in texts]


def test_a_waiting_request_counts_only_the_tokens_it_will_evaluate(splicing, store):
    # The load others plan for must not charge a queued request for passages it will splice.
    from engine.llama_cpp.requests import Request

    body = bodies()[1]
    tokens = splicing.tokenize(splicing.render(build_messages(QUESTION, PASSAGES[1:2])))
    spans = tuple(find_spans(tokens, [splicing.tokenize(body)]))
    request = Request(0, tokens, 8, spans=spans)
    assert splicing.loop.splicer.stored(request, splicing.loop.system) == (0, 0)  # not stored yet
    splicing.precompute_passages([body])
    request.stored, request.pieces = splicing.loop.splicer.stored(request, splicing.loop.system)
    assert request.stored == len(splicing.tokenize(body)) and request.pieces == 1
    assert request.work().to_prefill == len(tokens) - request.stored and request.work().pieces == 1


def test_the_store_keeps_to_its_byte_caps_least_recently_used_first(splicing, store, tmp_path):
    boxes = [ContextPassage(f"box{i}.md", f"The {w} box holds {i + 3} apples and one pear.")
             for i, w in enumerate(["red", "blue", "green", "black"])]
    texts = bodies(boxes)
    assert len({len(splicing.tokenize(t)) for t in texts}) == 1  # all the same size
    keys = [store.key(splicing.loop.system, splicing.tokenize(t)) for t in texts]
    splicing.precompute_passages(texts[:1])
    one = len(store.get(keys[0])) + 4 * len(splicing.tokenize(texts[0]))  # what one entry takes in RAM
    # Room for two passages in RAM and three on disk.
    store.cache = SnapshotCache(int(2.5 * one), tmp_path / "capped", int(3.5 * one))
    splicing.precompute_passages(texts[:3])
    assert store.cache.keys() == keys[1:3] and store.cache.disk_keys() == keys[:3]
    assert splicing.stored_passages(texts[:1])[0] > 0  # on disk still
    splicing.precompute_passages(texts[3:])
    stats = store.cache.stats()
    assert stats["ram_bytes"] <= 2.5 * one and stats["disk_bytes"] <= 3.5 * one
    assert store.cache.disk_keys() == keys[1:] and splicing.stored_passages(texts[:1]) == [0]
    assert report_again(splicing, texts[:1]) == 1  # evicted: computed again


def report_again(b, texts) -> int:
    return b.precompute_passages(texts)["computed"]


def test_a_changed_passage_is_never_served_from_its_old_kv(splicing, store):
    old = ContextPassage("notes.md", "The kiln fires at 1200 degrees for nine hours.")
    new = ContextPassage("notes.md", "The kiln fires at 1250 degrees for nine hours.")
    splicing.precompute_passages([passage_body(old)])
    assert splicing.stored_passages([passage_body(new)]) == [0]
    assert store.key(splicing.loop.system, splicing.tokenize(passage_body(old))) != \
        store.key(splicing.loop.system, splicing.tokenize(passage_body(new)))
    prompt = splicing.render(build_messages("How hot?", [new]))
    _, t = answer(splicing, prompt, [passage_body(new)])
    assert t.spliced_tokens == 0


def test_a_damaged_stored_file_is_dropped_and_computed_again_never_loaded(splicing, store, tmp_path):
    body = bodies()[1]
    prompt = splicing.render(build_messages("What does gzip do?", [PASSAGES[1]]))
    full, _ = answer(splicing, prompt)
    splicing.precompute_passages([body])
    (path,) = (tmp_path / "passages").glob("*.kv")
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 0xFF  # one byte of the state
    path.write_bytes(bytes(raw))
    store.cache = SnapshotCache(1 << 30, tmp_path / "passages", 1 << 30)  # as after a restart: disk only
    assert splicing.stored_passages([body])[0] > 0  # its header is intact: it looks stored
    text, t = answer(splicing, prompt, [body])
    assert t.spliced_tokens == 0 and text == full  # the damaged state was not used
    assert not path.exists() and splicing.stored_passages([body]) == [0]
    assert report_again(splicing, [body]) == 1


def test_teacher_forcing_returns_the_forced_answer_and_its_logits(splicing, store):
    prompt = splicing.render(build_messages(QUESTION, PASSAGES[:1]))
    greedy = Trace()
    splicing.forget_prompts()
    splicing.generate(prompt, max_tokens=6, trace=greedy).result()
    assert len(greedy.tokens) == len(greedy.logits) >= 1
    assert int(np.argmax(greedy.logits[0])) == greedy.tokens[0]  # the first token: no penalty yet
    forced_tokens = tuple(splicing.tokenize(" The answer is"))
    forced = Trace(forced=forced_tokens)
    splicing.forget_prompts()
    splicing.generate(prompt, max_tokens=len(forced_tokens), trace=forced).result()
    assert tuple(forced.tokens) == forced_tokens and len(forced.logits) == len(forced_tokens)
    assert np.allclose(forced.logits[0], greedy.logits[0], atol=1e-2)


def test_splicing_answers_in_conversations_with_session_snapshots(splicing, store, embedder, corpus, tmp_path):
    from rag import Pipeline

    p = Pipeline.open(tmp_path / "index", embedder=embedder, backend=splicing, conversations=tmp_path / "c.sqlite",
                      learn=False)
    p.ingest([corpus])
    p.warm_up()
    report = p.passages.precompute()
    assert report["computed"] == report["passages"] > 0 and report["bytes_per_passage"] > 0
    first = p.ask("What does prefill fill?", session="s", no_target=True, max_tokens=8)
    second = p.ask("And what limits decode?", session="s", no_target=True, max_tokens=8)
    for a in (first, second):
        t = a.timings
        assert a.answer and t.cached_tokens + t.prefill_tokens == t.prompt_tokens
    assert first.timings.spliced_tokens > 0
    assert any(d.spliced for d in first.budget.decisions)
    assert second.timings.cached_tokens > first.timings.cached_tokens  # the first turn's snapshot is reused
    assert p.passages.describe()["splicing"] == "on"


def test_a_stored_passage_is_never_spliced_into_another_collections_prompt(splicing, store, embedder, tmp_path):
    # The same document, word for word under the same name, in two collections (issue 46): one collection's
    # stored passages must not serve the other's prompt, or its speed would tell that the other holds the text.
    from rag import Pipeline
    from tests.conftest import write_corpus

    p = Pipeline.open(tmp_path / "index", embedder=embedder, backend=splicing, conversations=tmp_path / "c.sqlite",
                      learn=False)
    text = "The maintenance contract renews every March; the price is 41,000 euros and Dana Reyes signs it."
    p.ingest([write_corpus(tmp_path / "first", {"contract.md": text})], collection="first")
    p.warm_up()
    assert p.passages.precompute()["computed"] == 1
    p.ingest([write_corpus(tmp_path / "twin", {"contract.md": text})], collection="twin")
    stored = lambda collection, under: splicing.stored_passages(  # noqa: E731
        [passage_body(ContextPassage("contract.md", text, None, collection))], collection=under)[0]
    assert stored("first", "first") > 0 and stored("twin", "twin") == 0 and stored(None, "default") == 0
    assert stored("first", "twin") == 0 and stored("first", "default") == 0  # keyed by collection, not text alone
    question = "When does the maintenance contract renew?"
    twin = p.ask(question, collection="twin", no_target=True, max_tokens=4)
    assert twin.sources and twin.timings.spliced_tokens == 0 and not any(d.spliced for d in twin.budget.decisions)
    own = p.ask(question, collection="first", no_target=True, max_tokens=4)
    assert own.timings.spliced_tokens > 0  # its own collection's stored passage is spliced


def test_an_engine_without_passage_kv_says_so(pipeline_factory, embedder, tmp_path):
    from engine.fake import FakeBackend
    from rag import Pipeline
    from rag.errors import RagError

    p = Pipeline.open(tmp_path / "index", embedder=embedder, backend=FakeBackend())
    assert p.passages.describe()["splicing"].startswith("unsupported")
    with pytest.raises(RagError, match="keeps no passage KV"):
        p.passages.check()
    # The session engine does not splice (off by default): it says so too.
    off = pipeline_factory(tmp_path / "index")
    assert off.passages.describe()["splicing"] == "off"
    with pytest.raises(RagError, match="--splice-fresh"):
        off.passages.check()


def test_ingest_precompute_kv_reports_the_bytes(run, corpus, tmp_path):
    index = tmp_path / "index"
    refused = run("ingest", corpus, "--index", index, "--precompute-kv")
    assert_clean_error(refused, "only for lossy splicing", "--splice-fresh")
    assert not index.exists()  # refused before anything was ingested
    result = run("--splice-fresh", "4", "ingest", corpus, "--index", index, "--precompute-kv", "--json")
    assert result.exit_code == 0, result.output
    kv = json.loads(result.stdout)["passage_kv"]
    assert kv["computed"] == kv["passages"] > 0 and kv["bytes_per_passage"] > 0 and kv["disk_bytes"] > 0
    again = run("--splice-fresh", "4", "ingest", corpus, "--index", index, "--precompute-kv")
    assert again.exit_code == 0, again.output
    assert f"0 computed, {kv['passages']} already stored" in again.stderr and "KiB a passage" in again.stderr


def test_the_hint_of_held_passages_is_bounded_by_what_the_store_holds():
    # Exact segments get a key per prompt: the passages noted as held must leave the hint as
    # their segments leave the store, or it grows with every prompt ever answered.
    from engine.llama_cpp.passage_kv import PassageStore

    size = 400
    store = PassageStore("model|ctx", SnapshotCache(max_bytes=10 * (size + 3 * 4)), fresh=None, exact=True)
    for i in range(500):
        body = [1000 + i, 2000 + i]
        store.put(f"segment:{i}", [7, *body], bytes(size))
        store.note_bodies([body])
    held = len(store.cache.keys())
    assert held == 10
    assert len(store._bodies) <= held
    assert store.may_hold([1499, 2499]) and not store.may_hold([1000, 2000])

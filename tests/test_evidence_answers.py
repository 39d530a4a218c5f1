"""The evidence in answers: where it goes in the prompt and what it costs
(pure, on the fake backend), and on the real parts: every answer carries
sentences of its own prompt's passages whose span in the document is
exact, shown first by the CLI, streamed before the first token by the
service, and a question no passage answers is declined without the model."""

from __future__ import annotations

import json

import httpx
import pytest

from engine import FakeBackend
from prompt_budget import PrefillCostModel
from prompt_budget.cost import PrefillSample, fit_samples
from prompt_budget.layout import EVIDENCE_HEADING, Quote, answer_lead, quote_line, user_message, ContextPassage
from rag.index.store import Hit
from rag.qa.answer import DECLINED, Answer
from rag.qa.evidence import rank
from rag.qa.options import AskOptions
from rag.qa.planner import PromptPlanner
from rag.qa.stream import AnswerDone, EvidenceFound, TextPiece

QUESTION = "What is the default maxsize of lru_cache?"
DOC = (
    ".. decorator:: lru_cache(user_function)\n"
    "              lru_cache(maxsize=128, typed=False)\n\n"
    "   Decorator to wrap a function with a memoizing callable that saves up to the\n"
    "   *maxsize* most recent calls.  It can save time when an expensive function is called.\n"
)
FILLER = "The weather was mild and the garden needed no watering that week. " * 6


def _hits() -> list[Hit]:
    return [Hit(chunk_id="a", source="functools.rst", score=0.9, text=DOC, char_start=100, char_end=100 + len(DOC)),
            Hit(chunk_id="b", source="garden.md", score=0.5, text=FILLER, char_start=0, char_end=len(FILLER),
                position=1)]


def _cost() -> PrefillCostModel:
    samples = [PrefillSample(0, n, 0.01 + 0.005 * n) for n in (16, 64, 256, 1024)]
    return PrefillCostModel(fit_samples(samples, "linear"), anchors=samples)


def _plan(place: str, backend=None, **options):
    hits = _hits()
    backend = backend or FakeBackend(n_ctx=4096)
    return backend, PromptPlanner(backend).plan(QUESTION, hits, AskOptions.of(evidence=place, **options),
                                                target_ttft=None, cost=_cost(), elapsed=lambda: 0.0,
                                                ranked=rank(QUESTION, hits))


def test_a_quote_is_one_line_with_what_it_is_about():
    assert quote_line(Quote(2, "Wraps  a\nfunction.", "lru_cache()")) == '[2] lru_cache(): "Wraps a function."'
    message = user_message("Q?", [ContextPassage("a.md", "text")], [Quote(1, "It is so.")])
    assert message.index("[1] (a.md)") < message.index(EVIDENCE_HEADING) < message.index("Question: Q?")
    assert answer_lead([]) == "" and answer_lead([Quote(1, "It is so.")]).endswith("\n\n")


@pytest.mark.parametrize("place", ["last", "prefill", "both", "off"])
def test_the_evidence_goes_where_asked_and_its_tokens_are_costed(place):
    backend, plan = _plan(place)
    assert plan.evidence and "128" in plan.evidence[0].about + plan.evidence[0].text
    assert plan.evidence[0].passage == 1 + [h.chunk_id for h in plan.hits].index("a")
    quoted = EVIDENCE_HEADING in plan.text
    assert quoted == (place in ("last", "both")) and (EVIDENCE_HEADING in plan.user) == quoted
    assert (plan.lead != "") == (place in ("prefill", "both")) and plan.text.endswith(plan.lead)
    assert (plan.budget.evidence_tokens > 0) == (place != "off")
    _, off = _plan("off", backend)
    assert len(backend.tokenize(plan.text)) - len(backend.tokenize(off.text)) == plan.budget.evidence_tokens


@pytest.mark.parametrize("n_ctx", [160, 200, 260, 400])
def test_the_evidence_never_takes_the_prompt_past_the_window_nor_refuses_it(n_ctx):
    backend = FakeBackend(n_ctx=n_ctx)
    _, plan = _plan("both", backend, max_tokens=16)
    assert len(backend.tokenize(plan.text)) + 16 <= n_ctx


def test_evidence_is_only_from_passages_the_prompt_shows():
    _, plan = _plan("last", max_k=1, min_k=1, relevance_floor=0.6)  # the garden passage is below the floor
    assert [h.chunk_id for h in plan.hits] == ["a"] and {e.chunk_id for e in plan.evidence} == {"a"}


def test_an_answers_evidence_survives_its_json():
    _, plan = _plan("last")
    d = {"answer": "128", "sources": [], "budget": {"target_ttft_s": None, "predicted_ttft_s": 0.1,
                                                    "candidates": 2, "chosen": 1},
         "timings": {"prompt_tokens": 1, "cached_tokens": 0, "prefill_tokens": 1, "ttft_s": 0.1, "prefill_s": 0.1,
                     "decode_tokens": 1, "decode_s": 0.1, "total_s": 0.2},
         "evidence": [e.to_dict() for e in plan.evidence]}
    answer = Answer.from_dict(d)
    assert answer.evidence == tuple(plan.evidence)
    assert list(answer.to_dict()["evidence"][0])[:6] == ["text", "passage", "source", "location", "start", "end"]


# -- on the real parts ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, embedder, backend):
    from tests.conftest import prepared_pipeline

    from engine.llama_cpp.faults import settle

    p = prepared_pipeline(tmp_path_factory.mktemp("evidence"), embedder, backend)
    yield p
    p.close()
    # The passages its answers asked the engine to keep are warmed in the background: done before
    # the next module, whose measurements (a quick calibration) would otherwise share the engine.
    settle(backend.loop)


def _document_text(pipeline, source) -> str:
    return pipeline.document(source.doc_id).text().text


@pytest.mark.model
def test_every_answer_carries_evidence_from_its_prompt_with_exact_spans(pipeline):
    answer = pipeline.ask("How long should the dough rise before baking?", max_tokens=8)
    assert answer.evidence and sum(len(f"{e.about} {e.text}".split()) for e in answer.evidence) <= 60
    for e in answer.evidence:
        source = answer.sources[e.passage - 1]
        assert e.source == source.source and e.chunk_id == source.chunk_id
        assert _document_text(pipeline, source)[e.start:e.end] == e.text
    assert any("two hours" in e.text for e in answer.evidence)
    assert answer.budget.evidence_s > 0 and answer.budget.evidence_tokens > 0
    assert answer.to_dict()["evidence"][0]["text"] == answer.evidence[0].text


@pytest.mark.model
def test_the_stream_knows_the_evidence_before_its_first_text(pipeline):
    with pipeline.stream("What limits decode?", max_tokens=8) as stream:
        before = None
        for piece in stream:
            if piece and before is None:
                before = stream.evidence
        answer = stream.answer
    assert before is not None and before == answer.evidence


@pytest.mark.model
def test_the_stream_says_when_the_evidence_is_found_as_a_typed_event(pipeline):
    with pipeline.stream("What limits decode?", max_tokens=8) as stream:
        events = list(stream.events())
        answer = stream.answer
    assert isinstance(events[0], EvidenceFound) and events[0].evidence == answer.evidence
    assert isinstance(events[-1], AnswerDone) and events[-1].answer is answer  # the final answer, last
    assert events[1:-1] and all(isinstance(e, TextPiece) and e.text for e in events[1:-1])
    assert "".join(e.text for e in events[1:-1]) == answer.answer
    with pipeline.stream("What limits decode?", max_tokens=8) as stream:
        assert all(piece for piece in stream)  # iterated, only text: no empty piece marks the evidence


@pytest.mark.model
def test_a_question_no_passage_answers_is_declined_without_the_model(pipeline):
    answer = pipeline.ask("Who painted the Mona Lisa?", evidence_floor=5.0, max_tokens=8)
    assert answer.declined and answer.answer == DECLINED and answer.evidence == ()
    assert answer.timings.prompt_tokens == 0 and answer.timings.decode_tokens == 0 and not answer.sources
    assert answer.to_dict()["declined"] is True
    # A reader of the stream sees the decline ("rag ask" printed nothing before).
    with pipeline.stream("Who painted the Mona Lisa?", evidence_floor=5.0, max_tokens=8) as stream:
        assert [p for p in stream if p] == [DECLINED] and stream.answer.declined


@pytest.mark.model
def test_rag_ask_shows_the_evidence_before_the_answer(run, corpus, tmp_path):
    index = tmp_path / "index"
    run("ingest", corpus, "--index", index)
    shown = run("ask", "How long should the dough rise?", "--index", index, "--max-tokens", "8")
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.index("Evidence [") < shown.stdout.index("Sources")
    result = run("ask", "How long should the dough rise?", "--index", index, "--max-tokens", "8", "--json")
    d = json.loads(result.stdout)
    assert d["evidence"] and set(d["evidence"][0]) >= {"text", "passage", "source", "location", "start", "end"}
    assert d["cli"]["evidence_s"] is not None and d["cli"]["evidence_s"] <= d["cli"]["ttft_s"]


@pytest.mark.model
def test_the_service_streams_the_evidence_first_and_returns_it_everywhere(pipeline):
    from rag.service import LoopbackServer, ServiceSettings, create_app

    server = LoopbackServer(create_app(pipeline, ServiceSettings(rate_limit_per_minute=0)))
    try:
        body = {"question": "How long should the dough rise?", "max_tokens": 8}
        plain = httpx.post(f"{server.url}/v1/ask", json=body, timeout=120).json()
        assert plain["evidence"] and plain["evidence"][0]["source"] == "guide/cooking.rst"
        with httpx.stream("POST", f"{server.url}/v1/ask", json=body | {"stream": True}, timeout=120) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        assert "evidence" in events[0] and all("delta" in e for e in events[1:-1]) and "answer" in events[-1]
        assert events[0]["evidence"] == events[-1]["answer"]["evidence"]
        chat = httpx.post(f"{server.url}/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "How long should the dough rise?"}], "max_tokens": 8}).json()
        assert chat["evidence"] and chat["evidence"][0]["text"]
    finally:
        server.stop()


@pytest.mark.model
def test_a_question_naming_a_rare_word_the_documents_never_use_is_declined(pipeline):
    # "Kubernetes" is rare (a name) and in no document: whatever the best unit scores, it is declined;
    # "dough" is in them, and "enormous" is common: only another way of saying a thing.
    asked = pipeline.ask("How long should the dough rise in a Kubernetes pod?", max_tokens=8)
    assert asked.declined and asked.answer == DECLINED
    assert pipeline.evidence("How long should the dough rise in a Kubernetes pod?",
                             pipeline.search("dough rise", k=4)).unheard == ("Kubernetes",)
    kept = pipeline.ask("How long should the enormous dough rise?", max_tokens=8)
    assert not kept.declined
    # Floor 0 asks the model whatever the words.
    assert not pipeline.ask("How long should the dough rise in a Kubernetes pod?", evidence_floor=0.0,
                            max_tokens=8).declined


@pytest.mark.model
def test_the_answer_opens_with_its_evidence_where_asked(pipeline):
    with pipeline.stream("How long should the dough rise?", evidence="open", max_tokens=8) as stream:
        pieces = [p for p in stream if p]
        answer = stream.answer
    assert answer.evidence and pieces[0].startswith("[1] ")  # the reader sees the quote first
    assert " ".join(answer.evidence[0].text.split()) in answer.answer and answer.answer.startswith(pieces[0].strip())

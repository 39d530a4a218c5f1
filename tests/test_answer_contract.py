"""The answer's one declaration (rag.qa.answer): what it writes, reads back
and publishes, and the surfaces built on it carrying a field added to it
(pure logic: answers made by hand; tests/answer_contract.py checks the real
surfaces against the same schema)."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

import numpy as np

from engine.backend import Timings
from rag.mcp.tools import answered
from rag.qa.answer import ANSWER_CONTRACT, Answer, Budget, BudgetDecision, Evidence, Source
from rag.service.openai import Reply

from .answer_contract import missing_fields

TIMINGS = Timings(prompt_tokens=120, cached_tokens=20, prefill_tokens=100, ttft_s=0.5, decode_tokens=8,
                  prefill_s=0.4, decode_s=0.3, total_s=0.9)


def _answer(cls=Answer, **extra) -> Answer:
    decision = BudgetDecision("a.md:0", "a.md", 40, np.float32(0.8), 0.4, True, None)
    budget = Budget(target_ttft=2.0, predicted_ttft_s=0.45, candidates=8, chosen=1, decisions=(decision,))
    source = Source("a.md:0", "a.md", np.float32(0.8), location={"lines": [1, 4]}, context="A > B", doc_id="d1")
    evidence = Evidence(text="Prefill fills the cache.", passage=1, source="a.md", location=None, start=0, end=24,
                        about="Prefill", chunk_id="a.md:0", score=1.2)
    return cls(answer="It fills the cache [1].", sources=(source,), budget=budget, timings=TIMINGS, session="s1",
               turn=2, turns_shown=1, ungrounded=("[7]",), evidence=(evidence,), **extra)


def test_written_as_json_with_its_contract_names_and_read_back_equal():
    a = _answer()
    d = a.to_dict()
    json.dumps(d)  # numpy scores are written as plain numbers
    assert d["ungrounded_citations"] == ["[7]"] and d["budget"]["target_ttft_s"] == 2.0
    assert isinstance(d["sources"][0]["score"], float) and d["budget"]["decisions"][0]["chosen"] is True
    assert missing_fields(d) == []
    back = Answer.from_dict(json.loads(json.dumps(d)))
    assert back.to_dict() == d and back.ungrounded == ("[7]",) and back.budget.target_ttft == 2.0
    # A newer writer's field is left out; an older one's missing optional fields take their defaults.
    newer = dict(d, written_by_a_newer_version=1)
    assert Answer.from_dict(newer).to_dict() == d
    older = {k: v for k, v in d.items() if k not in ("turns_shown", "evidence", "declined")}
    assert Answer.from_dict(older).turns_shown == 0 and Answer.from_dict(older).evidence == ()


def test_the_schema_names_every_field_under_its_json_name():
    properties = ANSWER_CONTRACT.json_schema(by_alias=True)["properties"]
    names = {f.name for f in fields(Answer)} - {"ungrounded"} | {"ungrounded_citations"}
    assert set(properties) == names


@dataclass(frozen=True)
class AnswerWithAField(Answer):
    """The answer with one field more, as a change to the model would add it."""

    confidence: float = 0.0


def test_a_field_added_to_the_answer_reaches_every_surface_built_on_it():
    a = _answer(AnswerWithAField, confidence=0.75)
    assert a.to_dict()["confidence"] == 0.75  # rag ask --json, /v1/ask and the resident server's wire
    assert AnswerWithAField.from_dict(a.to_dict()) == a
    assert answered(a)["confidence"] == 0.75  # the MCP ask result
    assert answered(a)["sources"][0]["n"] == 1 and answered(a)["cost"]["passages_chosen"] == 1
    completion = Reply("c1", 0, "rag-budget", 64).completion(a)
    assert completion["rag"]["confidence"] == 0.75  # the OpenAI reply's extension
    assert completion["sources"] == a.to_dict()["sources"]

"""Pure prompt logic: the context-window fit, the layout and the cost model."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import FakeBackend
from prompt_budget import (
    SYSTEM_PROMPT,
    Candidate,
    ContextPassage,
    ContextTooSmall,
    build_messages,
    fit_to_context,
)


def test_fit_skips_a_long_candidate_for_a_shorter_one_after_it():
    plan = fit_to_context(
        [Candidate(50, 0.9), Candidate(90, 0.8), Candidate(20, 0.7)],
        fixed_tokens=30, n_ctx=128, reserve_tokens=16, max_k=3,
    )
    assert plan.chosen == (0, 2)
    assert plan.dropped == ((1, "context"),)
    assert plan.prompt_tokens == 100


def test_fit_refuses_when_the_fixed_part_alone_does_not_fit():
    with pytest.raises(ContextTooSmall):
        fit_to_context([], fixed_tokens=120, n_ctx=128, reserve_tokens=16, max_k=3)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])  # a property, not a speed
@given(
    tokens=st.lists(st.integers(min_value=1, max_value=600), max_size=25),
    fixed=st.integers(min_value=0, max_value=500),
    n_ctx=st.integers(min_value=512, max_value=4096),
    reserve=st.integers(min_value=1, max_value=512),
    max_k=st.integers(min_value=0, max_value=25),
)
def test_fit_never_exceeds_the_context_window(tokens, fixed, n_ctx, reserve, max_k):
    candidates = [Candidate(t, 1.0 - i / 100) for i, t in enumerate(tokens)]
    try:
        plan = fit_to_context(candidates, fixed_tokens=fixed, n_ctx=n_ctx, reserve_tokens=reserve, max_k=max_k)
    except ContextTooSmall:
        assert fixed + reserve > n_ctx
        return
    assert plan.prompt_tokens + reserve <= n_ctx
    assert plan.prompt_tokens == fixed + sum(tokens[i] for i in plan.chosen)
    assert len(plan.chosen) <= max(max_k, 0)
    assert sorted(plan.chosen + tuple(i for i, _ in plan.dropped)) == list(range(len(tokens)))


def test_system_prompt_is_the_stable_prefix_of_every_prompt():
    backend = FakeBackend()
    a = backend.tokenize(backend.render(build_messages("first question?", [ContextPassage("a.md", "alpha")])))
    b = backend.tokenize(backend.render(build_messages("other?", [ContextPassage("b.md", "beta gamma")])))
    system = backend.tokenize(backend.render(build_messages("q", [])[:1]))
    common = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    assert build_messages("q", [])[0].content == SYSTEM_PROMPT
    assert common >= len(system) - 1  # all but the template's closing of the system turn at most


def test_passages_come_before_the_question_with_their_sources():
    user = build_messages("What is X?", [ContextPassage("a.md", "X is one."), ContextPassage("b.pdf", "X is two.", 3)])[1]
    text = user.content
    assert text.index("[1] (a.md)") < text.index("[2] (b.pdf, page 3)") < text.index("What is X?")




def test_canonical_order_is_by_source_then_position():
    from prompt_budget import canonical_order

    assert canonical_order([("b.md", 0), ("a.md", 3), ("a.md", 1)]) == [2, 1, 0]


def test_summary_follows_the_system_prompt_in_the_system_message():
    from prompt_budget import system_message

    assert system_message().content == SYSTEM_PROMPT
    assert system_message("  ").content == SYSTEM_PROMPT
    with_summary = system_message("We talked about gzip.").content
    assert with_summary.startswith(SYSTEM_PROMPT) and with_summary.endswith("We talked about gzip.")


def test_a_named_collections_prompt_names_it_ahead_of_and_in_each_passage():
    # Issue 46: the same text in two collections is two passages to an engine keeping passage KV by its
    # tokens, and the default collection's prompts stay byte for byte as they were before collections.
    from prompt_budget.layout import ContextPassage, passage_body, user_message

    default = ContextPassage("a.md", "Hi", page=2)
    named = ContextPassage("a.md", "Hi", page=2, collection="acme")
    assert passage_body(default) == " (a.md, page 2)\nHi"
    assert passage_body(named) == " (a.md, page 2; collection acme)\nHi"
    assert user_message("Q?", [default]) == "Context:\n\n[1] (a.md, page 2)\nHi\n\nQuestion: Q?"
    assert user_message("Q?", [named], collection="acme").startswith(
        "Context (collection acme):\n\n[1] (a.md, page 2; collection acme)\nHi")

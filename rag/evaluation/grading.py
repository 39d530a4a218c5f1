"""Answers scored against gold key facts, automatically.

A question file for ``rag bench answers`` is JSON lines:
``{"question": str, "gold": [source, ...], "facts": [[alternative, ...], ...],
"reference": str}``, optionally with ``"answerable": false`` (a question
the documents do not answer: no gold, no facts), ``"lang"`` and ``"id"``. Each fact is a list of alternatives, each a regular
expression (most are plain words); an answer is right when every fact has
an alternative found in it, case-insensitive, whitespace normalised and
Markdown emphasis removed. ``reference`` (optional) is a short right answer
for a token F1 as in SQuAD.

Does not: judge fluency, or whether the citations support the text (see
``rag.qa.citations`` for those that were not in the prompt).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..errors import RagError
from .questions import json_lines


@dataclass(frozen=True)
class GoldQuestion:
    """A question, the sources that answer it, the key facts a right
    answer states (alternatives each) and a reference answer."""

    question: str
    gold: tuple[str, ...]
    facts: tuple[tuple[str, ...], ...]
    reference: str = ""
    answerable: bool = True  # False: the documents do not answer it (no gold, no facts)
    lang: str = ""  # the question's language where the file says it
    id: str = ""


def _gold_question(raw: dict) -> GoldQuestion:
    facts = tuple(tuple(str(a) for a in fact) for fact in raw["facts"])
    try:
        for fact in facts:
            for alternative in fact:
                re.compile(alternative)
    except re.error as exc:
        raise ValueError(f"a fact that is not a regular expression: {exc}") from None
    answerable = bool(raw.get("answerable", True))
    if answerable and (not facts or not all(facts)):
        raise ValueError("each answerable question needs facts, each fact an alternative")
    return GoldQuestion(str(raw["question"]), tuple(str(g) for g in raw["gold"]), facts,
                        str(raw.get("reference", "")), answerable, str(raw.get("lang", "")), str(raw.get("id", "")))


def load_gold(path: Path) -> list[GoldQuestion]:
    """The questions of a JSON-lines file; RagError naming the line if one
    is malformed, has no facts, or holds a pattern that is not a regex."""
    questions = json_lines(path, _gold_question, "a question with 'question', 'gold' and 'facts'")
    if not questions:
        raise RagError(f"{path}: no questions in the file")
    return questions


def normalise(text: str) -> str:
    """Lower case, Markdown emphasis (``*``) and code marks removed, whitespace collapsed.

    ``normalise("Use  `json.LOADS`**!**") -> "use json.loads!"``
    """
    text = re.sub(r"[`*]", "", text)  # not "_": it is part of names (lru_cache)
    return re.sub(r"\s+", " ", text).strip().lower()


def facts_found(answer: str, facts: tuple[tuple[str, ...], ...]) -> list[bool]:
    """For each fact, whether one of its alternatives is in ``answer``."""
    text = normalise(answer)
    return [any(re.search(a, text, re.IGNORECASE) for a in fact) for fact in facts]


def is_right(answer: str, question: GoldQuestion) -> bool:
    """Whether ``answer`` states every key fact of ``question``."""
    return all(facts_found(answer, question.facts))


def tokens(text: str) -> list[str]:
    """Words for F1: lower case, punctuation and articles dropped (SQuAD's rule).

    ``tokens("The json.loads() function!") -> ["json", "loads", "function"]``
    """
    words = re.findall(r"[a-z0-9]+", normalise(text))
    return [w for w in words if w not in ("a", "an", "the")]


def token_f1(answer: str, reference: str) -> float:
    """Token F1 of ``answer`` against ``reference``; 0.0 when either is empty."""
    ours, theirs = tokens(answer), tokens(reference)
    common = sum((Counter(ours) & Counter(theirs)).values())
    if not common:
        return 0.0
    precision, recall = common / len(ours), common / len(theirs)
    return 2 * precision * recall / (precision + recall)

"""Retrieval quality against questions with known answers.

A question file is JSON lines: ``{"question": str, "gold": [source, ...]}``,
the gold sources being paths relative to the folder that was ingested. A
question counts as found at k when any gold source is among the first k
results' sources.

Does not: judge answers, only what retrieval returns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence, TypeVar

from ..errors import RagError

T = TypeVar("T")


@dataclass(frozen=True)
class Question:
    """A question and the sources that answer it."""

    question: str
    gold: tuple[str, ...]


def json_lines(path: Path, parse: Callable[[dict], T], what: str) -> list[T]:
    """``parse`` of each object of a JSON-lines file, blank lines skipped;
    RagError naming the file if it cannot be read, or the line where
    ``parse`` fails (ValueError, KeyError, TypeError), saying ``what`` a line
    should be."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise RagError(f"{path}: cannot read the questions file ({exc})") from None
    parsed = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            parsed.append(parse(json.loads(line)))
        except (ValueError, KeyError, TypeError) as exc:
            raise RagError(f"{path}:{number}: not {what} ({exc})") from None
    return parsed


def load_questions(path: Path) -> list[Question]:
    """The questions of a JSON-lines file; RagError naming the line if one is malformed."""
    return json_lines(path, lambda raw: Question(str(raw["question"]), tuple(str(g) for g in raw["gold"])),
                      "a question object with 'question' and 'gold'")


def gold_ranks(search: Callable[[str, int], Sequence[str]], questions: Sequence[Question], depth: int) -> list[int | None]:
    """For each question, the 1-based rank of the first result from a gold
    source among ``search(question, depth)``'s, or None if there is none."""
    found_at: list[int | None] = []
    for q in questions:
        sources = list(search(q.question, depth))
        found_at.append(next((i for i, s in enumerate(sources, start=1) if s in q.gold), None))
    return found_at


def metrics_from_ranks(found_at: Sequence[int | None], ks: Sequence[int]) -> dict[str, float]:
    """``{"recall@K": share found within K, ..., "mrr": mean reciprocal rank}``."""
    n = len(found_at) or 1
    result = {f"recall@{k}": sum(1 for r in found_at if r is not None and r <= k) / n for k in ks}
    result["mrr"] = sum(1.0 / r for r in found_at if r is not None) / n
    return result


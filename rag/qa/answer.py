"""The result of a question: the answer, its sources, the budget and the
timings, and their JSON form (``to_dict``, the ``rag ask --json`` contract)
read back (``from_dict``) where an answer crosses a process boundary.

Does not: compute any of it (the pipeline does).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Mapping

from engine.backend import Timings

from ..ingest.formats import Location


@dataclass(frozen=True)
class Source:
    """A chunk that was put into the prompt: its file, score, and where it
    lies (``location``: page, slide, sheet and rows, chapter or lines;
    ``context``: the title and headings above it). ``doc_id`` names its
    document (``GET /v1/documents/{doc_id}/text``) and ``char_start``/
    ``char_end`` its span in that document's text, so it can be opened and shown."""

    chunk_id: str
    source: str
    score: float
    page: int | None = None
    location: dict[str, object] | None = None
    context: str = ""
    doc_id: str | None = None
    char_start: int | None = None
    char_end: int | None = None

    def to_dict(self) -> dict[str, object]:
        return {"chunk_id": self.chunk_id, "source": self.source, "score": self.score, "page": self.page,
                "location": self.location, "context": self.context,
                "doc_id": self.doc_id, "char_start": self.char_start, "char_end": self.char_end}

    @classmethod
    def from_dict(cls, d: dict) -> "Source":
        """The source :meth:`to_dict` gave ``d`` for."""
        return cls(**known(cls, d))

    def where(self) -> str:
        """The source as a reader cites it: ``"deck.pptx, slide 3"``, or
        with its section when it has no location (``"a.docx § Budget"``)."""
        return where(self.source, self.location, self.context)


EVIDENCE_FIELDS = ("text", "passage", "source", "location", "start", "end", "about", "chunk_id", "score")


@dataclass(frozen=True)
class Evidence:
    """A unit as shown: ``document[start:end] == text``, ``passage`` is its
    1-based passage number in the prompt, ``location`` the hit's, its
    ``lines`` narrowed to the unit's own."""

    text: str
    about: str
    passage: int
    source: str
    location: dict | None
    start: int
    end: int
    chunk_id: str
    score: float

    def to_dict(self) -> dict:
        """The JSON object of an answer's ``"evidence"`` list: text, passage,
        source, location, start, end (the contract), then about, chunk_id, score."""
        return {name: getattr(self, name) for name in EVIDENCE_FIELDS}

    @classmethod
    def from_dict(cls, d: Mapping) -> "Evidence":
        """The inverse of :meth:`to_dict`; ``about``, ``chunk_id`` and ``score`` may be missing."""
        return cls(**{"about": "", "chunk_id": "", "score": 0.0, **{k: d[k] for k in EVIDENCE_FIELDS if k in d}})


def where(source: str, location: dict[str, object] | None, context: str = "") -> str:
    """``source`` with its location, else the innermost heading above it.

    ``where("q.xlsx", {"sheet": "Q1", "rows": [2, 9]}) -> "q.xlsx, sheet Q1, rows 2-9"``
    """
    label = Location.from_dict(location).label()
    if label:
        return f"{source}, {label}"
    section = context.rsplit(" > ", 1)[-1] if " > " in context else ""
    return f"{source} § {section}" if section else source


@dataclass(frozen=True)
class BudgetDecision:
    """What the budgeter did with one candidate chunk."""

    chunk_id: str
    source: str
    tokens: int
    score: float
    ttft_s: float  # predicted TTFT with this and every chunk chosen before it
    chosen: bool
    reason: str | None  # why dropped: ttft, context, relevance, near-duplicate, max_k
    trimmed: bool = False
    spliced: bool = False  # its KV placed from the engine's passage store, not evaluated

    def to_dict(self) -> dict[str, object]:
        return {
            "chunk_id": self.chunk_id, "source": self.source, "tokens": self.tokens, "score": self.score,
            "ttft_s": self.ttft_s, "chosen": self.chosen, "reason": self.reason, "trimmed": self.trimmed,
            "spliced": self.spliced,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "BudgetDecision":
        """The decision :meth:`to_dict` gave ``d`` for."""
        return cls(**known(cls, d))


@dataclass(frozen=True)
class Budget:
    """How much context was chosen and what it was predicted to cost.

    ``target_ttft`` is the target it was planned for (seconds; None for
    none); ``predicted_ttft_s`` is the cost model's central prediction;
    ``planned_ttft_s`` the one with the safety margin the target was held to.
    """

    target_ttft: float | None
    predicted_ttft_s: float
    candidates: int
    chosen: int
    planned_ttft_s: float | None = None
    feasible: bool = True
    safety: float = 1.0
    decisions: tuple[BudgetDecision, ...] = ()
    cached_tokens: int = 0  # prompt tokens expected in the KV cache when planned
    load_wait_s: float = 0.0  # expected wait behind other requests, planned for
    cut_for_load: int = 0  # passages fewer than an idle engine would have taken
    turns_left_out: int = 0  # recent turns the context could not hold beside passages (the summary is behind)
    predicted_prefill_s: float = 0.0  # of predicted_ttft_s, the prompt's evaluation (and loads of held passages)
    behind: int = 0  # questions asked and not yet planned when it was: room was left for each
    coming: float = 0.0  # questions expected before its first token: room was left for them too
    evidence_s: float = 0.0  # finding the evidence (counted in the time spent before the prompt)
    evidence_tokens: int = 0  # prompt tokens the evidence added (quoted, or written as the answer's start)

    def to_dict(self) -> dict[str, object]:
        return {
            "target_ttft_s": self.target_ttft,
            "predicted_ttft_s": self.predicted_ttft_s,
            "candidates": self.candidates,
            "chosen": self.chosen,
            "planned_ttft_s": self.planned_ttft_s,
            "feasible": self.feasible,
            "safety": self.safety,
            "cached_tokens": self.cached_tokens,
            "load_wait_s": self.load_wait_s,
            "cut_for_load": self.cut_for_load,
            "turns_left_out": self.turns_left_out,
            "predicted_prefill_s": self.predicted_prefill_s,
            "behind": self.behind,
            "coming": self.coming,
            "evidence_s": self.evidence_s,
            "evidence_tokens": self.evidence_tokens,
            "decisions": [d.to_dict() for d in self.decisions],
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Budget":
        """The budget :meth:`to_dict` gave ``d`` for."""
        values = known(cls, d) | {"target_ttft": d.get("target_ttft_s")}
        values["decisions"] = tuple(BudgetDecision.from_dict(x) for x in d.get("decisions", ()))
        return cls(**values)


DECLINED = "The documents do not seem to answer this question."
# The same, in the question's language (rag.index.language.detect); English where none is written.
DECLINED_IN = {"en": DECLINED, "fr": "Les documents ne semblent pas répondre à cette question.",
               "de": "Die Dokumente scheinen diese Frage nicht zu beantworten.",
               "es": "Los documentos no parecen responder a esta pregunta.",
               "it": "I documenti non sembrano rispondere a questa domanda."}


@dataclass(frozen=True)
class Answer:
    """An answer with what it came from and what it cost."""

    answer: str
    sources: tuple[Source, ...]
    budget: Budget
    timings: Timings
    session: str | None = None  # the conversation it belongs to
    turn: int | None = None  # its number in that conversation
    turns_shown: int = 0  # earlier turns replayed in its prompt
    ungrounded: tuple[str, ...] = ()  # citations removed: passages or files its prompt did not show
    evidence: tuple[Evidence, ...] = ()  # the sentences of its passages that best answer it, found without the model
    declined: bool = False  # no passage seemed to answer: said so without asking the model

    def to_dict(self) -> dict[str, object]:
        """The ``rag ask --json`` object of DESIGN.md."""
        return {
            "answer": self.answer,
            "sources": [s.to_dict() for s in self.sources],
            "budget": self.budget.to_dict(),
            "timings": self.timings.to_dict(),
            "session": self.session,
            "turn": self.turn,
            "turns_shown": self.turns_shown,
            "ungrounded_citations": list(self.ungrounded),
            "evidence": [e.to_dict() for e in self.evidence],
            "declined": self.declined,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Answer":
        """The answer :meth:`to_dict` gave ``d`` for (fields it does not know
        are left out, so a newer writer's object still reads):
        ``Answer.from_dict(a.to_dict()) == a``."""
        return cls(answer=d["answer"], sources=tuple(Source.from_dict(x) for x in d["sources"]),
                   budget=Budget.from_dict(d["budget"]), timings=Timings(**known(Timings, d["timings"])),
                   session=d.get("session"), turn=d.get("turn"), turns_shown=d.get("turns_shown", 0),
                   ungrounded=tuple(d.get("ungrounded_citations", ())),
                   evidence=tuple(Evidence.from_dict(e) for e in d.get("evidence", ())),
                   declined=bool(d.get("declined", False)))


def known(cls, d: dict) -> dict:
    """The items of ``d`` that are fields of the dataclass ``cls``.

    ``known(Source, {"source": "a.md", "new": 1}) -> {"source": "a.md"}``
    """
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}

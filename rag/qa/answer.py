"""The result of a question: the answer, its sources, the budget and the
timings. These dataclasses are the one declaration of the answer's JSON
contract (``rag ask --json``, ``/v1/ask``, the resident server's wire, the
OpenAI reply's ``rag`` extension, the MCP ``ask`` result): pydantic reads
them (:data:`ANSWER_CONTRACT`) to write an answer (``to_dict``), read one
back (``from_dict``) and publish its JSON schema, so a field added here is
in every one of them.

Does not: compute any of it (the pipeline does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Mapping

from pydantic import ConfigDict, Field, TypeAdapter

from engine.backend import Timings

# The JSON names that differ from the attributes' are aliases; either is read.
_CONTRACT = ConfigDict(populate_by_name=True, serialize_by_alias=True)

from ..ingest import Location


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
        """The JSON object of an answer's ``"sources"`` list."""
        return _dump(self)

    def where(self) -> str:
        """The source as a reader cites it: ``"deck.pptx, slide 3"``, or
        with its section when it has no location (``"a.docx § Budget"``)."""
        return where(self.source, self.location, self.context)


@dataclass(frozen=True)
class Evidence:
    """A unit as shown: ``document[start:end] == text``, ``passage`` is its
    1-based passage number in the prompt, ``location`` the hit's, its
    ``lines`` narrowed to the unit's own."""

    text: str
    passage: int
    source: str
    location: dict | None
    start: int
    end: int
    about: str = ""
    chunk_id: str = ""
    score: float = 0.0

    def to_dict(self) -> dict:
        """The JSON object of an answer's ``"evidence"`` list."""
        return _dump(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> "Evidence":
        """The inverse of :meth:`to_dict`; ``about``, ``chunk_id`` and ``score`` may be missing."""
        return _adapter(cls).validate_python(d)


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


@dataclass(frozen=True)
class Budget:
    """How much context was chosen and what it was predicted to cost.

    ``target_ttft`` is the target it was planned for (seconds; None for
    none); ``predicted_ttft_s`` is the cost model's central prediction;
    ``planned_ttft_s`` the one with the safety margin the target was held to.
    """

    target_ttft: Annotated[float | None, Field(alias="target_ttft_s")]
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
        """The ``budget`` object of the answer's contract, its decisions with it."""
        return _dump(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Budget":
        """The budget :meth:`to_dict` gave ``d`` for."""
        return _adapter(cls).validate_python(d)


DECLINED = "The documents do not seem to answer this question."
# The same, in the question's language (rag.text.language.detect); English where none is written.
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
    # Citations removed: passages or files its prompt did not show.
    ungrounded: Annotated[tuple[str, ...], Field(alias="ungrounded_citations")] = ()
    evidence: tuple[Evidence, ...] = ()  # the sentences of its passages that best answer it, found without the model
    declined: bool = False  # no passage seemed to answer: said so without asking the model

    def to_dict(self) -> dict[str, object]:
        """The ``rag ask --json`` object: every field, JSON-typed, under its
        contract name (``ungrounded_citations``, ``budget.target_ttft_s``)."""
        return _dump(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Answer":
        """The answer :meth:`to_dict` gave ``d`` for (fields it does not know
        are left out, so a newer writer's object still reads):
        ``Answer.from_dict(a.to_dict()) == a``."""
        return _adapter(cls).validate_python(d)


for _contract in (Source, Evidence, BudgetDecision, Budget, Answer):
    _contract.__pydantic_config__ = _CONTRACT
ANSWER_CONTRACT = TypeAdapter(Answer)  # the answer's JSON schema: ``ANSWER_CONTRACT.json_schema(by_alias=True)``
_ADAPTERS: dict[type, TypeAdapter] = {Answer: ANSWER_CONTRACT}


def _adapter(cls: type) -> TypeAdapter:
    if cls not in _ADAPTERS:
        _ADAPTERS[cls] = TypeAdapter(cls)
    return _ADAPTERS[cls]


def _dump(value) -> dict:
    # Scores come from FAISS and NumPy as numpy scalars: written as the Python numbers they hold.
    return _adapter(type(value)).dump_python(value, mode="json", warnings=False,
                                             fallback=lambda v: v.item() if hasattr(v, "item") else str(v))


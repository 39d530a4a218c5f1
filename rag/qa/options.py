"""The options of one question, validated once.

:class:`AskOptions` carries a question's options from wherever it was asked
(the CLI, the service, the Python API) to the prompt planner, unchanged;
every check of a value's range happens here, so a bad value is one clear
error whoever sent it.

Does not: know defaults that depend on the set-up (the target TTFT and the
retrieval mode default to the pipeline's settings when left None).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal, Optional

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

from ..conversations.store import check_session_id
from ..errors import RagError, UnknownOption
from .keywords import check_known
from ..index.collection_names import DEFAULT_COLLECTION, check_collection_name
from ..retrieval.scope import Scope

if TYPE_CHECKING:
    from ..settings import Settings

DEFAULT_MAX_TOKENS = 256
DEFAULT_CANDIDATES = 20  # top-N retrieved for the budgeter to choose from
DEFAULT_MAX_K = 8
DEFAULT_MIN_K = 1
DEFAULT_RELEVANCE_FLOOR = 0.05  # cosine; below it a chunk is noise, whatever the budget
MAX_CANDIDATES = 1000  # more is never useful to a budget, and costs memory
MAX_TARGET_TTFT_S = 600.0  # the most a request body or tool call may name: no person waits longer for a first word
# Where the evidence goes (see rag.qa.evidence): quoted after the passages ("last"), written as
# the start of the answer for the model ("prefill"), both, as the start of the answer the reader
# sees too ("open": the answer keeps what the evidence found, issue 54), or nowhere ("off": the
# prompt of before issue 36).
EVIDENCE_PLACES = ("last", "prefill", "both", "open", "off")
# "open" on the tuning halves of issue 54 (2 s target): answers right 32/41, 28/52 and 33/50 where "last"
# gave 13/41, 18/52 and 16/50 (Sphinx, Exim, man pages): a 135M model drops what the evidence found.
DEFAULT_EVIDENCE = "open"


def valid_text(text: object, what: str = "the question") -> str:
    """``text`` if it is a string that can be written as UTF-8; else a
    RagError (a command-line argument with bytes that are not UTF-8 arrives
    holding lone surrogates)."""
    if not isinstance(text, str):
        raise RagError(f"{what} must be text, not {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise RagError(f"{what} is not valid text: it holds bytes that are not UTF-8") from None
    return text


def valid_search(query: object, k: int, scope: "Scope | dict | None") -> tuple[str, Scope | None]:
    """The query stripped and the scope validated, for a search of ``k``
    chunks; a RagError for an empty query, a ``k`` out of range or a bad
    scope."""
    query = valid_text(query, "the query").strip()
    if not query:
        raise RagError("the query is empty; pass some text to search for")
    if not 1 <= k <= MAX_CANDIDATES:
        raise RagError(f"k must be between 1 and {MAX_CANDIDATES}, not {k}")
    if scope is not None and not isinstance(scope, Scope):
        scope = AskOptions.of(scope=scope).scope
    return query, scope


def _valid_collection(value: str) -> str:
    try:
        return check_collection_name(value)
    except RagError as exc:
        raise ValueError(str(exc)) from None


# A collection's name wherever a request names one (asks, searches, uploads): checked the same way.
CollectionName = Annotated[str, AfterValidator(_valid_collection)]


# The front ends a question's option can be offered on: the command line (``rag ask``, ``rag chat``), the
# HTTP bodies (``POST /v1/ask``, the OpenAI chat body's extra fields, and so the resident server's wire),
# MCP's ``ask`` tool, and the LangChain retriever's fields.
SURFACES = ("cli", "http", "mcp", "langchain")


@dataclass(frozen=True)
class Offered:
    """Where an option of :class:`AskOptions` is offered, declared beside
    it (``Annotated[int, Offered("cli", "http", flags=("-k",))]``): every
    front end builds its own argument from the option's type, bounds,
    default and description, read by :func:`offered`.

    ``flags``: command-line flags besides ``--the-name``; ``wire``: its
    name in request bodies where that is not the option's own
    (``target_ttft_s``)."""

    on: tuple[str, ...]
    flags: tuple[str, ...] = ()
    wire: str | None = None

    def __init__(self, *on: str, flags: tuple[str, ...] = (), wire: str | None = None) -> None:
        unknown = set(on) - set(SURFACES)
        if unknown:
            raise ValueError(f"unknown surface {sorted(unknown)}; known: {', '.join(SURFACES)}")
        object.__setattr__(self, "on", on)
        object.__setattr__(self, "flags", flags)
        object.__setattr__(self, "wire", wire)


@dataclass(frozen=True)
class OfferedOption:
    """One option as a front end offers it: ``name`` in AskOptions,
    ``wire`` in request bodies, its pydantic ``field`` (type, bounds,
    default, description) and its command-line ``flags``."""

    name: str
    wire: str
    field: FieldInfo
    flags: tuple[str, ...]

    def words(self, default: bool = True) -> str:
        """Its description, with its default where it has one (see :meth:`AskOptions.describe`)."""
        return _words(self.field, default)


def _words(field: FieldInfo, default: bool) -> str:
    # A number or word is worth showing; an empty scope or a switch left off is not.
    plain = isinstance(field.default, (int, float, str)) and not isinstance(field.default, bool)
    shown = field.default if default and plain else None
    return f"{field.description} (default {shown})" if shown is not None else str(field.description)


def offered(surface: str, options: "type[AskOptions] | None" = None) -> list[OfferedOption]:
    """The options of ``options`` (default :class:`AskOptions`) offered on
    ``surface`` (one of :data:`SURFACES`), in declaration order."""
    if surface not in SURFACES:
        raise ValueError(f"unknown surface {surface!r}; known: {', '.join(SURFACES)}")
    found = []
    for name, field in (options or AskOptions).model_fields.items():
        where = next((m for m in field.metadata if isinstance(m, Offered)), None)
        if where is not None and surface in where.on:
            found.append(OfferedOption(name, where.wire or name, field,
                                       where.flags + ("--" + name.replace("_", "-"),)))
    return found


class AskOptions(BaseModel):
    """How to answer one question.

    ``target_ttft``: seconds to first token to plan for (None: the
    pipeline's default; ``no_target`` for none at all). ``max_tokens``: most
    answer tokens. ``candidates``: chunks retrieved for the budgeter;
    ``min_k``/``max_k``: fewest and most of them in the prompt.
    ``retrieval``: hybrid, dense or bm25 (None: the pipeline's). ``scope``:
    the documents to draw on (source globs and file types; default all),
    applied inside retrieval, before the budget. ``collection``: the
    collection those documents are in (retrieval never leaves it). ``session``:
    the conversation it continues. ``expected_wait_s``: time the request is expected to
    wait for the engine behind others; the budget plans for it.
    ``refuse_late``: refuse (Overloaded) a question that cannot meet its
    target under the engine's load even with no passages, instead of
    answering it late. ``passage_order``: the chosen passages by
    ``source`` and position (overlapping retrievals share prefixes), or by
    relevance, the best first (``relevance_first``) or nearest the question
    (``relevance_last``). ``stop``: end the answer where it starts writing
    prompt text (``rag.qa.citations.STOP_SEQUENCES``). ``evidence``: where
    the sentences that best answer the question (found without the model)
    go: quoted after the passages (``last``), as the start of the answer
    (``prefill``), ``both``, as the start of the answer its reader sees
    (``open``: the answer opens with the quotes, the model goes on), or
    ``off`` (still reported, not prompted).
    ``evidence_floor``: below this evidence score the answer says the
    documents do not seem to answer, without asking the model (0: never;
    None: the pipeline's setting).
    ``evidence_embed``: rank the evidence by embedding similarity too.
    ``cache_scope``: whose cached cells the engine may reuse for this
    prompt beyond the shared system prompt (a service's holder and
    collection; "" the local user's): another scope's prompts, and so their
    questions and conversations, are never read back through the cache.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Each option's type, bounds, default and words are declared here once; ``Offered`` says which front
    # ends offer it, and each builds its argument from this declaration (``offered(surface)``).
    # The command line sets the target and the retrieval mode as settings (--target-ttft, --retrieval: rag.cli.common).
    target_ttft: Annotated[Optional[float], Offered("http", "mcp", "langchain", wire="target_ttft_s")] = Field(
        None, gt=0, description="Seconds to first token to plan the prompt for")
    no_target: Annotated[bool, Offered("http")] = Field(
        False, description="Plan for no TTFT target at all (the target is then ignored)")
    max_tokens: Annotated[int, Offered("cli", "http", "mcp", "langchain")] = Field(
        DEFAULT_MAX_TOKENS, ge=1, description="Most tokens in the answer")
    candidates: Annotated[int, Offered("cli", "http", "langchain")] = Field(
        DEFAULT_CANDIDATES, ge=1, le=MAX_CANDIDATES, description="Chunks retrieved for the budgeter to choose from")
    max_k: Annotated[int, Offered("cli", "http", "langchain", flags=("-k",))] = Field(
        DEFAULT_MAX_K, ge=1, description="Most chunks in the prompt")
    min_k: Annotated[int, Offered("langchain")] = Field(DEFAULT_MIN_K, ge=0, description="Fewest chunks in the prompt")
    relevance_floor: float = DEFAULT_RELEVANCE_FLOOR
    retrieval: Annotated[Optional[Literal["dense", "bm25", "hybrid"]], Offered("http")] = Field(
        None, description="How candidates are found")
    # The command line builds the scope from --source and --type (rag.cli.common.scope_of).
    scope: Annotated[Scope, Offered("http", "mcp")] = Field(Scope(), description=(
        'Only these documents: {"sources": [glob, ...], "types": ["pdf", ...]}; applied inside retrieval, '
        "before the budget"))
    collection: Annotated[CollectionName, Offered("cli", "http", "mcp", flags=("-c",))] = Field(
        DEFAULT_COLLECTION, description="The collection to draw on: its documents only")
    session: Annotated[Optional[str], Offered("cli", "http", "mcp")] = Field(
        None, max_length=128, description="Continue (or start) the conversation with this id")
    expected_wait_s: float = Field(0.0, ge=0)
    refuse_late: bool = False
    passage_order: Literal["source", "relevance_first", "relevance_last"] = "source"
    stop: bool = True
    evidence: Annotated[Literal["last", "prefill", "both", "open", "off"], Offered("http")] = Field(
        DEFAULT_EVIDENCE, description="Where the evidence goes in the prompt")
    evidence_floor: Annotated[Optional[float], Offered("http")] = Field(
        None, ge=0, description="Evidence score under which the answer says the documents do not answer")
    evidence_embed: Annotated[bool, Offered("http")] = Field(
        False, description="Rank the evidence by embedding similarity too")
    # Whose cached cells the prompt may reuse beyond the shared system prompt: set by a service for each
    # holder and collection (rag.service.owners.cache_scope), never by a request body; "": the local user's.
    cache_scope: str = Field("", max_length=64, pattern=r"^[0-9a-f.]*$")

    @field_validator("target_ttft", "relevance_floor", "expected_wait_s", "evidence_floor")
    @classmethod
    def _finite(cls, value):
        if value is not None and not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value

    @field_validator("session")
    @classmethod
    def _session(cls, value):
        if value is not None:
            try:
                check_session_id(value)
            except RagError as exc:
                raise ValueError(str(exc)) from None
        return value

    @model_validator(mode="after")
    def _k_range(self):
        if self.min_k > self.max_k:
            raise ValueError(f"min_k {self.min_k} is more than max_k {self.max_k}")
        return self

    @classmethod
    def of(cls, options: "AskOptions | None" = None, **changes) -> "AskOptions":
        """``options`` (default: all defaults) with ``changes`` applied and
        validated; a RagError naming the option for any bad value."""
        base = options.model_dump() if options is not None else {}
        check_known("ask", changes, cls.model_fields, UnknownOption)  # a misspelt option is refused, not ignored
        try:
            return cls(**(base | changes))
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first.get("loc", ())) or "options"
            message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
            raise RagError(f"{field}: {message}") from None

    @classmethod
    def describe(cls, name: str, default: bool = True) -> str:
        """The words for option ``name`` that every front end shows, with
        its default when it has one (``"Most chunks in the prompt (default 8)"``)."""
        return _words(cls.model_fields[name], default)

    def wire(self) -> dict[str, object]:
        """The options offered on HTTP, as a request body carries them (by
        wire name, JSON values): what the resident client sends, read back
        by ``rag.service.schemas.AskBody``."""
        values = self.model_dump(mode="json")
        return {o.wire: values[o.name] for o in offered("http", type(self))}

    def resolved(self, settings: "Settings") -> "AskOptions":
        """These options with the set-up's defaults written in, once, where
        a question enters an answerer: the target (``no_target`` where
        neither names one), the retrieval mode and the evidence floor."""
        target = None if self.no_target else (self.target_ttft if self.target_ttft is not None
                                                 else settings.target_ttft)
        return self.model_copy(update={
            "target_ttft": target, "no_target": target is None, "retrieval": self.retrieval or settings.retrieval,
            "evidence_floor": self.evidence_floor if self.evidence_floor is not None else settings.evidence_floor})

    def target(self, default: float | None = None) -> float | None:
        """The TTFT target to plan for, in seconds (None: none): the
        options' own, else ``default`` (once :meth:`resolved`, their own)."""
        if self.no_target:
            return None
        return self.target_ttft if self.target_ttft is not None else default

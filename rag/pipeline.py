"""The Python API: documents in, sourced answers out.

``Pipeline`` ties the parts together: the index (``store``), ingest, the
embedder, the engine (``engine.Backend``) and the pure prompt logic
(``prompt_budget``). The CLI and any service are thin layers over it.

Does not: print, parse arguments or talk HTTP.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal, Sequence

import numpy as np
from pydantic import ValidationError

from engine.backend import Backend, ContextOverflow, Message, Timings
from engine.kv_snapshots import common_prefix
from engine.memory import InsufficientMemory
from engine.models import ModelFileError
from engine.settings import EngineSettings, open_backend
from prompt_budget import (
    BudgetRequest,
    Candidate,
    ContextPassage,
    ContextTooSmall,
    HistoryPolicy,
    PastTurn,
    PrefillCostModel,
    PrefillSample,
    build_messages,
    canonical_order,
    format_passage,
    plan_budget,
    system_message,
    turns_to_fold,
    turns_to_skip,
)
from prompt_budget.layout import history_messages
from prompt_budget.profile import Profile, load_profile, save_profile
from prompt_budget.budgeter import passage_room
from prompt_budget.focus import best_window, focus_cap
from prompt_budget.trim import sentence_ends, trim_to_tokens

from . import paths
from .answer import Answer, Budget, BudgetDecision, Source
from .chunking import Chunker, ChunkerSettings
from .conversations import Conversation, ConversationStore, Turn, check_session_id
from .embed import Embedder, SentenceTransformerEmbedder
from .errors import DocumentNotFound, EngineUnavailable, IndexNotFound, ModelNotFound, QuestionTooLong, RagError
from .ingest import IngestProgress, IngestReport, ingest
from .lexical import tokenize as lexical_terms
from .retrieve import DEFAULT_MODE, QueryCache, RetrievalMode, check_mode, retrieve
from .store import Hit, Index, index_exists, live_manifest

DEFAULT_MAX_TOKENS = 256
DEFAULT_CANDIDATES = 20  # top-N retrieved for the budgeter to choose from
DEFAULT_MAX_K = 8
DEFAULT_MIN_K = 1
DEFAULT_RELEVANCE_FLOOR = 0.05  # cosine; below it a chunk is noise, whatever the budget
FALLBACK_TARGET_TTFT = 2.0
SYSTEM_STATE_KEY = "system"  # the pinned KV snapshot of the system prompt
KV_RAM_BYTES = 512 << 20
KV_DISK_BYTES = 2 << 30
HistoryMode = Literal["prompted", "qa"]


def kv_key(session: str) -> str:
    """The engine's snapshot key of a conversation."""
    return f"session:{session}"


def document_id(root: str, source: str) -> str:
    """The stable id of the document ``source`` ingested from ``root``."""
    import hashlib

    return hashlib.sha256(f"{root}\0{source}".encode("utf-8")).hexdigest()[:16]


def safe_file_name(name: str) -> str:
    """``name`` as a bare, harmless file name: no folders, no leading dots,
    no control characters; a RagError if nothing usable is left.

    ``safe_file_name("../../etc/passwd") -> "passwd"``
    """
    import re

    base = re.split(r"[\\/]", name or "")[-1]
    base = re.sub(r"[\x00-\x1f\x7f]", "", base).strip().lstrip(".")
    base = re.sub(r"[^\w.\- ]", "_", base)[:200]
    if not base or not any(c.isalnum() for c in base):
        raise RagError(f"{name!r} is not a usable file name")
    return base


def default_target_ttft() -> float | None:
    """``$RAG_TARGET_TTFT`` in seconds (``none`` for no target), else 2.0."""
    raw = os.environ.get("RAG_TARGET_TTFT", "").strip().lower()
    if not raw:
        return FALLBACK_TARGET_TTFT
    if raw in {"none", "off", "inf"}:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise RagError(f"RAG_TARGET_TTFT={raw!r} is not a number of seconds") from None
    if value <= 0:
        raise RagError(f"RAG_TARGET_TTFT must be positive seconds, not {value}")
    return value


@dataclass(frozen=True)
class Retrieval:
    """The chunks chosen for a prompt, in prompt order, and the budget that chose them."""

    hits: tuple[Hit, ...]
    budget: Budget


def _checked_target(target_ttft: float | None, no_target: bool, max_tokens: int, min_k: int, max_k: int) -> float | None:
    """The TTFT target to plan for, after a RagError for any option out of range."""
    if max_tokens < 1:
        raise RagError(f"max_tokens must be at least 1, not {max_tokens}")
    if target_ttft is not None and target_ttft <= 0:
        raise RagError(f"the TTFT target must be positive seconds, not {target_ttft}")
    if not 0 <= min_k <= max_k or max_k < 1:
        raise RagError(f"need 0 <= min_k <= max_k and max_k >= 1, not min_k={min_k}, max_k={max_k}")
    return None if no_target else (target_ttft if target_ttft is not None else default_target_ttft())


@dataclass(frozen=True)
class _Prompt:
    text: str
    hits: tuple[Hit, ...]
    budget: Budget
    elapsed_at_plan: float
    user: str  # the last user message, as it is kept in the history
    turns_shown: int  # recent turns replayed in the prompt


def _too_long(prompt_tokens: int, max_tokens: int, n_ctx: int) -> QuestionTooLong:
    return QuestionTooLong(
        f"the question is too long: {prompt_tokens} prompt tokens + {max_tokens} answer tokens exceed "
        f"the model's context of {n_ctx} tokens; shorten the question or lower --max-tokens"
    )


class Pipeline:
    """Ingest, search and ask over one index with one model, alone or in
    conversations.

    Models load on first use, not when the pipeline is opened. Options:
    ``conversations`` (a store or its SQLite path; default
    ``paths.conversations_path()``), ``history`` (when turns are folded into
    the summary; default from the context size), ``history_mode``
    (``"prompted"``: turns replayed as prompted, passages included, so their
    KV stays cached; ``"qa"``: questions and answers only), ``kv_dir`` (where
    KV snapshots are kept on disk; default under the cache folder, ``False``
    for RAM only), ``kv_ram_bytes`` (the RAM cap of the snapshots) and
    ``retrieval`` (``"hybrid"``, ``"dense"`` or ``"bm25"``; see
    ``rag.retrieve``) and ``engine`` (an ``engine.EngineSettings``: a remote
    server, GPU layers, flash attention, KV cache type; default from
    ``RAG_*`` environment variables).
    """

    def __init__(
        self,
        index_dir: Path,
        *,
        use_sample: bool = False,
        model: str | os.PathLike[str] | None = None,
        n_ctx: int | None = None,
        embedder: Embedder | None = None,
        backend: Backend | None = None,
        profile_dir: Path | None = None,
        learn: bool = True,
        notice=None,
        conversations: ConversationStore | Path | None = None,
        history: HistoryPolicy | None = None,
        history_mode: HistoryMode = "prompted",
        kv_dir: Path | None | Literal[False] = None,
        kv_ram_bytes: int = KV_RAM_BYTES,
        retrieval: RetrievalMode = DEFAULT_MODE,
        engine: EngineSettings | None = None,
    ) -> None:
        self.index_dir = Path(index_dir)
        self._engine = engine
        self.retrieval: RetrievalMode = check_mode(retrieval)
        self._queries: QueryCache | None = None
        self.profile_dir = Path(profile_dir) if profile_dir else paths.cache_dir() / "profiles"
        self.learn = learn
        # Where the pipeline says what it is doing on its own (a quick calibration).
        self.notice = notice or (lambda message: None)
        self._profile: Profile | None = None
        self._cost: PrefillCostModel | None = None
        self.use_sample = use_sample
        self.model = model
        self.n_ctx = n_ctx
        self._embedder = embedder
        self._backend = backend
        self._index: Index | None = None
        if history_mode not in ("prompted", "qa"):
            raise RagError(f"history_mode must be 'prompted' or 'qa', not {history_mode!r}")
        # "prompted": a turn is replayed as it was prompted, passages included
        # (append-only, so its KV stays cached); "qa": question and answer only.
        self.history_mode: HistoryMode = history_mode
        self._history = history
        self._conversations = conversations
        self.kv_dir = kv_dir
        self.kv_ram_bytes = kv_ram_bytes
        self._system_state = False
        # Background work (folding turns into summaries) runs on one thread,
        # after answers, and gives way to questions that are waiting.
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rag-history")
        self._pending: list[Future] = []
        self._active = 0
        self._active_lock = threading.Lock()
        self.background_log: list[dict[str, object]] = []

    @classmethod
    def open(
        cls,
        index_dir: str | os.PathLike[str] | None = None,
        model: str | os.PathLike[str] | None = None,
        **options,
    ) -> "Pipeline":
        """A pipeline over ``index_dir`` (default: ``$RAG_INDEX``, else the
        per-user index) answering with the GGUF ``model`` (default: the
        bundled SmolLM2-135M-Instruct).

        With no index given and none built, questions are answered from the
        bundled sample corpus, indexed on first use and cached.
        """
        if index_dir is not None:
            return cls(Path(index_dir).expanduser(), model=model, **options)
        default = paths.default_index_dir()
        explicit = bool(os.environ.get("RAG_INDEX"))
        use_sample = not explicit and not index_exists(default)
        return cls(default, use_sample=use_sample, model=model, **options)

    # -- the parts, loaded lazily ------------------------------------------

    @property
    def embedder(self) -> Embedder:
        """The embedding model (loaded on first use)."""
        if self._embedder is None:
            self._embedder = SentenceTransformerEmbedder()
        return self._embedder

    @property
    def engine(self) -> EngineSettings:
        """The engine options (default: from ``RAG_*`` environment variables)."""
        if self._engine is None:
            try:
                self._engine = EngineSettings()
            except ValidationError as exc:
                first = exc.errors()[0]
                raise RagError(f"engine settings: RAG_{str(first['loc'][0]).upper()}: {first['msg']}") from None
        return self._engine

    @property
    def backend(self) -> Backend:
        """The inference engine (loaded on first use)."""
        if self._backend is None:
            model = self.model or os.environ.get("RAG_MODEL") or None
            kv_dir = None if self.kv_dir is False else (self.kv_dir or paths.cache_dir() / "kv")
            try:
                self._backend = open_backend(
                    self.engine, model=model, n_ctx=self.n_ctx, snapshot_dir=kv_dir,
                    snapshot_ram_bytes=self.kv_ram_bytes, snapshot_disk_bytes=KV_DISK_BYTES,
                )
            except (InsufficientMemory, ConnectionError) as exc:
                raise EngineUnavailable(str(exc)) from None
            except (ModelFileError, ValueError) as exc:
                raise ModelNotFound(str(exc)) from None
        return self._backend

    @property
    def conversations(self) -> ConversationStore:
        """The conversation store (``paths.conversations_path()`` unless given)."""
        if not isinstance(self._conversations, ConversationStore):
            self._conversations = ConversationStore(self._conversations or paths.conversations_path())
        return self._conversations

    @property
    def history(self) -> HistoryPolicy:
        """When old turns are folded into the summary (default: from the context size)."""
        if self._history is None:
            self._history = HistoryPolicy.for_context(self.backend.n_ctx)
        return self._history

    def index(self) -> Index:
        """The index questions are answered from, opened once."""
        if self._index is None:
            directory = self.index_dir
            if self.use_sample:
                directory = self._sample_index()
            elif not index_exists(directory):
                raise IndexNotFound(
                    f"no index at {directory}; build one with `rag ingest PATH --index {directory}`"
                )
            embedder = self.embedder
            self._index = Index.open(directory, embedder=embedder.name, dim=embedder.dim)
        return self._index

    @property
    def cost_model(self) -> PrefillCostModel:
        """The prefill cost model of this machine set-up: the saved profile,
        else a quick calibration run now (and saved)."""
        if self._cost is None:
            profile = load_profile(self.profile_dir, self.backend.profile_key())
            if profile is None:
                self.notice(
                    "no prefill profile for this model and machine yet: running a quick calibration "
                    "(a few seconds; `rag calibrate` measures a full one)"
                )
                profile = self.calibrate(quick=True)
            self._profile, self._cost = profile, profile.cost_model()
        return self._cost

    def calibrate(self, *, quick: bool = False, progress=None) -> Profile:
        """Measure prefill on this backend, fit the cost model, save the
        profile and use it from now on."""
        from .calibrate import calibrate

        profile = calibrate(self.backend, quick=quick, progress=progress)
        save_profile(self.profile_dir, profile)
        self._profile, self._cost = profile, profile.cost_model()
        return profile

    def warm_up(self) -> Timings:
        """Prefill the system prompt now and keep its KV state pinned, so
        every question, in any conversation, finds it cached; returns what
        that cost."""
        timings = self.backend.prefill(self._stable_prefix([system_message()]), session=SYSTEM_STATE_KEY, pin=True)
        self._system_state = True
        return timings

    def _stable_prefix(self, messages: Sequence[Message]) -> list[int]:
        """The tokens every prompt that continues ``messages`` with a user
        turn starts with, under this model's template."""
        backend = self.backend
        a = backend.tokenize(backend.render([*messages, Message("user", "a")]))
        b = backend.tokenize(backend.render([*messages, Message("user", "b")]))
        return a[: common_prefix(np.asarray(a, dtype=np.int32), np.asarray(b, dtype=np.int32))]

    def _learn(self, timings: Timings, elapsed_at_plan: float) -> None:
        """Fold one request's measurements into the cost model and its profile."""
        model = self.cost_model
        model.observe(PrefillSample(timings.cached_tokens, timings.prefill_tokens, timings.prefill_s), refit=self.learn)
        # A snapshot restore is its own cost, not the engine's fixed overhead.
        model.observe_overhead(
            timings.ttft_s - elapsed_at_plan - timings.prefill_s - timings.restore_s - timings.queue_s
        )
        if self.learn and self._profile is not None:
            self._profile.absorb(model)
            try:
                save_profile(self.profile_dir, self._profile)
            except OSError:
                pass  # a read-only cache must not fail an answer

    def _sample_index(self) -> Path:
        directory = paths.sample_index_dir()
        # Incremental, so after the first time this only hashes a few files.
        ingest(directory, [paths.sample_data_dir()], embedder=self.embedder, chunker=self._chunker(None, None, directory))
        return directory

    def _chunker(self, chunk_tokens: int | None, overlap_tokens: int | None, directory: Path) -> Chunker:
        settings = ChunkerSettings()
        if index_exists(directory):
            # Keep the settings the index was built with unless told otherwise.
            built = live_manifest(directory).chunker
            if set(built) == {"chunk_tokens", "overlap_tokens"}:
                settings = ChunkerSettings(**built)
        if chunk_tokens is not None or overlap_tokens is not None:
            size = chunk_tokens if chunk_tokens is not None else settings.chunk_tokens
            overlap = overlap_tokens if overlap_tokens is not None else min(settings.overlap_tokens, size // 4)
            settings = ChunkerSettings(size, overlap)
        return Chunker(self.embedder.count_tokens, settings)

    # -- the API -------------------------------------------------------------

    def ingest(
        self,
        paths_: Sequence[str | os.PathLike[str]],
        *,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        chunk_tokens: int | None = None,
        overlap_tokens: int | None = None,
        progress: IngestProgress | None = None,
    ) -> IngestReport:
        """Add, update and remove documents under ``paths_`` in this
        pipeline's index, incrementally and atomically; see
        :func:`rag.ingest.ingest`. Unreadable files are listed in the
        report's ``failed`` and do not stop the rest."""
        try:
            chunker = self._chunker(chunk_tokens, overlap_tokens, self.index_dir)
        except ValueError as exc:
            raise RagError(str(exc)) from None
        report = ingest(
            self.index_dir, paths_, embedder=self.embedder, chunker=chunker,
            include=include, exclude=exclude, progress=progress,
        )
        self.use_sample = False
        # Not closed: a query already running finishes on the generation it
        # opened (its files stay readable until released); new ones open the new one.
        self._index = None
        return report

    def documents(self) -> list[dict[str, object]]:
        """The files in the index: ``id`` (stable, opaque), ``source``,
        ``root`` (the folder it was ingested from), ``chunks`` and ``sha256``."""
        return [
            {"id": document_id(r.root, r.source), "source": r.source, "root": r.root,
             "chunks": r.n_chunks, "sha256": r.sha256}
            for r in self.index().files().values()
        ]

    def add_document(self, name: str, data: bytes, *, folder: Path | None = None) -> IngestReport:
        """Save ``data`` as the file ``name`` (sanitised: a bare file name,
        no folders) in ``folder`` (default: this index's uploads folder) and
        ingest that folder. The file is written atomically; a file that
        cannot be indexed is removed again and reported in ``failed``."""
        folder = Path(folder) if folder else self.uploads_dir
        safe = safe_file_name(name)
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / safe
        tmp = folder / f".{safe}.{os.getpid()}.{threading.get_ident()}.part"
        tmp.write_bytes(data)
        previous = target.read_bytes() if target.exists() else None
        os.replace(tmp, target)
        report = self.ingest([folder])
        if any(Path(path).name == safe for path, _ in report.failed):
            # Keep the folder and the index in step: an unindexable file does not stay.
            if previous is None:
                target.unlink(missing_ok=True)
            else:
                target.write_bytes(previous)
        return report

    def remove_document(self, doc_id: str) -> dict[str, object]:
        """Remove the document ``doc_id`` (see :meth:`documents`) from the
        index, atomically, and its file if it was uploaded; returns what was
        removed. Raises DocumentNotFound if there is no such document."""
        from .store import open_writer

        manifest = live_manifest(self.index_dir) if index_exists(self.index_dir) else None
        if manifest is None:
            raise DocumentNotFound(f"no document {doc_id}: the index is empty")
        with open_writer(self.index_dir, manifest) as writer:
            found = [r for r in writer.files().values() if document_id(r.root, r.source) == doc_id]
            if not found:
                raise DocumentNotFound(f"no document {doc_id}; GET /v1/documents lists them")
            record = found[0]
            writer.remove_file(record.id)
            writer.commit()
        self._index = None
        uploaded = Path(record.root) / record.source
        if Path(record.root).resolve() == self.uploads_dir.resolve() and uploaded.is_file():
            uploaded.unlink()
        return {"id": doc_id, "source": record.source, "chunks": record.n_chunks}

    @property
    def uploads_dir(self) -> Path:
        """Where uploaded documents are kept: beside the index folder."""
        return self.index_dir.parent / f"{self.index_dir.name}-uploads"

    def search(self, query: str, k: int = 5, *, mode: RetrievalMode | None = None) -> list[Hit]:
        """The ``k`` chunks that best match ``query``, best first, each
        scored by its cosine similarity to it; ``mode`` (default
        ``self.retrieval``) is how they are found: ``"hybrid"`` (dense and
        BM25 fused by rank), ``"dense"`` or ``"bm25"``."""
        query = query.strip()
        if not query:
            raise RagError("the query is empty; pass some text to search for")
        if k < 1:
            raise RagError(f"k must be at least 1, not {k}")
        mode = check_mode(mode) if mode is not None else self.retrieval
        index = self.index()
        return retrieve(index, query, lambda: self.query_cache.vector(query), k, mode)

    @property
    def query_cache(self) -> QueryCache:
        """Query vectors already computed, by query text."""
        if self._queries is None:
            self._queries = QueryCache(self.embedder.embed)
        return self._queries

    def ask(self, question: str, **options) -> Answer:
        """Answer ``question`` from the index, with sources, budget and
        timings; ``options`` are those of :meth:`stream`."""
        answer = None
        for item in self.stream(question, **options):
            if isinstance(item, Answer):
                answer = item
        assert answer is not None
        return answer

    def stream(
        self,
        question: str,
        *,
        target_ttft: float | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        candidates: int = DEFAULT_CANDIDATES,
        max_k: int = DEFAULT_MAX_K,
        min_k: int = DEFAULT_MIN_K,
        relevance_floor: float = DEFAULT_RELEVANCE_FLOOR,
        no_target: bool = False,
        session: str | None = None,
        expected_wait_s: float = 0.0,
    ) -> Iterator[str | Answer]:
        """Answer ``question`` as it is generated: text pieces, then the
        final :class:`Answer`.

        The top ``candidates`` chunks are retrieved and the budgeter puts as
        many of them into the prompt (between ``min_k`` and ``max_k``) as
        keep the predicted time to first token within ``target_ttft``
        seconds (default: :func:`default_target_ttft`; ``no_target`` for
        none); tokens already in the engine's KV cache cost only their
        attention term. With a ``session`` id the question continues that
        conversation: its summary and recent turns go before the passages,
        the turn is stored when answered, and older turns are folded into
        the summary afterwards, in the background. Raises QuestionTooLong if
        the question alone cannot fit the context window with
        ``max_tokens`` left for the answer. ``expected_wait_s`` is the time
        the request is expected to wait for the engine behind others (a
        server under load): the budget plans for it, taking fewer chunks.
        """
        target = _checked_target(target_ttft, no_target, max_tokens, min_k, max_k)
        if session is not None:
            check_session_id(session)
        backend, cost = self._ready()
        conversation = self.conversations.load(session) if session is not None else None
        with self._foreground():
            received = time.perf_counter()
            hits = self.search(question, k=max(candidates, 1))
            prompt = self._prompt(
                question, hits, max_tokens, target, min_k, max_k, relevance_floor, cost, received, conversation,
                max(expected_wait_s, 0.0),
            )
            engine_start = time.perf_counter()
            pieces: list[str] = []
            timings: Timings | None = None
            try:
                for item in backend.generate(
                    prompt.text, max_tokens=max_tokens, session=kv_key(session) if session is not None else None
                ):
                    if isinstance(item, Timings):
                        timings = item
                    else:
                        pieces.append(item)
                        yield item
            except ContextOverflow as exc:  # the budget below should make this unreachable
                raise QuestionTooLong(str(exc)) from None
            assert timings is not None
            timings = timings.shifted(engine_start - received)
            self._learn(timings, prompt.elapsed_at_plan)
        text = "".join(pieces).strip()
        sources = tuple(Source(h.chunk_id, h.source, h.score, h.page) for h in prompt.hits)
        number = None
        if conversation is not None and session is not None:
            number = conversation.next_number
            self._remember(conversation, number, question, prompt.user, text, sources, timings)
        yield Answer(
            answer=text, sources=sources, budget=prompt.budget, timings=timings,
            session=session, turn=number, turns_shown=prompt.turns_shown,
        )

    def _ready(self) -> tuple[Backend, PrefillCostModel]:
        """Load what a question needs before its clock starts: the engine,
        the index (its BM25 part too), the cost model, the system prompt's state."""
        backend, index, cost = self.backend, self.index(), self.cost_model
        if self.retrieval != "dense":
            index.lexical()
        if not self._system_state:
            self.warm_up()
        return backend, cost

    def budgeted(
        self,
        question: str,
        *,
        target_ttft: float | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        candidates: int = DEFAULT_CANDIDATES,
        max_k: int = DEFAULT_MAX_K,
        min_k: int = DEFAULT_MIN_K,
        relevance_floor: float = DEFAULT_RELEVANCE_FLOOR,
        no_target: bool = False,
    ) -> Retrieval:
        """The chunks :meth:`stream` would put into the prompt for
        ``question`` (same options), in prompt order, with the budget that
        chose them; nothing is generated. For other frameworks' chains
        (``rag.langchain``): the budget is planned for rag-budget's own
        prompt layout, so a chain's template adds its own few tokens."""
        target = _checked_target(target_ttft, no_target, max_tokens, min_k, max_k)
        _, cost = self._ready()
        received = time.perf_counter()
        hits = self.search(question, k=max(candidates, 1))
        prompt = self._prompt(question, hits, max_tokens, target, min_k, max_k, relevance_floor, cost, received)
        return Retrieval(prompt.hits, prompt.budget)

    # -- conversations -----------------------------------------------------

    @contextlib.contextmanager
    def _foreground(self) -> Iterator[None]:
        """Mark a question as in progress, so background work gives way."""
        with self._active_lock:
            self._active += 1
        try:
            yield
        finally:
            with self._active_lock:
                self._active -= 1

    def _busy(self) -> bool:
        with self._active_lock:
            return self._active > 0

    def _turn_tokens(self, turn: Turn) -> int:
        if self.history_mode == "prompted":
            return turn.tokens
        backend = self.backend
        return len(backend.tokenize(turn.question)) + len(backend.tokenize(turn.answer)) + 10

    def _past(self, conversation: Conversation | None) -> list[PastTurn]:
        if conversation is None:
            return []
        return [PastTurn(t.prompted if self.history_mode == "prompted" else t.question, t.answer)
                for t in conversation.turns]

    def _remember(self, conversation: Conversation, number: int, question: str, user: str, answer: str,
                  sources: Sequence[Source], timings: Timings) -> None:
        """Store the answered turn, then fold old turns in the background if due."""
        backend = self.backend
        # The template adds a few tokens around each message.
        tokens = len(backend.tokenize(user)) + len(backend.tokenize(answer)) + 10
        turn = Turn(number, question, user, answer, tokens, tuple(s.to_dict() for s in sources), timings.to_dict())
        session = conversation.session
        self.conversations.append(session, turn)
        if turns_to_fold([self._turn_tokens(t) for t in (*conversation.turns, turn)], self.history):
            self._pending = [f for f in self._pending if not f.done()]
            self._pending.append(self._worker.submit(self._fold, session))

    def _fold(self, session: str) -> None:
        """Fold the oldest turns of ``session`` into its summary, then
        prefill the new stable prefix so the next question finds it cached."""
        from .summarise import Interrupted, summarise

        conversation = self.conversations.load(session)
        n = turns_to_fold([self._turn_tokens(t) for t in conversation.turns], self.history)
        if not n:
            return
        started = time.perf_counter()
        try:
            summary, method = summarise(
                self.backend, conversation.summary, conversation.turns[:n], self.history.summary_tokens, self._busy
            )
        except Interrupted:
            # A question came in: it goes first; the fold is retried after its answer.
            self.background_log.append({"session": session, "kind": "summary", "interrupted": True,
                                        "seconds": time.perf_counter() - started})
            return
        seconds = time.perf_counter() - started
        tokens = len(self.backend.tokenize(summary))
        folded = self.conversations.fold(
            session, through=conversation.turns[n - 1].number, summary=summary,
            expected_version=conversation.summary_version, method=method, tokens=tokens, seconds=seconds,
        )
        self.background_log.append({"session": session, "kind": "summary", "method": method, "turns": n,
                                    "tokens": tokens, "seconds": seconds, "stored": folded})
        if not folded or self._busy():
            return
        # The summary changed right after the system prompt: the kept turns
        # must be prefilled again once. Do it now, not in the next question.
        after = self.conversations.load(session)
        messages = [system_message(after.summary), *history_messages(self._past(after))]
        tokens_ = self._stable_prefix(messages)
        if len(tokens_) < self.backend.n_ctx // 2:
            t = self.backend.prefill(tokens_, session=kv_key(session))
            self.background_log.append({"session": session, "kind": "prefill", "tokens": t.prefill_tokens,
                                        "seconds": t.total_s + t.snapshot_s})

    def background_busy(self) -> bool:
        """Whether background work (a summary being written) is still running."""
        return any(not f.done() for f in self._pending)

    def wait_idle(self) -> float:
        """Wait for background work (summaries) to finish; returns the seconds waited."""
        started = time.perf_counter()
        for future in list(self._pending):
            future.result()
        self._pending = []
        return time.perf_counter() - started

    def conversation(self, session: str) -> Conversation:
        """The stored conversation ``session``: summary and recent turns."""
        return self.conversations.load(session)

    def reset(self, session: str) -> None:
        """Forget conversation ``session``: its turns, summary and KV snapshot."""
        self.wait_idle()
        self.conversations.reset(session)
        if self._backend is not None:
            self._backend.forget(kv_key(session))

    def _prompt(
        self, question: str, hits: list[Hit], max_tokens: int, target: float | None,
        min_k: int, max_k: int, floor: float, cost: PrefillCostModel, received: float,
        conversation: Conversation | None = None,
        expected_wait_s: float = 0.0,
    ) -> _Prompt:
        """The prompt with the conversation so far and the chunks the
        budgeter chose from ``hits``."""
        backend = self.backend
        n_ctx = backend.n_ctx
        summary = conversation.summary if conversation is not None else None
        past = self._past(conversation)
        if past:
            # Turns the summary has not caught up with yet must still leave
            # room for passages; the oldest are left out of this prompt.
            bare = len(backend.tokenize(backend.render(build_messages(question, [], summary=summary))))
            room = n_ctx - max_tokens - bare - min(512, n_ctx // 4)
            skip = turns_to_skip([self._turn_tokens(t) for t in conversation.turns], room)
            past = past[skip:]

        def render(shown: Sequence[ContextPassage]) -> str:
            return backend.render(build_messages(question, shown, summary=summary, turns=past))

        passages = [ContextPassage(h.source, h.text, h.page) for h in hits]
        fixed_tokens = backend.tokenize(render([]))

        def block_tokens(number: int, passage: ContextPassage) -> int:
            return len(backend.tokenize(format_passage(number, passage) + "\n\n"))

        cached = backend.cached_prefix(fixed_tokens)
        safety = cost.safety_factor()
        elapsed = time.perf_counter() - received
        request = BudgetRequest(
            fixed_tokens=len(fixed_tokens), n_ctx=n_ctx, reserve_tokens=max_tokens,
            target_ttft_s=target, cached_tokens=cached, overhead_s=elapsed + cost.overhead() + expected_wait_s,
            safety=safety, min_k=min_k, max_k=max_k, relevance_floor=floor,
        )
        sizes = [block_tokens(n, p) for n, p in enumerate(passages, start=1)]
        cap = focus_cap(passage_room(request, cost.predict), int(np.median(sizes))) if sizes else None
        if cap is not None:
            terms = set(lexical_terms(question))
            passages = [self._focused(p, terms, cap, n, block_tokens) for n, p in enumerate(passages, start=1)]
            sizes = [block_tokens(n, p) for n, p in enumerate(passages, start=1)]
        candidates = [
            Candidate(tokens=size, score=h.score, source=h.source, start=h.char_start, end=h.char_end)
            for size, h in zip(sizes, hits)
        ]
        try:
            plan = plan_budget(candidates, request, cost.predict)
        except ContextTooSmall as exc:
            raise _too_long(exc.fixed_tokens, max_tokens, exc.n_ctx) from None
        picked: list[tuple[int, ContextPassage]] = []  # relevance order
        for i in plan.chosen:
            p = passages[i]
            if i in plan.trim:
                number = len(picked) + 1
                keep = trim_to_tokens(p.text, plan.trim[i], lambda t: block_tokens(number, ContextPassage(p.source, t, p.page)))
                if not keep.strip():
                    continue  # not even one word fits: leave it out
                p = ContextPassage(p.source, keep, p.page)
            picked.append((i, p))
        # Token counts of separately tokenized parts can differ slightly from
        # the whole; check the real prompt and drop the least relevant
        # passages until it fits.
        while True:
            order = canonical_order([(hits[i].source, hits[i].position) for i, _ in picked])
            shown = [picked[j][1] for j in order]
            text = render(shown)
            n = len(backend.tokenize(text))
            if n + max_tokens <= n_ctx or not picked:
                break
            picked.pop()
        if n + max_tokens > n_ctx:
            raise _too_long(n, max_tokens, n_ctx)
        chosen = [picked[j][0] for j in order]
        new = max(n - cached, 0)
        decisions = tuple(
            BudgetDecision(
                chunk_id=hits[d.index].chunk_id, source=hits[d.index].source,
                tokens=d.tokens if d.chosen else candidates[d.index].tokens, score=hits[d.index].score,
                ttft_s=d.ttft_s, chosen=d.index in chosen,
                # A chunk the plan chose can still fall out when the whole prompt is checked.
                reason=d.reason if d.index in chosen or not d.chosen else "context", trimmed=d.trimmed,
            )
            for d in plan.decisions
        )
        budget = Budget(
            target_ttft_s=target,
            predicted_ttft_s=request.overhead_s + cost.predict(new, cached),
            candidates=len(hits),
            chosen=len(chosen),
            planned_ttft_s=request.overhead_s + safety * cost.predict(new, cached),
            feasible=plan.feasible,
            safety=safety,
            decisions=decisions,
            cached_tokens=cached,
        )
        user = build_messages(question, shown)[-1].content
        return _Prompt(text, tuple(hits[i] for i in chosen), budget, elapsed, user, len(past))

    def _focused(self, passage: ContextPassage, terms: set[str], cap: int, number: int, block_tokens) -> ContextPassage:
        """``passage`` cut to the run of its sentences that shares the most
        terms with the question, in at most ``cap`` prompt tokens."""
        if block_tokens(number, passage) <= cap:
            return passage
        room = cap - block_tokens(number, ContextPassage(passage.source, "", passage.page))
        text = passage.text
        ends = sentence_ends(text)
        units = [text[a:b] for a, b in zip([0, *ends[:-1]], ends)]
        sizes = [len(self.backend.tokenize(u)) for u in units]
        scores = [len(terms.intersection(lexical_terms(u))) for u in units]
        start, end = best_window(scores, sizes, room)
        window = "".join(units[start:end]).strip()
        if not window:  # one sentence longer than the room: its head
            window = trim_to_tokens(text, room, lambda t: len(self.backend.tokenize(t)))
        return ContextPassage(passage.source, window, passage.page)

    def doctor(self) -> dict[str, object]:
        """Versions, engine build and device, model, context, threads and index statistics."""
        import importlib.metadata as md
        import platform

        versions = {}
        for dist in ("rag-budget", "llama-cpp-python", "sentence-transformers", "faiss-cpu", "torch",
                     "bm25s", "langchain-text-splitters", "pypdf", "typer", "rich"):
            try:
                versions[dist] = md.version(dist)
            except md.PackageNotFoundError:
                versions[dist] = None
        report: dict[str, object] = {
            "python": platform.python_version(), "versions": versions, "retrieval": self.retrieval,
        }
        report["engine"] = self.backend.info()
        try:
            report["index"] = self.index().stats() | {"sample": self.use_sample}
        except RagError as exc:
            report["index"] = {"path": str(self.index_dir), "error": str(exc)}
        return report

    def close(self) -> None:
        """Finish background work and release the index and the conversation store."""
        self.wait_idle()
        self._worker.shutdown(wait=True)
        if isinstance(self._conversations, ConversationStore):
            self._conversations.close()
            self._conversations = self._conversations.path
        if self._index is not None:
            self._index.close()
            self._index = None

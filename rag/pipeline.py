"""The Python API: documents in, sourced answers out.

``Pipeline`` ties the parts together: the index (``store``), ingest, the
embedder, the engine (``engine.Backend``) and the pure prompt logic
(``prompt_budget``). The CLI and any service are thin layers over it.

Does not: print, parse arguments or talk HTTP.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from engine.backend import Backend, ContextOverflow, Timings
from prompt_budget import (
    Candidate,
    ContextPassage,
    ContextTooSmall,
    PrefillCostModel,
    PrefillSample,
    build_messages,
    fit_to_context,
    format_passage,
)

from . import paths
from .answer import Answer, Budget, Source
from .chunking import Chunker, ChunkerSettings
from .embed import Embedder, SentenceTransformerEmbedder
from .errors import IndexNotFound, ModelNotFound, QuestionTooLong, RagError
from .ingest import IngestProgress, IngestReport, ingest
from .store import Hit, Index, index_exists, live_manifest

DEFAULT_TOP_K = 4
DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True)
class _Prompt:
    text: str
    tokens: int
    hits: tuple[Hit, ...]
    candidates: int


class Pipeline:
    """Ingest, search and ask over one index with one model.

    Models load on first use, not when the pipeline is opened.
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
    ) -> None:
        self.index_dir = Path(index_dir)
        self.use_sample = use_sample
        self.model = model
        self.n_ctx = n_ctx
        self._embedder = embedder
        self._backend = backend
        self._index: Index | None = None
        self.cost_model = PrefillCostModel()

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
    def backend(self) -> Backend:
        """The inference engine (loaded on first use)."""
        if self._backend is None:
            from engine.llama_cpp_backend import DEFAULT_N_CTX, LlamaCppBackend
            from engine.models import ModelFileError

            model = self.model or os.environ.get("RAG_MODEL") or None
            try:
                self._backend = LlamaCppBackend(model, n_ctx=self.n_ctx or DEFAULT_N_CTX)
            except (ModelFileError, ValueError) as exc:
                raise ModelNotFound(str(exc)) from None
        return self._backend

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
        if self._index is not None:
            self._index.close()
            self._index = None
        return report

    def search(self, query: str, k: int = 5) -> list[Hit]:
        """The ``k`` chunks most similar to ``query`` (cosine), best first."""
        query = query.strip()
        if not query:
            raise RagError("the query is empty; pass some text to search for")
        if k < 1:
            raise RagError(f"k must be at least 1, not {k}")
        index = self.index()
        return index.search(self.embedder.embed([query])[0], k)

    def ask(self, question: str, *, max_tokens: int = DEFAULT_MAX_TOKENS, k: int = DEFAULT_TOP_K) -> Answer:
        """Answer ``question`` from the index, with sources and timings."""
        answer = None
        for item in self.stream(question, max_tokens=max_tokens, k=k):
            if isinstance(item, Answer):
                answer = item
        assert answer is not None
        return answer

    def stream(
        self, question: str, *, max_tokens: int = DEFAULT_MAX_TOKENS, k: int = DEFAULT_TOP_K
    ) -> Iterator[str | Answer]:
        """Answer ``question`` as it is generated: text pieces, then the
        final :class:`Answer`.

        Raises QuestionTooLong if the question alone cannot fit the model's
        context window with ``max_tokens`` left for the answer.
        """
        if max_tokens < 1:
            raise RagError(f"max_tokens must be at least 1, not {max_tokens}")
        backend, _ = self.backend, self.index()  # load before the clock starts
        received = time.perf_counter()
        hits = self.search(question, k=k)
        prompt = self._prompt(question, hits, max_tokens)
        tokens = backend.tokenize(prompt.text)
        cached = backend.cached_prefix(tokens)
        engine_start = time.perf_counter()
        predicted = (engine_start - received) + self.cost_model.predict(len(tokens) - cached, cached)
        pieces: list[str] = []
        timings: Timings | None = None
        try:
            for item in backend.generate(prompt.text, max_tokens=max_tokens):
                if isinstance(item, Timings):
                    timings = item
                else:
                    pieces.append(item)
                    yield item
        except ContextOverflow as exc:  # the budget below should make this unreachable
            raise QuestionTooLong(str(exc)) from None
        assert timings is not None
        self.cost_model.observe(PrefillSample(timings.cached_tokens, timings.prefill_tokens, timings.prefill_s))
        yield Answer(
            answer="".join(pieces).strip(),
            sources=tuple(Source(h.chunk_id, h.source, h.score, h.page) for h in prompt.hits),
            budget=Budget(target_ttft_s=None, predicted_ttft_s=predicted, candidates=prompt.candidates, chosen=len(prompt.hits)),
            timings=timings.shifted(engine_start - received),
        )

    def _prompt(self, question: str, hits: list[Hit], max_tokens: int) -> _Prompt:
        """The prompt with as many of ``hits`` as fit the context window."""
        backend = self.backend
        passages = [ContextPassage(h.source, h.text, h.page) for h in hits]
        fixed = len(backend.tokenize(backend.render(build_messages(question, []))))
        candidates = [
            Candidate(tokens=len(backend.tokenize(format_passage(i, p) + "\n\n")), score=h.score)
            for i, (p, h) in enumerate(zip(passages, hits), start=1)
        ]
        try:
            plan = fit_to_context(
                candidates, fixed_tokens=fixed, n_ctx=backend.n_ctx, reserve_tokens=max_tokens, max_k=len(hits)
            )
        except ContextTooSmall as exc:
            raise QuestionTooLong(
                f"the question is too long: {exc.fixed_tokens} prompt tokens + {max_tokens} answer tokens exceed "
                f"the model's context of {exc.n_ctx} tokens; shorten the question or lower --max-tokens"
            ) from None
        chosen = list(plan.chosen)
        # Token counts of separately tokenized parts can differ slightly from
        # the whole; check the real prompt and drop passages until it fits.
        while True:
            text = backend.render(build_messages(question, [passages[i] for i in chosen]))
            n = len(backend.tokenize(text))
            if n + max_tokens <= backend.n_ctx or not chosen:
                break
            chosen.pop()
        if n + max_tokens > backend.n_ctx:
            raise QuestionTooLong(
                f"the question is too long: {n} prompt tokens + {max_tokens} answer tokens exceed "
                f"the model's context of {backend.n_ctx} tokens; shorten the question or lower --max-tokens"
            )
        return _Prompt(text, n, tuple(hits[i] for i in chosen), len(hits))

    def doctor(self) -> dict[str, object]:
        """Versions, engine build and device, model, context, threads and index statistics."""
        import importlib.metadata as md
        import platform

        versions = {}
        for dist in ("rag-budget", "llama-cpp-python", "sentence-transformers", "faiss-cpu", "torch",
                     "langchain-text-splitters", "pypdf", "typer", "rich"):
            try:
                versions[dist] = md.version(dist)
            except md.PackageNotFoundError:
                versions[dist] = None
        report: dict[str, object] = {"python": platform.python_version(), "versions": versions}
        report["engine"] = self.backend.info()
        try:
            report["index"] = self.index().stats() | {"sample": self.use_sample}
        except RagError as exc:
            report["index"] = {"path": str(self.index_dir), "error": str(exc)}
        return report

    def close(self) -> None:
        """Release the index."""
        if self._index is not None:
            self._index.close()
            self._index = None

"""The Python API: documents in, sourced answers out.

``Pipeline`` is a facade over parts that each have one job: the document
library (``rag.ingest.library``), retrieval (``rag.retrieval``), the prompt
planner (``planner``), the cost model that learns (``costs``), the conversation
memory (``rag.conversations.memory``), passage KV reuse (``passages``)
and the engine (``engine.Backend``).
It wires them together, loads each on first use, and answers questions as
:class:`AnswerStream` s. The CLI and the service are thin layers over it.

Does not: print, parse arguments or talk HTTP.
"""

from __future__ import annotations

import inspect
import os
import time
import weakref
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Generator, Sequence

from engine.backend import Backend, Cancel, Timings
from prompt_budget import PrefillCostModel, build_messages
from prompt_budget.profile import Profile

from ..conversations import Conversation, ConversationMemory, Conversations
from ..conversations.memory import HistoryMode
from ..conversations.store import index_key
from ..errors import IndexNotFound, engine_errors
from ..text.language import QUESTION_WORDS, detect, rare
from ..index.location import IndexLocation, folder_of, index_exists, as_index_location
from ..index.interface import IndexReader
from ..index.collection_names import DEFAULT_COLLECTION, check_collection_name
from ..index.records import Hit
from ..ingest.embed import Embedder, GivingWay
from ..ingest.content import DocumentFile
from ..ingest.library import DocumentLibrary, document_id
from ..ingest.run import IngestProgress, IngestReport
from ..retrieval import RetrievalMode, Scope, check_mode, retrieve
from ..settings import Settings
from .answer import DECLINED, DECLINED_IN, Answer, Budget, Source
from .citations import STOP_SEQUENCES, GroundedText, Grounding
from .costs import CostLearner
from .dispatch import Dispatcher
from .doctor import doctor_report
from .engine_setup import EngineSetup
from .options import AskOptions, valid_search, valid_text
from .components import Components
from .keywords import check_known, renamed
from .passages import PassageReuse
from .arrivals import Arrival
from .planner import PlannedPrompt, check_fits
from .stream import AnswerEvent, AnswerStream, EvidenceFound, TextPiece
from .evidence import Ranked, rank

_WORD = re.compile(r"\w[\w'.+-]*\w|\w")  # a word of a question as a reader writes it: "conf.py", "tcp_nodelay"


# The keywords Pipeline takes beside its index, and those it hands to Components: what an unknown
# keyword's TypeError lists.
_OWN_KEYWORDS = ("settings", "use_sample", "profile_dir", "learn", "notice", "history_mode")
_PARTS = tuple(name for name, p in inspect.signature(Components.__init__).parameters.items()
               if p.kind is p.KEYWORD_ONLY and name not in _OWN_KEYWORDS)


@dataclass(frozen=True)
class Retrieval:
    """The chunks chosen for a prompt, in prompt order, and the budget that chose them."""

    hits: tuple[Hit, ...]
    budget: Budget


class Pipeline:
    """Ingest, search and ask over one index with one model, alone or in
    conversations.

    Models load on first use, not when the pipeline is opened. ``settings``
    (a :class:`rag.settings.Settings`; default: from ``RAG_*`` variables)
    say where things live and which engine answers. Options:
    ``history_mode`` (``"prompted"``: turns replayed as prompted, passages
    included, so their KV stays cached; ``"qa"``: questions and answers
    only), ``profile_dir``, ``learn`` (online learning of the cost model),
    ``notice`` (told what the pipeline does on its own, such as a quick
    calibration), and the parts of :class:`~rag.qa.components.Components`:
    ``embedder`` and ``backend`` already loaded, ``conversations`` (a store
    or its SQLite path), ``history``, ``kv_dir`` (``False`` for RAM only)
    and ``kv_ram_bytes``.

    It is an :class:`~rag.qa.answerer.Answerer`, answering in this process.
    """

    via = "process"  # where questions are answered (the resident server's client says "server")
    server_pid = None

    def __init__(
        self,
        index_location: IndexLocation | None = None,
        *,
        settings: Settings | None = None,
        use_sample: bool = False,
        profile_dir: Path | None = None,
        learn: bool = True,
        notice=None,
        history_mode: HistoryMode = "prompted",
        **parts,
    ) -> None:
        if "index_dir" in parts:
            parts = renamed("Pipeline", {**parts, "index_location": index_location})
            index_location = parts.pop("index_location")
        check_known("Pipeline", parts, (*_OWN_KEYWORDS, *_PARTS))
        if index_location is None:
            raise TypeError("Pipeline() missing its index_location: a folder, or a postgresql:// URL "
                            "(Pipeline.open() takes the settings' index)")
        self.settings = settings or Settings.load()
        self.index_location = as_index_location(index_location)  # a folder, or a PostgreSQL URL (rag.index.location)
        # Where the pipeline says what it does on its own, or what it found wrong.
        self.notice = notice or (lambda message: None)
        self.components = Components(self.settings, self.index_location, use_sample=use_sample,
                           notice=lambda message: self.notice(message), **parts)
        # Ingest gives way to this pipeline's questions (an upload beside a served question).
        self.library = DocumentLibrary(self.index_location, lambda: GivingWay(self.embedder, self.memory.answering),
                                       self.components.index_changed, uploads_dir=self._uploads_dir())
        # The engine's cost model (see EngineSetup).
        self.engine_setup = EngineSetup(lambda: self.backend, profile_dir or self.settings.profile_folder, learn=learn,
                               notice=lambda message: self.notice(message))
        self.passages = PassageReuse(lambda: self.backend, self.index)
        self.memory = ConversationMemory(lambda: self.conversations, lambda: self.backend, lambda: self.components.history,
                                         history_mode=history_mode, index=lambda: index_key(self.index_location))
        self.dispatcher = Dispatcher(self.engine_setup, self.memory, lambda: self.backend)

    @classmethod
    def open(
        cls,
        index_location: str | os.PathLike[str] | None = None,
        model: str | os.PathLike[str] | None = None,
        *,
        settings: Settings | None = None,
        prepare: bool = False,
        **options,
    ) -> "Pipeline":
        """A pipeline over ``index_location`` (a folder or a ``postgresql://``
        URL; default: the settings' index, ``$RAG_INDEX``, else the per-user
        index) answering with the GGUF
        ``model`` (default: the settings', else the bundled
        SmolLM2-135M-Instruct).

        With no index given and none built, questions are answered from the
        bundled sample corpus, indexed on first use and cached. ``prepare``:
        load and warm now what a question needs (:meth:`prepare`), which
        the first question would otherwise wait for inside its time to first
        token: a long-lived caller opens with it.
        """
        if "index_dir" in options:
            options = renamed("Pipeline.open", {**options, "index_location": index_location})
            index_location = options.pop("index_location")
        check_known("Pipeline.open", options, (*_OWN_KEYWORDS, *_PARTS, "index_location", "model",
                                               "prepare"))
        settings = settings or Settings.load()
        if model is not None:
            settings = settings.model_copy(update={"model": Path(model).expanduser()})
        if index_location is not None:
            pipeline = cls(as_index_location(index_location), settings=settings, **options)
        else:
            default = settings.index_folder
            pipeline = cls(default, settings=settings, use_sample=settings.index is None and not index_exists(default),
                           **options)
        if prepare:
            pipeline.prepare(need_index=False)
        return pipeline

    def _uploads_dir(self) -> Path | None:
        """Where this front-end keeps uploads to a database index (under its
        data folder, one folder per database and host); None for a folder
        index, whose uploads lie beside it."""
        if folder_of(self.index_location) is not None:
            return None
        import hashlib
        import socket

        from ..index.location import shown

        # The folder is the uploads' root in the shared index, and an ingest removes the files of its
        # root that it does not find on disk: front-ends whose data folders have the same path (the
        # same image on two hosts) must not share one, or each would remove the other's uploads.
        key = f"{shown(self.index_location)}\n{socket.gethostname()}"
        tag = hashlib.sha256(key.encode("utf-8")).hexdigest()[:12]
        return self.settings.data_folder / f"index-{tag}-uploads"

    # -- the parts -------------------------------------------------------------

    @property
    def retrieval(self) -> RetrievalMode:
        """The default retrieval mode (``hybrid``, ``dense`` or ``bm25``)."""
        return self.settings.retrieval

    @property
    def use_sample(self) -> bool:
        """Whether questions are answered from the bundled sample corpus."""
        return self.components.use_sample

    @property
    def embedder(self) -> Embedder:
        """The embedding model (loaded on first use)."""
        return self.components.embedder

    @property
    def backend(self) -> Backend:
        """The inference engine (loaded on first use)."""
        return self.components.backend

    @property
    def conversations(self) -> Conversations:
        """The conversation store."""
        return self.components.conversations

    @property
    def costs(self) -> CostLearner:
        """The cost learner of the engine (behind a router: of the router's address)."""
        return self.engine_setup.costs

    @property
    def cost_model(self) -> PrefillCostModel:
        """The prefill cost model of this machine set-up (see :class:`CostLearner`)."""
        return self.costs.model

    def index(self) -> IndexReader:
        """The index questions are answered from."""
        return self.components.index()

    def calibrate(self, *, quick: bool = False, progress=None) -> Profile:
        """Measure prefill on this backend, fit the cost model, save the
        profile and use it from now on; the profile."""
        with engine_errors():
            return self.engine_setup.calibrate(quick=quick, progress=progress)

    def prepare(self, *, need_index: bool = True) -> None:
        """Load what a question needs: the engine, the index (its BM25 part
        too), the cost model, and the system prompt's cached state. Without
        ``need_index``, no index yet is no error (a service whose first
        documents are still to be uploaded)."""
        with engine_errors():
            _ = self.backend
            try:
                index: IndexReader | None = self.index()
            except IndexNotFound:
                if need_index:
                    raise
                index = None
            self.engine_setup.prepare()
            if index is not None and self.retrieval != "dense":
                index.lexical()
            if not self.engine_setup.warmed:
                self.warm_up()
                self._rehearse(index)

    def _rehearse(self, index: IndexReader | None) -> None:
        """Go once through what a question does (embed a query, search,
        generate a token), so the first real question does not pay for
        first-use costs: the embedding model's first run, the index's pages,
        the engine's first batch."""
        self.embedder.embed(["warming up"])
        if index is not None:
            index.search(self.embedder.embed(["warming up"])[0], k=1)
        backend = self.backend
        with backend.generate(backend.tokenize(backend.render(build_messages("Hi", []))), max_tokens=1,
                              background=True) as generation:
            for _ in generation:
                pass

    def warm_up(self) -> Timings | None:
        """Prefill the system prompt now and keep its KV state pinned, so
        every question, in any conversation, finds it cached; what that cost
        (None for an engine without a prefix cache)."""
        with engine_errors():
            return self.engine_setup.warm_up()

    # -- documents -------------------------------------------------------------

    def ingest(self, paths_: Sequence[str | os.PathLike[str]], *, include: Sequence[str] = (),
               exclude: Sequence[str] = (), chunk_tokens: int | None = None, overlap_tokens: int | None = None,
               rebuild: bool = False, progress: IngestProgress | None = None,
               collection: str = DEFAULT_COLLECTION) -> IngestReport:
        """Add, update and remove documents under ``paths_`` in
        ``collection`` of this pipeline's index, incrementally and
        atomically (``rebuild``: from an empty index); see
        :func:`rag.ingest.run.ingest`. Unreadable files are listed in the
        report's ``failed``, files not read in ``ignored``; neither stops the rest."""
        return self.library.ingest(paths_, include=include, exclude=exclude, chunk_tokens=chunk_tokens,
                                   overlap_tokens=overlap_tokens, max_file_bytes=self.settings.max_file_bytes,
                                   rebuild=rebuild, progress=progress, collection=check_collection_name(collection))

    def remove_collection(self, collection: str) -> int:
        """Remove ``collection`` and every document in it (their chunks with
        them), atomically; how many documents. DocumentNotFound when there
        is no such collection."""
        return self.library.remove_collection(check_collection_name(collection))

    def create_collection(self, collection: str) -> bool:
        """Make ``collection``, holding no documents yet; whether it is new
        (False: it was there, and is left as it is)."""
        return self.library.create_collection(check_collection_name(collection))

    def collections(self) -> dict[str, int]:
        """The collections of the index with the documents each holds (none: no index yet)."""
        try:
            return self.index().collections()
        except IndexNotFound:
            return {}

    def documents(self, collection: str = DEFAULT_COLLECTION) -> list[dict[str, object]]:
        """The files of ``collection`` in the index: ``id`` (stable, opaque), ``source``,
        ``root`` (the folder it was ingested from), ``collection``, ``chunks`` and ``sha256``."""
        collection = check_collection_name(collection)
        return self.library.documents(self.index().files(collection=collection), collection)

    def add_document(self, name: str, data: bytes, collection: str = DEFAULT_COLLECTION) -> IngestReport:
        """Upload ``data`` as the document ``name`` into ``collection``; see :meth:`DocumentLibrary.add`."""
        return self.library.add(name, data, collection=check_collection_name(collection))

    def remove_document(self, doc_id: str, collection: str = DEFAULT_COLLECTION) -> dict[str, object]:
        """Remove the document ``doc_id`` of ``collection``; see :meth:`DocumentLibrary.remove`."""
        return self.library.remove(doc_id, check_collection_name(collection))

    def document(self, doc_id: str, collection: str = DEFAULT_COLLECTION) -> DocumentFile:
        """The file of the document ``doc_id`` of ``collection``, to read its text (chunk spans
        point into it) or bytes; DocumentNotFound if it holds none."""
        return self.library.locate(doc_id, self.index().files(collection=check_collection_name(collection)))

    def document_text(self, doc_id: str, collection: str = DEFAULT_COLLECTION) -> dict[str, object]:
        """The text of the document ``doc_id`` of ``collection`` as the index
        holds it: ``id``, ``source``, ``text``, ``pages`` and ``current``
        (``GET /v1/documents/{doc_id}/text``'s object, which the resident
        server's client gives too); DocumentNotFound if it holds none."""
        return self.document(doc_id, collection).text(self.settings.max_file_bytes).to_dict()

    # -- questions -------------------------------------------------------------

    def search(self, query: str, k: int = 5, *, mode: RetrievalMode | None = None,
               scope: Scope | dict | None = None, collection: str = DEFAULT_COLLECTION) -> list[Hit]:
        """The ``k`` chunks that best match ``query``, best first, each
        scored by its cosine similarity to it; ``mode`` (default: the
        settings') is how they are found: ``"hybrid"`` (dense and BM25 fused
        by rank), ``"dense"`` or ``"bm25"``; ``scope`` (a :class:`Scope`, or
        ``{"sources": [glob, ...], "types": ["pdf", ...]}``) the documents
        searched, those of ``collection`` only; a RagError when no indexed
        document is in them."""
        query, scope = valid_search(query, k, scope)
        collection = check_collection_name(collection)
        mode = check_mode(mode) if mode is not None else self.retrieval
        return retrieve(self.index(), query, lambda: self.components.query_cache.vector(query, collection), k, mode,
                        scope=scope, collection=collection)

    def ask(self, question: str, options: AskOptions | None = None, **changes) -> Answer:
        """Answer ``question`` from the index, with sources, budget and
        timings; options as for :meth:`stream`."""
        with self.stream(question, options, **changes) as stream:
            _, answer = stream.result()
        return answer

    def stream(self, question: str, options: AskOptions | None = None, **changes) -> AnswerStream:
        """Answer ``question`` as it is generated: an :class:`AnswerStream`
        to iterate for text, then read ``.answer`` from.

        ``options`` (an :class:`AskOptions`, or its fields as keywords): the
        top ``candidates`` chunks are retrieved and the budgeter puts as many
        of them into the prompt (between ``min_k`` and ``max_k``) as keep the
        predicted time to first token within ``target_ttft`` seconds
        (default: the settings'; ``no_target`` for none), counted from this
        call; tokens already in the engine's KV cache cost only their
        attention term. With a ``session`` id the question continues that
        conversation: its summary and recent turns go before the passages,
        the turn is stored when answered, and older turns are folded into the
        summary afterwards, in the background. The sentences of the passages
        that best answer it are found without the model (``rag.qa.evidence``),
        the passage holding the best goes first, and they are quoted where
        ``evidence`` says; once the prompt is planned its ``evidence`` is
        known, before the first token (``AnswerStream.events`` says when).
        Where no sentence scores ``evidence_floor``, the answer says the
        documents do not seem to answer, without asking the model. Raises
        QuestionTooLong if the question alone cannot fit the context window
        with ``max_tokens`` left for the answer, and another RagError for an
        engine that fails.
        """
        received = time.perf_counter()  # the question is received now: TTFT counts from here
        options = AskOptions.of(options, **changes).resolved(self.settings)
        question = valid_text(question)
        cancel = Cancel()  # the stream's cancel() reaches the engine's request once there is one
        # On its way from now, not from when its thread gets to retrieval: the first plan of a burst
        # leaves room for the rest of it (8 at once: the first took 415 prompt tokens, 1.5 s, and the
        # other seven started 2.4 s after they asked).
        arrival = self.dispatcher.arrived()
        stream = AnswerStream(self._answer(question, options, received, cancel, arrival), cancel=cancel)
        weakref.finalize(stream, arrival.close)  # a stream dropped unread is no longer on its way
        return stream

    def budgeted(self, question: str, options: AskOptions | None = None, **changes) -> Retrieval:
        """The chunks :meth:`stream` would put into the prompt for ``question``
        (same options), in prompt order, with the budget that chose them, for
        other frameworks' chains (``rag.integrations.langchain``; the budget
        is planned for rag-budget's own layout); nothing is generated."""
        prompt = self.planned(question, options, **changes)
        return Retrieval(prompt.hits, prompt.budget)

    def planned(self, question: str, options: AskOptions | None = None, **changes) -> PlannedPrompt:
        """The whole prompt :meth:`stream` would send for ``question`` (same
        options, no conversation), with its passages; nothing is generated."""
        received = time.perf_counter()
        options = AskOptions.of(options, **changes).resolved(self.settings)
        question = valid_text(question)
        with engine_errors():
            self.prepare()
            hits = self.search(question, k=options.candidates, mode=options.retrieval, scope=options.scope,
                               collection=options.collection)
            hits, ranked = self.evidence(question, hits, options).leading(hits)
            return self.dispatcher.plan(question, hits, options, options.target(),
                                        received, None, ranked=ranked)

    def evidence(self, question: str, hits: Sequence[Hit], options: AskOptions | None = None) -> Ranked:
        """The units of ``hits`` ranked by how well they answer
        ``question``, found without the model (``rag.qa.evidence``); with
        ``options.evidence_embed``, by embedding similarity too."""
        options = options or AskOptions()
        embed = query = None
        if options.evidence_embed:
            embed, query = self.embedder.embed, self.components.query_cache.vector(question, options.collection)
        # Every candidate's units, not only those the budget will take: the passage holding
        # the best goes first (``Ranked.leading``).
        ranked = rank(question, hits, embed=embed, query_vector=query, shortlist=len(hits))
        # A rare word of the question (a name, jargon) that its documents never use is a sign they lack
        # what it asks about; in their own language only: an English question of French documents uses
        # words they never do. A common word ("tiny", "enlarge") is only another way of saying a thing.
        lang = detect(question, min_words=QUESTION_WORDS)
        if ranked.units and lang in ranked.langs:
            words = sorted({w for w in _WORD.findall(question) if rare(w, lang)})
            if words:
                ranked = replace(ranked, unheard=tuple(self.index().unheard(words, collection=options.collection)))
        return ranked

    def _answer(self, question: str, options: AskOptions, received: float,
                cancel: Cancel, arrival: Arrival) -> Generator[AnswerEvent, None, Answer]:
        session = options.session
        with arrival, engine_errors(), self.memory.turn(session):
            with self.memory.question():
                conversation = self.memory.load(session) if session is not None else None
                self.prepare()
                pieces: list[str] = []
                target = options.target()
                hits = self.search(question, k=options.candidates, mode=options.retrieval, scope=options.scope,
                               collection=options.collection)
                hits, ranked = self.evidence(question, hits, options).leading(hits)
                if ranked.declines(options.evidence_floor) and not (conversation and (conversation.turns or conversation.summary)):
                    # A follow-up leans on the turns before it ("and at what heat?"): it is always asked.
                    yield EvidenceFound(())
                    declined = self._declined(question, hits, ranked, options, target, received, session)
                    yield TextPiece(declined.answer)  # what the reader sees: "rag ask" and a stream's reader print pieces
                    return declined
                # Where the prompt's own text begins the answer stops: the engine decodes nothing after it.
                stops = STOP_SEQUENCES if options.stop else ()
                # Submitted: counted in the engine's load from now, and no longer as on its way.
                prompt, generation = self.dispatcher.submit(question, hits, options, target, received,
                                                            conversation, ranked, arrival, stops)
                cancel.on_cancel(generation.cancel)  # cancelled while planning: the engine drops it at once
                # Closed however the reader leaves: at the evidence, at the quoted opening or at any piece
                # (a reader gone after the opening left the engine decoding to max_tokens before).
                with generation:
                    yield EvidenceFound(prompt.evidence)  # a reader may show it before the first token
                    # Where the answer opens with the evidence (``evidence="open"``), that opening is the
                    # answer's first text: the reader sees it now, and the model goes on from it.
                    opening = prompt.lead if options.evidence == "open" else ""
                    if opening:
                        pieces.append(opening)
                        yield TextPiece(opening)
                    # Citations the prompt did not show are removed as the text streams (see citations).
                    guard = GroundedText(Grounding(len(prompt.hits), tuple(h.source for h in prompt.hits),
                                                   prompt.text), stops)
                    for piece in generation:
                        if guard.stopped:
                            # The engine ended there too: what is left is that token's text, read for the timings.
                            continue
                        shown = guard.feed(piece)
                        if shown:
                            pieces.append(shown)
                            yield TextPiece(shown)
                    rest = guard.finish()
                    if rest:
                        pieces.append(rest)
                        yield TextPiece(rest)
                timings = generation.timings_since(received)
                self.costs.observe(timings, prompt.planned_at_s)
            text = "".join(pieces).strip()
            sources = tuple(Source(h.chunk_id, h.source, h.score, h.page, h.location, h.context,
                                   document_id(h.root, h.source), h.char_start, h.char_end) for h in prompt.hits)
            number = None
            if session is not None:
                # The turn is replayed as it was prompted: the answer with the start written for it.
                number = self.memory.remember(session, question, prompt.user,
                                              text if opening else prompt.lead + text,
                                              [s.to_dict() for s in sources], timings, options.cache_scope)
        return Answer(answer=text, sources=sources, budget=prompt.budget, timings=timings,
                      session=session, turn=number, turns_shown=prompt.turns_shown,
                      ungrounded=tuple(guard.removed), evidence=prompt.evidence)

    def _declined(self, question: str, hits: Sequence[Hit], ranked: Ranked, options: AskOptions,
                  target: float | None, received: float, session: str | None) -> Answer:
        """The answer to a question no passage seems to answer (its best
        evidence scores under ``options.evidence_floor``): said without
        asking the model, and remembered in its conversation. A question
        that could never fit the context is still QuestionTooLong."""
        check_fits(self.backend, question, options.max_tokens)
        text = DECLINED_IN.get(detect(question, min_words=QUESTION_WORDS), DECLINED)
        waited = time.perf_counter() - received
        timings = Timings(0, 0, 0, ttft_s=waited, prefill_s=0.0, decode_tokens=0, decode_s=0.0, total_s=waited)
        budget = Budget(target_ttft=target, predicted_ttft_s=waited, candidates=len(hits), chosen=0,
                        evidence_s=round(ranked.seconds, 4))
        number = self.memory.remember(session, question, question, text, [], timings,
                                      options.cache_scope) if session else None
        return Answer(answer=text, sources=(), budget=budget, timings=timings, session=session, turn=number,
                      declined=True)

    # -- conversations -----------------------------------------------------------

    def conversation(self, session: str) -> Conversation:
        """The stored conversation ``session``: summary and recent turns."""
        return self.memory.load(session)

    def reset(self, session: str) -> None:
        """Forget conversation ``session``: its turns, summary and KV snapshot."""
        self.memory.reset(session)

    @property
    def background_log(self) -> list[dict[str, object]]:
        """The latest background work (summaries, prefills), oldest first."""
        return list(self.memory.log)

    def background_busy(self) -> bool:
        """Whether background work (a summary being written) is still running."""
        return self.memory.busy()

    def wait_idle(self) -> float:
        """Wait for background work (summaries) to finish; returns the seconds waited."""
        return self.memory.wait_idle()

    # -- the rest --------------------------------------------------------------

    def doctor(self) -> dict[str, object]:
        """Versions, engine build and device, model, context, threads and index statistics."""
        with engine_errors():
            return doctor_report(self)

    def close(self) -> None:
        """Finish background work and release the index, the conversation
        store, and the engine if the pipeline opened it (one given is the giver's)."""
        self.memory.close()
        self.components.close()


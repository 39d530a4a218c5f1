"""``rag bench peer``: rag-budget beside the classic LangChain RAG, in one run.

The peer is what the LangChain tutorials build: a ``langchain_community``
FAISS vector store over ``langchain_huggingface`` HuggingFaceEmbeddings
(the same MiniLM model), a fixed top-k retriever, a stuff-documents chain
(every retrieved document pasted into one prompt) and ``ChatLlamaCpp`` over
the same GGUF with the same threads. Both answer the same questions from
the same chunks, one question at a time, taking turns, so machine noise
falls on all systems alike.

The peer's document vectors are, by default, read from rag-budget's index
rather than computed again by HuggingFaceEmbeddings: the model is the same
(the run checks the two agree on a sample) and re-embedding a large corpus
would take minutes that measure nothing asked here; ``reembed=True`` embeds
them through LangChain instead.

With passage KV reuse on (``--splice-fresh``), rag-budget answers the
questions a second time once its engine has stored the passages the first
pass used or wished for (``rag-budget, store warm``); the first pass already
splices what idle moments between questions stored.

LangChain and its integrations are the ``bench`` extra, imported only here.

:func:`run` is the whole of ``rag bench peer``: the corpus indexed, then
both systems asked.

Does not: judge answer quality; ``prompt_recall`` asks only whether a gold
source reached the prompt.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from engine.backend import PassageKV
from prompt_budget.recent import quantile
from prompt_budget.layout import SYSTEM_PROMPT

from ..errors import RagError
from ..qa.passages import splicing
from ..index.store import embedded_text
from ..evaluation.questions import Question
from . import setup
from .setup import Harness
from .ttft import settle
from ..qa.pipeline import Pipeline

WARM_UP_QUESTION = "What does this documentation cover?"
PEER_N_CTX = 8192  # 20 chunks of ~250 tokens do not fit the 4,096 of rag-budget's default
WARM = "rag-budget, store warm"  # with splicing on: the questions again once the passage store has warmed
_STUFF_PROMPT = SYSTEM_PROMPT.replace("numbered context passages in the user's message", "context below") + (
    "\n\nContext:\n{context}"
)


def _langchain():
    try:
        from langchain_classic.chains.combine_documents import create_stuff_documents_chain
        from langchain_community.chat_models import ChatLlamaCpp
        from langchain_community.vectorstores import FAISS
        from langchain_core.prompts import ChatPromptTemplate
        from langchain_huggingface import HuggingFaceEmbeddings
    except ImportError as exc:
        raise RagError(
            f"rag bench peer needs LangChain ({exc.name} is missing); install the bench extra: pip install 'rag-budget[bench]'"
        ) from None
    return create_stuff_documents_chain, ChatLlamaCpp, FAISS, ChatPromptTemplate, HuggingFaceEmbeddings


class LangChainRag:
    """The classic LangChain RAG over the chunks of a rag-budget index."""

    def __init__(self, pipeline: Pipeline, *, max_tokens: int, reembed: bool = False,
                 progress: Callable[[str], None] | None = None) -> None:
        import warnings

        from ..ingest.embed import default_embedder_dir

        stuff_chain, chat_llama, faiss_store, chat_prompt, hf_embeddings = _langchain()
        say = progress or (lambda message: None)
        say("loading HuggingFaceEmbeddings")
        self.embeddings = hf_embeddings(
            model_name=str(default_embedder_dir()), model_kwargs={"device": "cpu"},
            encode_kwargs={"normalize_embeddings": True},
        )
        chunks = pipeline.index().chunks()
        if not chunks:
            raise RagError(f"{pipeline.index_location}: the index is empty; nothing to compare on")
        texts = [c[2] for c in chunks]
        metadatas = [{"source": c[1]} for c in chunks]
        sample = list(range(0, len(chunks), max(1, len(chunks) // 16)))[:16]
        # Our vectors are of each chunk with its context: the same input must give the same vector.
        embedded = [embedded_text(chunks[i][4], texts[i]) for i in sample]
        theirs = np.asarray(self.embeddings.embed_documents(embedded), dtype=np.float32)
        ours = np.vstack([chunks[i][3] for i in sample])
        self.vector_agreement = float(np.min(np.sum(theirs * ours, axis=1)))  # cosine of each pair
        if reembed:
            say(f"embedding {len(texts)} chunks through LangChain")
            self.store = faiss_store.from_texts(texts, self.embeddings, metadatas=metadatas)
        else:
            self.store = faiss_store.from_embeddings(
                [(t, c[3].tolist()) for t, c in zip(texts, chunks)], self.embeddings, metadatas=metadatas
            )
        say("loading ChatLlamaCpp")
        backend = pipeline.backend
        from engine.llama_cpp.internals import extra_buffer_types

        # The engine's verdict on this machine (its self-check) holds for the peer's llama.cpp too.
        with warnings.catch_warnings(), extra_buffer_types(bool(backend.describe().get("extra_buffer_types", True))):
            warnings.simplefilter("ignore")
            self.llm = chat_llama(
                model_path=str(backend.describe()["model_path"]), n_ctx=PEER_N_CTX,
                n_threads=int(backend.describe()["n_threads"]), n_batch=int(backend.describe()["n_batch"]),
                max_tokens=max_tokens, temperature=0.0, verbose=False, streaming=True,
                # The same engine settings as rag-budget's: only the prompt differs.
                model_kwargs={"flash_attn": bool(backend.describe().get("flash_attn", False))},
            )
        prompt = chat_prompt.from_messages([("system", _STUFF_PROMPT), ("human", "{input}")])
        self.prompt = prompt
        self.chain = stuff_chain(self.llm, prompt)
        self._backend = backend

    def answer(self, question: str, k: int) -> dict[str, object]:
        """Retrieve ``k`` documents and stream the stuffed prompt's answer;
        timings from the question's arrival, and what was in the prompt."""
        from engine.backend import Message

        received = time.perf_counter()
        docs = self.store.as_retriever(search_kwargs={"k": k}).invoke(question)
        first = None
        pieces = []
        for piece in self.chain.stream({"context": docs, "input": question}):
            text = getattr(piece, "content", piece)
            if text and first is None:
                first = time.perf_counter()
            pieces.append(str(text))
        done = time.perf_counter()
        rendered = self.prompt.format_messages(context="\n\n".join(d.page_content for d in docs), input=question)
        messages = [Message("system" if m.type == "system" else "user", str(m.content)) for m in rendered]
        tokens = len(self._backend.tokenize(self._backend.render(messages)))
        return {
            "ttft_s": (first or done) - received, "total_s": done - received, "prompt_tokens": tokens,
            "sources": [d.metadata["source"] for d in docs], "answer": "".join(pieces),
        }


def _ours(pipeline: Pipeline, question: str, max_tokens: int, target_ttft: float | None) -> dict[str, object]:
    started = time.perf_counter()
    answer = pipeline.ask(question, max_tokens=max_tokens, target_ttft=target_ttft)
    return {
        "ttft_s": answer.timings.ttft_s, "total_s": time.perf_counter() - started,
        "prompt_tokens": answer.timings.prompt_tokens, "sources": [s.source for s in answer.sources],
        "answer": answer.answer,
    }


def bench_peer(
    pipeline: Pipeline,
    questions: Sequence[Question],
    *,
    ks: Sequence[int] = (4, 20),
    max_tokens: int = 32,
    target_ttft: float | None = None,
    reembed: bool = False,
    progress: Callable[[int, int], None] | None = None,
    notice: Callable[[str], None] | None = None,
) -> dict[str, object]:
    """Answer every question with rag-budget and with LangChain at each
    ``k``, taking turns; per system the median and p95 TTFT, the median
    total time and prompt tokens, and the share of questions whose prompt
    held a gold source; then rag-budget's TTFT ratio to LangChain's."""
    pipeline.cost_model  # calibrated, if needed, before anything is timed
    pipeline.warm_up()
    peer = LangChainRag(pipeline, max_tokens=max_tokens, reembed=reembed, progress=notice)
    systems = ["rag-budget"] + [f"langchain k={k}" for k in ks]
    # One untimed question each, not one of the set (its prompt would stay
    # cached): model pages and the system prefix warm for all.
    _ours(pipeline, WARM_UP_QUESTION, max_tokens, target_ttft)
    for k in ks:
        peer.answer(WARM_UP_QUESTION, k)
    rows: list[dict[str, object]] = []
    warm = splicing(pipeline.backend) is not None
    total, done = len(questions) * (len(systems) + warm), 0
    for number, q in enumerate(questions, 1):
        for name in systems:
            if name == "rag-budget":
                result = _ours(pipeline, q.question, max_tokens, target_ttft)
            else:
                result = peer.answer(q.question, int(name.split("=")[1]))
            rows.append(_row(name, number, q, result))
            done += 1
            if progress:
                progress(done, total)
    settled = None
    if warm:  # splicing on: the same questions again, once the engine stored what the first pass wished for
        settled = round(settle(pipeline), 1)
        for number, q in enumerate(questions, 1):
            rows.append(_row(WARM, number, q, _ours(pipeline, q.question, max_tokens, target_ttft)))
            done += 1
            if progress:
                progress(done, total)
        systems.append(WARM)
    summary_rows = [_summary_row(name, [r for r in rows if r["system"] == name]) for name in systems]
    by_name = {r["name"]: r for r in summary_rows}
    ours = by_name["rag-budget"]["median_ttft_s"]
    ratios = {f"ttft_ratio_vs_langchain_k{k}": round(by_name[f"langchain k={k}"]["median_ttft_s"] / ours, 2) for k in ks}
    if warm:
        ratios |= {f"warm_ttft_ratio_vs_langchain_k{k}":
                   round(by_name[f"langchain k={k}"]["median_ttft_s"] / by_name[WARM]["median_ttft_s"], 2) for k in ks}
    return {
        "bench": "peer",
        "config": {
            "questions": len(questions), "ks": list(ks), "max_tokens": max_tokens,
            "target_ttft_s": target_ttft, "retrieval": pipeline.retrieval, "index": str(pipeline.index_location),
            "engine_n_ctx": pipeline.backend.n_ctx, "peer_n_ctx": PEER_N_CTX,
            "peer_doc_vectors": "HuggingFaceEmbeddings" if reembed else "rag-budget index (same model)",
            "vector_agreement_min_cos": round(peer.vector_agreement, 6),
            "splice_fresh": pipeline.backend.splice_fresh if isinstance(pipeline.backend, PassageKV) else None,
            "settled_s": settled,
        },
        "rows": rows,
        "summary": {"systems": summary_rows, **ratios},
    }


def _row(system: str, number: int, q: Question, result: dict[str, object]) -> dict[str, object]:
    """One answer's row: its times, prompt size and whether a gold source was in the prompt."""
    return {
        "system": system, "question": number, "ttft_s": round(result["ttft_s"], 4),
        "total_s": round(result["total_s"], 4), "prompt_tokens": result["prompt_tokens"],
        "chunks": len(result["sources"]), "prompt_has_gold": any(s in q.gold for s in result["sources"]),
    }


def _summary_row(name: str, mine: Sequence[dict[str, object]]) -> dict[str, object]:
    """A system's medians and shares over its rows."""
    ttfts = [r["ttft_s"] for r in mine]
    return {
        "name": name,
        "median_ttft_s": round(quantile(ttfts, 0.5), 3),
        "p95_ttft_s": round(quantile(ttfts, 0.95), 3),
        "median_total_s": round(quantile([r["total_s"] for r in mine], 0.5), 3),
        "prompt_tokens": round(quantile([r["prompt_tokens"] for r in mine], 0.5)),
        "mean_chunks": round(sum(r["chunks"] for r in mine) / len(mine), 2),
        "prompt_recall": round(sum(1 for r in mine if r["prompt_has_gold"]) / len(mine), 3),
    }


def run(h: Harness, corpus: Path, include: Sequence[str], *, questions: Optional[Path] = None, limit: int = 0,
        ks: Sequence[int] = (4, 20), max_tokens: int = 32, target_ttft: float | None = None, reembed: bool = False,
        index: Optional[Path] = None, model: Optional[Path] = None) -> dict[str, object]:
    """``rag bench peer``: ``corpus`` indexed, then the first ``limit`` (0:
    all) questions of ``questions`` (default: the bundled Python-docs dev
    set) answered by rag-budget and LangChain (:func:`bench_peer`); every
    run starts cold (no KV snapshot on disk)."""
    qs = setup.questions_of(questions or setup.BENCH_DATA / "python_docs_dev.jsonl")
    qs = qs[:limit] if limit else qs
    pipeline = setup.bench_pipeline(h, corpus, include, index, model, kv_dir=False)
    with h.counting("asking") as update:
        return bench_peer(pipeline, qs, ks=ks, max_tokens=max_tokens, target_ttft=target_ttft, reembed=reembed,
                          progress=update, notice=h.line)


def main() -> None:
    """``python -m rag.bench.peer``: ``rag bench peer`` on its own."""
    setup.command_alone("peer")


if __name__ == "__main__":
    main()

"""A LangChain retriever that returns rag-budget's budgeted chunks.

An existing LangChain chain keeps its prompt and its model, and swaps its
retriever for :class:`BudgetedRetriever`: instead of a fixed top-k, it gets
as many chunks as keep the predicted time to first token on target, found
by hybrid retrieval, as ``Document`` objects whose metadata carries the
source, page, chunk id, cosine score and the budget's figures::

    from rag import Pipeline
    from rag.integrations.langchain import BudgetedRetriever

    retriever = BudgetedRetriever(pipeline=Pipeline.open(), target_ttft=1.5)
    chain = {"context": retriever | format_docs, "question": RunnablePassthrough()} | prompt | llm

Needs only ``langchain-core``, which rag-budget's text splitter already
brings.

Does not: generate; the chain's own model does.
"""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict

from ..qa.options import DEFAULT_CANDIDATES, DEFAULT_MAX_K, DEFAULT_MAX_TOKENS, DEFAULT_MIN_K
from ..qa.pipeline import Pipeline


class BudgetedRetriever(BaseRetriever):
    """Documents for a query: the chunks rag-budget's budgeter would put into
    the prompt under ``target_ttft`` (default: ``$RAG_TARGET_TTFT``, else
    2 s), leaving ``max_tokens`` of the context for the answer."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    pipeline: Pipeline
    target_ttft: float | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    candidates: int = DEFAULT_CANDIDATES
    max_k: int = DEFAULT_MAX_K
    min_k: int = DEFAULT_MIN_K

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        chosen = self.pipeline.budgeted(
            query, target_ttft=self.target_ttft, max_tokens=self.max_tokens,
            candidates=self.candidates, max_k=self.max_k, min_k=self.min_k,
        )
        budget: dict[str, Any] = {
            "target_ttft_s": chosen.budget.target_ttft,
            "predicted_ttft_s": chosen.budget.predicted_ttft_s,
            "candidates": chosen.budget.candidates,
            "chosen": chosen.budget.chosen,
        }
        return [
            Document(
                page_content=h.text,
                metadata={
                    "source": h.source, "page": h.page, "chunk_id": h.chunk_id, "score": h.score,
                    "char_start": h.char_start, "char_end": h.char_end, "location": h.location,
                    "context": h.context, "budget": budget,
                },
            )
            for h in chosen.hits
        ]

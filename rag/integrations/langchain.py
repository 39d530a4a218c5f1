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
from pydantic import ConfigDict, create_model

from ..qa.answerer import Answerer
from ..qa.options import AskOptions, offered


def retriever_fields(options: "type[AskOptions] | None" = None) -> dict[str, Any]:
    """The retriever's fields beyond its pipeline: every question option
    offered to LangChain, with its declared type, bounds and default."""
    return {o.name: (o.field.annotation, o.field) for o in offered("langchain", options)}


class _Retriever(BaseRetriever):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    pipeline: Answerer  # a Pipeline here, the resident server's client, or a rag serve elsewhere's


class BudgetedRetriever(create_model("_BudgetedOptions", __base__=_Retriever, **retriever_fields())):
    """Documents for a query: the chunks rag-budget's budgeter would put into
    the prompt under ``target_ttft`` (default: ``$RAG_TARGET_TTFT``, else
    2 s), leaving ``max_tokens`` of the context for the answer; its other
    fields are the question options ``AskOptions`` offers to LangChain.
    ``pipeline`` is any answerer (:class:`~rag.qa.answerer.Answerer`): a
    Pipeline in this process, or a server's client
    (``ServiceClient("http://host:8000", Settings(), key=...)``)."""

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        chosen = self.pipeline.budgeted(query, **{o.name: getattr(self, o.name) for o in offered("langchain")})
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

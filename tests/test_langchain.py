"""rag.langchain in a real LangChain chain: LCEL, a chat prompt, and
ChatLlamaCpp over the bundled GGUF."""

from __future__ import annotations

import pytest

pytest.importorskip("langchain_community", reason="the bench extra (LangChain integrations) is not installed")

from langchain_core.output_parsers import StrOutputParser  # noqa: E402
from langchain_core.prompts import ChatPromptTemplate  # noqa: E402
from langchain_core.runnables import RunnablePassthrough  # noqa: E402

from rag.integrations.langchain import BudgetedRetriever  # noqa: E402


@pytest.fixture(scope="module")
def chat_model():
    import warnings

    from langchain_community.chat_models import ChatLlamaCpp

    from engine.llama_cpp.internals import extra_buffer_types
    from engine.llama_cpp.selfcheck import engine_verdict
    from engine.models import default_model_path

    path = default_model_path()
    # Every llama.cpp the project starts follows the engine's self-check (no AMX where it crashes).
    with warnings.catch_warnings(), extra_buffer_types(engine_verdict(path).extra_bufts):
        warnings.simplefilter("ignore")
        return ChatLlamaCpp(model_path=str(path), n_ctx=2048, max_tokens=12, temperature=0.0, verbose=False)


def test_a_langchain_chain_answers_from_the_budgeted_chunks(pipeline_factory, corpus, tmp_path, chat_model):
    pipeline = pipeline_factory(tmp_path / "index")
    pipeline.ingest([corpus])
    retriever = BudgetedRetriever(pipeline=pipeline, target_ttft=30.0, max_k=3)
    seen = []

    def stuff(docs):
        seen.extend(docs)
        return "\n\n".join(d.page_content for d in docs)

    prompt = ChatPromptTemplate.from_messages(
        [("system", "Answer from this context only:\n{context}"), ("human", "{question}")]
    )
    chain = {"context": retriever | stuff, "question": RunnablePassthrough()} | prompt | chat_model | StrOutputParser()
    answer = chain.invoke("How long does the dough rise before baking?")
    assert answer.strip()
    assert 1 <= len(seen) <= 3
    assert "guide/cooking.rst" in {d.metadata["source"] for d in seen}
    for d in seen:
        assert d.metadata["chunk_id"] and -1.0 <= d.metadata["score"] <= 1.0
        assert d.metadata["budget"]["chosen"] == len(seen)


def test_the_budget_decides_how_many_documents_come_back(pipeline_factory, corpus, tmp_path):
    pipeline = pipeline_factory(tmp_path / "index")
    pipeline.ingest([corpus])
    roomy = BudgetedRetriever(pipeline=pipeline, target_ttft=60.0, max_k=4).invoke("prefill and decode")
    tight = BudgetedRetriever(pipeline=pipeline, target_ttft=1e-4, max_k=4, min_k=1).invoke("prefill and decode")
    assert len(roomy) > len(tight) == 1
    assert not tight[0].metadata["budget"]["predicted_ttft_s"] <= 1e-4  # infeasible target: one chunk, reported

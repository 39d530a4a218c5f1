"""rag-budget inside other frameworks (``langchain``)."""

"""What each MCP tool does, over the answerer of a :class:`Connection`:
search, ask, list the documents and read one, each returning a plain dict
(the tool's structured result) built from the same objects ``rag search``,
``rag ask --json`` and ``GET /v1/documents`` give.

The arguments arrive validated against the bounds below (the server
declares them in each tool's input schema); what only the pipeline can
check (an empty question, a scope no document is in, a session id) comes
back as a RagError with its one-line message.

Does not: speak MCP (``server`` does) or answer by itself (the pipeline
does, here or in the resident server).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from ..errors import CollectionNotFound, DocumentNotFound, RagError
from ..index.collection_names import DEFAULT_COLLECTION, missing_collection
from ..qa.answer import Answer, where
from ..qa.answerer import SharesStore
from ..qa.options import AskOptions, valid_text
from ..retrieval.scope import Scope
from ..service.keys import LOCAL_USER, Caller
from ..service.owners import as_seen_by, asking

if TYPE_CHECKING:
    from .connection import Answerer, Connection

MAX_SEARCH_K = 50  # chunks one search returns: more only fills an assistant's context
MAX_QUESTION_CHARS = 20_000  # as POST /v1/ask
MAX_ANSWER_TOKENS = 4096
MAX_READ_CHARS = 20_000  # characters one read_document call returns; ask for the next range for more
MAX_DOC_ID_CHARS = 64


def search(connection: Connection, query: str, k: int = 5, scope: Scope | None = None, *,
           collection: str = DEFAULT_COLLECTION, caller: Caller = LOCAL_USER) -> dict:
    """The ``k`` chunks of ``collection`` that best match ``query`` (within
    ``scope``), best first: ``rag search --json``'s results, each with
    ``where`` it lies (as a reader cites it) and the ``doc_id`` of its
    document where known. A collection ``caller`` may not read is one that
    holds nothing."""
    readable(caller, collection)
    answerer = connection.get()
    hits = answerer.search(query, k=k, scope=scope, collection=collection)
    ids = _ids_by_source(answerer, collection)
    return {"results": [h.to_dict() | {"where": where(h.source, h.location, h.context), "doc_id": ids.get(h.source)}
                        for h in hits]}


def ask(connection: Connection, question: str, asked: Mapping[str, object] | None = None, *, on_text=None,
        caller: Caller = LOCAL_USER) -> dict:
    """The answer to ``question`` from the documents, with the
    :class:`AskOptions` fields ``asked`` (those left out: the set-up's
    defaults; a ``session`` continues that conversation): its text,
    numbered sources, evidence, and what it cost. ``on_text(text so far)``
    is called as pieces arrive (progress for the caller)."""
    question = valid_text(question).strip()
    if not question:
        raise RagError("the question is empty; ask something about your documents")
    asked = dict(asked or {})
    session, collection = asked.get("session"), asked.get("collection") or DEFAULT_COLLECTION
    readable(caller, collection)
    answerer = connection.get()
    if not isinstance(answerer, SharesStore):
        # A rag serve elsewhere keeps its sessions, by its own key: one caller's only (the local user's).
        if caller != LOCAL_USER:
            raise RagError("the rag server these tools ask keeps its own conversations: serve MCP callers "
                           "with keys from a set-up of its own, not through --service-url")
        stored, caches = session, ""
    elif session is not None or caller != LOCAL_USER:
        stored, caches = asking(answerer.conversations, caller, collection, session)
    else:  # no store opened without a session for the local user (whose prompts' cache scope is "")
        stored, caches = None, ""
    options = AskOptions.of(**asked | {"session": stored, "collection": collection, "cache_scope": caches})
    text = ""
    with answerer.stream(question, options) as stream:
        for piece in stream:
            if piece and on_text is not None:
                text += piece
                on_text(text)
    return as_seen_by(caller, answered(stream.answer) | ({"session": session} if session is not None else {}))


def readable(caller: Caller, collection: str) -> None:
    """Nothing when ``caller`` may read ``collection``; else the error of a
    collection that holds no documents (it must not tell that it exists)."""
    if not caller.may_read(collection):
        raise CollectionNotFound(missing_collection(collection))


def answered(answer: Answer) -> dict:
    """An answer as the ``ask`` tool returns it: the answer's contract
    (``rag ask --json``, :mod:`rag.qa.answer`), each source also numbered
    (``n``, as its citations ``[n]`` refer to it) and cited (``where``), and
    ``cost``: measured against predicted time to first token, prompt and
    cached tokens, passages chosen of candidates, read from its timings and
    budget."""
    whole = answer.to_dict()
    t, b = whole["timings"], whole["budget"]
    sources = [{"n": n, "where": s.where(), **d} for n, (s, d) in enumerate(zip(answer.sources, whole["sources"]), 1)]
    cost = {"ttft_s": t["ttft_s"], "predicted_ttft_s": b["predicted_ttft_s"], "target_ttft_s": b["target_ttft_s"],
            "prompt_tokens": t["prompt_tokens"], "cached_tokens": t["cached_tokens"],
            "prefill_tokens": t["prefill_tokens"], "passages_chosen": b["chosen"], "candidates": b["candidates"],
            "decode_tokens": t["decode_tokens"], "total_s": t["total_s"]}
    return whole | {"sources": sources, "cost": cost}


def list_documents(connection: Connection, *, collection: str = DEFAULT_COLLECTION,
                   caller: Caller = LOCAL_USER) -> dict:
    """Every document of ``collection``: ``id`` (for ``read_document`` and
    ``rag://documents/{id}``), ``source``, ``chunks``."""
    readable(caller, collection)
    docs = connection.get().documents(collection)
    return {"documents": [{"id": d["id"], "source": d["source"], "chunks": d["chunks"]} for d in docs]}


def read_document(connection: Connection, doc_id: str, start: int = 0, end: int | None = None, *,
                  collection: str = DEFAULT_COLLECTION, caller: Caller = LOCAL_USER) -> dict:
    """The characters ``start`` to ``end`` of the document ``doc_id``'s text
    as the index holds it (a source's ``char_start``/``char_end`` are
    offsets into it), at most :data:`MAX_READ_CHARS` of them: ``text``,
    ``start``, ``end`` (where this part stopped), ``length`` (of the whole
    text) and ``more`` (whether text follows ``end``)."""
    if end is not None and end < start:
        raise RagError(f"end {end} is before start {start}")
    whole = document_text(connection, doc_id, collection=collection, caller=caller)
    text = str(whole["text"])
    stop = min(len(text), start + MAX_READ_CHARS, len(text) if end is None else end)
    start = min(start, len(text))
    return {"id": doc_id, "source": whole["source"], "text": text[start:stop], "start": start, "end": stop,
            "length": len(text), "more": stop < len(text), "current": whole["current"]}


def document_text(connection: Connection, doc_id: str, *, collection: str = DEFAULT_COLLECTION,
                  caller: Caller = LOCAL_USER) -> dict:
    """The whole text of the document ``doc_id`` of ``collection`` (``GET
    /v1/documents/{doc_id}/text``'s object); DocumentNotFound naming
    ``list_documents`` when it holds no such document."""
    readable(caller, collection)
    answerer = connection.get()
    if doc_id not in {d["id"] for d in answerer.documents(collection)}:
        raise DocumentNotFound(f"no document {doc_id!r}; list_documents gives the ids of the documents")
    return answerer.document_text(doc_id, collection)


def _ids_by_source(answerer: Answerer, collection: str = DEFAULT_COLLECTION) -> dict[str, str]:
    """Document ids by source in ``collection``, for the sources only one
    document has (two folders may each hold a ``notes.md``)."""
    ids: dict[str, str | None] = {}
    for d in answerer.documents(collection):
        ids[d["source"]] = None if d["source"] in ids else d["id"]
    return {source: i for source, i in ids.items() if i is not None}

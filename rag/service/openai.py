"""``POST /v1/chat/completions``: the OpenAI chat API over the pipeline, so
OpenAI clients work unchanged; the sources travel in an extra ``sources``
field, the evidence (the sentences that answer, found without the model)
in ``evidence``, and the budget and timings in ``rag``.

Does not: call an OpenAI model; the local pipeline answers.
"""

from __future__ import annotations

import time
import uuid
from typing import AsyncIterator

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from ..errors import RagError
from ..index.collection_names import DEFAULT_COLLECTION
from ..qa.answer import Answer
from ..qa.stream import AnswerEvent
from ..qa.options import DEFAULT_MAX_TOKENS
from .answering import ClientGone, ThreadedAnswer
from .errors import error, error_event, failure, outcome, sse
from .schemas import ChatBody
from .keys import LOCAL_USER, Caller
from .owners import as_seen_by, asking
from .rights import refusal
from .state import ServiceState, caller, service
from .uploads import first_index

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatBody, request: Request, state: ServiceState = Depends(service),
                           who: Caller = Depends(caller)):
    """OpenAI-compatible chat completion of the last user message,
    answered from the index (its ``collection``, an extension; default the
    default one); ``sources`` lists what it came from."""
    collection = body.collection or DEFAULT_COLLECTION
    refused = refusal(who, collection)
    if refused is not None:
        return refused
    users = [m for m in body.messages if m.role == "user" and m.text().strip()]
    if not users:
        return error(400, "no user message with text in messages", "invalid_request")
    max_tokens = body.max_completion_tokens or body.max_tokens or DEFAULT_MAX_TOKENS
    waited = await first_index(state.pipeline, state.uploads, request.is_disconnected)  # as /v1/ask does
    if waited is not None:
        return waited
    reply = Reply(f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time()), state.pipeline.backend.name, max_tokens,
                  body.session_id(), who)
    try:
        # A session, or one made from the OpenAI ``user`` (an end user's name, which two applications may
        # both send), is the key's own in this collection (rag.service.owners).
        session, caches = await run_in_threadpool(asking, state.pipeline.conversations, who, collection,
                                                  body.session_id())
        answer = state.answering.start("chat", users[-1].text(), body.options() | {
            "session": session, "max_tokens": max_tokens, "collection": collection, "cache_scope": caches})
        if not body.stream:
            done = await answer.result_unless(request.is_disconnected)
            return reply.completion(done) if done is not None else Response(status_code=499)
        first = await answer.first_unless(request.is_disconnected)
    except StopAsyncIteration:
        first = None
    except ClientGone:
        return Response(status_code=499)
    except RagError as exc:
        state.metrics.requests.labels("chat", outcome(exc)).inc()
        return failure(exc)
    return StreamingResponse(reply.chunks(answer, first, request.is_disconnected), media_type="text/event-stream")


class Reply:
    """One chat completion's identity, and its wire forms."""

    def __init__(self, cid: str, created: int, model: str, max_tokens: int, session: str | None = None,
                 caller: Caller = LOCAL_USER) -> None:
        self.cid, self.created, self.model, self.max_tokens = cid, created, model, max_tokens
        self.session = session  # the conversation's id as the caller names it, never as it is stored
        self.caller = caller  # who is shown the answer (rag.service.owners.as_seen_by)

    def completion(self, answer: Answer) -> dict:
        """The ``chat.completion`` object of a finished answer."""
        return {
            "id": self.cid, "object": "chat.completion", "created": self.created, "model": self.model,
            "choices": [{
                "index": 0, "message": {"role": "assistant", "content": answer.answer},
                "finish_reason": self._finish_reason(answer),
            }],
            "usage": self._usage(answer),
            **self._extension(answer),
        }

    def _extension(self, answer: Answer) -> dict:
        # Beyond OpenAI's fields: the sources and evidence beside the message, and the whole answer
        # contract (rag.qa.answer) under "rag".
        whole = as_seen_by(self.caller, answer.to_dict() | ({"session": self.session} if self.session is not None
                                                            else {}))
        return {"sources": whole["sources"], "evidence": whole["evidence"], "rag": whole}

    def _finish_reason(self, answer: Answer) -> str:
        return "length" if answer.timings.decode_tokens >= self.max_tokens else "stop"

    @staticmethod
    def _usage(answer: Answer) -> dict:
        t = answer.timings
        return {
            "prompt_tokens": t.prompt_tokens, "completion_tokens": t.decode_tokens,
            "total_tokens": t.prompt_tokens + t.decode_tokens,
            "prompt_tokens_details": {"cached_tokens": t.cached_tokens},
        }

    async def chunks(self, answer: ThreadedAnswer, first: AnswerEvent | None, gone) -> AsyncIterator[str]:
        """The ``chat.completion.chunk`` events of a streamed answer, ending
        with its usage, sources and evidence (or an error event) and
        ``[DONE]``; ``gone()`` says whether the client left before the first
        token (its generation is then stopped)."""
        base = {"id": self.cid, "object": "chat.completion.chunk", "created": self.created, "model": self.model}

        def delta(content: dict, reason: str | None = None) -> str:
            return sse(base | {"choices": [{"index": 0, "delta": content, "finish_reason": reason}]})

        try:
            yield delta({"role": "assistant", "content": ""})
            async for text in answer.texts(first, gone):
                yield delta({"content": text})
            final = answer.answer
            yield sse(base | {"choices": [{"index": 0, "delta": {}, "finish_reason": self._finish_reason(final)}],
                              "usage": self._usage(final), **self._extension(final)})
        except ClientGone:
            return  # it left while its prompt was evaluated: the generation is stopped
        except Exception as exc:  # noqa: BLE001 - the stream has started: its end says what failed
            yield error_event(exc)
        finally:
            await answer.aclose()
        yield "data: [DONE]\n\n"

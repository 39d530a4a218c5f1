"""Request bodies of the service, validated by pydantic.

Does not: answer anything.
"""

from __future__ import annotations

import hashlib
from typing import Literal, Optional, Union

from pydantic.json_schema import SkipJsonSchema
from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.fields import FieldInfo

from ..conversations.store import valid_session_id

from ..index.collection_names import DEFAULT_COLLECTION
from ..qa.options import ASK_BODY_OPTIONS, DEFAULT_MAX_TOKENS, MAX_CANDIDATES, AskOptions, CollectionName
from ..retrieval.scope import Scope


SCOPE_FIELD = Field(None, description=AskOptions.describe("scope"))

class _AskBase(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: str = Field(..., min_length=1, max_length=20_000)
    target_ttft_s: float | None = Field(None, gt=0, le=600, description=AskOptions.describe("target_ttft"))
    session: str | None = Field(None, max_length=128, description=AskOptions.describe("session"))
    max_tokens: int = Field(DEFAULT_MAX_TOKENS, ge=1, description=AskOptions.describe("max_tokens", default=False))
    stream: bool = False
    scope: Scope | None = SCOPE_FIELD
    # Sent by the resident server's own client (MCP over HTTP through it names its caller's scope); read
    # from no other caller (routes.ask), and not shown in the API's schema.
    cache_scope: SkipJsonSchema[str | None] = Field(None, max_length=64, pattern=r"^[0-9a-f.]*$")

    def options(self) -> dict[str, object]:
        """The question's options beyond the question, target, session and
        tokens that were given (for ``Answering.start``)."""
        given = self.model_dump(include=set(ASK_BODY_OPTIONS), exclude_none=True)
        return {k: v for k, v in given.items() if v is not False or k != "no_target"}


def _given(name: str) -> tuple[object, FieldInfo]:
    field = AskOptions.model_fields[name]
    return Optional[field.annotation], FieldInfo.merge_field_infos(field, default=None,
                                                                  description=AskOptions.describe(name))


AskBody = create_model("AskBody", __base__=_AskBase, __doc__="``POST /v1/ask``.",
                       __module__=__name__, **{name: _given(name) for name in ASK_BODY_OPTIONS})


class SearchBody(BaseModel):
    """``POST /v1/search``: what ``rag search`` asks."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(..., min_length=1, max_length=20_000)
    k: int = Field(5, ge=1, le=MAX_CANDIDATES)
    retrieval: Literal["dense", "bm25", "hybrid"] | None = None
    scope: Scope | None = SCOPE_FIELD
    collection: CollectionName = Field(DEFAULT_COLLECTION, description=AskOptions.describe("collection"))


class CollectionBody(BaseModel):
    """``POST /v1/collections``: the collection to make."""

    model_config = ConfigDict(extra="forbid")

    name: CollectionName


class TextPart(BaseModel):
    """An OpenAI text content part."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["text"]
    text: str = Field(..., max_length=100_000)


class OtherPart(BaseModel):
    """Any other OpenAI content part (an image, audio): accepted, not read."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["image_url", "input_audio", "file", "refusal"]


class ChatMessage(BaseModel):
    """One OpenAI chat message; ``content`` is text or a list of content parts."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Union[str, list[Union[TextPart, OtherPart]], None] = Field(None, max_length=100_000)

    def text(self) -> str:
        """The message's text: the string, or its text parts joined."""
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content if isinstance(p, TextPart))
        return self.content or ""


class ChatBody(BaseModel):
    """``POST /v1/chat/completions``: the OpenAI fields this service uses;
    others are accepted and ignored. ``session`` (an extra field, or
    ``user``) continues a stored conversation; without one, the last user
    message is answered on its own. ``scope`` (an extra field) limits the
    documents it draws on."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[ChatMessage] = Field(..., min_length=1)
    stream: bool = False
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    user: str | None = Field(None, max_length=256)
    session: str | None = Field(None, max_length=128)
    target_ttft_s: float | None = Field(None, gt=0, le=600)
    scope: Scope | None = SCOPE_FIELD
    collection: CollectionName = Field(DEFAULT_COLLECTION, description=AskOptions.describe("collection"))

    def session_id(self) -> str | None:
        """The conversation this request continues: ``session``, else the
        OpenAI ``user`` (any string: used as is when it is a usable id, else
        as a stable id made from it)."""
        if self.session is not None or not self.user:
            return self.session
        if valid_session_id(self.user):
            return self.user
        return "user-" + hashlib.sha256(self.user.encode("utf-8")).hexdigest()[:24]

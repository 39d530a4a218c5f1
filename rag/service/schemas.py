"""Request bodies of the service, validated by pydantic.

Does not: answer anything.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Literal, Optional, Union


from pydantic.json_schema import SkipJsonSchema
from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.fields import FieldInfo

from ..conversations.store import valid_session_id

from ..index.collection_names import DEFAULT_COLLECTION
from ..qa.options import MAX_CANDIDATES, MAX_TARGET_TTFT_S, AskOptions, CollectionName, offered
from ..retrieval.scope import Scope


SCOPE_FIELD = Field(None, description=AskOptions.describe("scope"))

class _AskBase(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: str = Field(..., min_length=1, max_length=20_000)
    stream: bool = False
    # Sent by the resident server's own client (MCP over HTTP through it names its caller's scope); read
    # from no other caller (routes.ask), and not shown in the API's schema.
    cache_scope: SkipJsonSchema[str | None] = Field(None, max_length=64, pattern=r"^[0-9a-f.]*$")


class _Asked(BaseModel):
    def options(self) -> dict[str, object]:
        """The question's options this body gave, by their :class:`AskOptions`
        names (for ``Answering.start``); those left out take the service's defaults."""
        given = {o.name: getattr(self, o.wire) for o in offered("http")}
        return {name: value for name, value in given.items() if value is not None}


def _given(option) -> tuple[object, FieldInfo]:
    # Optional in a body (None: the default), with the option's bounds and words; a target of more than
    # ten minutes is no target a person waits for.
    annotation = Optional[option.field.annotation]
    if option.name == "target_ttft":
        annotation = Annotated[annotation, Field(le=MAX_TARGET_TTFT_S)]
    info = FieldInfo.merge_field_infos(option.field, default=None, description=option.words(option.name != "max_tokens"))
    return annotation, info


def asked_fields(skip: tuple[str, ...] = (), options: "type[AskOptions] | None" = None
                 ) -> dict[str, tuple[object, FieldInfo]]:
    """Every option of ``options`` (default :class:`AskOptions`) offered on
    the HTTP surface, as a body's optional fields by their wire names
    (``target_ttft_s``): declared there, written nowhere else."""
    return {o.wire: _given(o) for o in offered("http", options) if o.wire not in skip}


AskBody = create_model("AskBody", __base__=(_AskBase, _Asked), __doc__="``POST /v1/ask``.",
                       __module__=__name__, **asked_fields())


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


class _ChatBase(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[ChatMessage] = Field(..., min_length=1)
    stream: bool = False
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    user: str | None = Field(None, max_length=256)


class ChatBody(create_model("_ChatOptions", __base__=(_ChatBase, _Asked), **asked_fields(skip=("max_tokens",)))):
    """``POST /v1/chat/completions``: the OpenAI fields this service uses;
    others are accepted and ignored. A question's options are extra
    fields, as in ``POST /v1/ask``: ``session`` (or ``user``) continues a
    stored conversation (without one, the last user message is answered
    on its own), ``scope`` limits the documents it draws on."""

    def session_id(self) -> str | None:
        """The conversation this request continues: ``session``, else the
        OpenAI ``user`` (any string: used as is when it is a usable id, else
        as a stable id made from it)."""
        if self.session is not None or not self.user:
            return self.session
        if valid_session_id(self.user):
            return self.user
        return "user-" + hashlib.sha256(self.user.encode("utf-8")).hexdigest()[:24]

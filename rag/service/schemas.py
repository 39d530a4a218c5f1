"""Request bodies of the service, validated by pydantic.

Does not: answer anything.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..qa.options import DEFAULT_MAX_TOKENS


class AskBody(BaseModel):
    """``POST /v1/ask``."""

    model_config = ConfigDict(extra="forbid")

    question: str = Field(..., min_length=1, max_length=20_000)
    target_ttft_s: float | None = Field(None, gt=0, le=600)
    session: str | None = Field(None, max_length=128)
    max_tokens: int = Field(DEFAULT_MAX_TOKENS, ge=1)
    stream: bool = False


class ChatMessage(BaseModel):
    """One OpenAI chat message; ``content`` is text or a list of content parts."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list | None = None

    def text(self) -> str:
        """The message's text: the string, or its text parts joined."""
        content = self.content
        if isinstance(content, list):  # OpenAI content parts: keep the text ones
            return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        return content or ""


class ChatBody(BaseModel):
    """``POST /v1/chat/completions``: the OpenAI fields this service uses;
    others are accepted and ignored. ``session`` (an extra field, or
    ``user``) continues a stored conversation; without one, the last user
    message is answered on its own."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[ChatMessage] = Field(..., min_length=1)
    stream: bool = False
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    user: str | None = Field(None, max_length=128)
    session: str | None = Field(None, max_length=128)
    target_ttft_s: float | None = Field(None, gt=0, le=600)

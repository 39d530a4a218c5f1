"""Settings of ``rag serve``: from its options or ``RAG_SERVE_*`` variables.

Does not: hold what the pipeline needs (``rag.settings`` does).
"""

from __future__ import annotations

import ipaddress

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ..errors import RagError


class ServiceSettings(BaseSettings):
    """Settings of ``rag serve``, from arguments or ``RAG_SERVE_*`` variables."""

    model_config = SettingsConfigDict(env_prefix="RAG_SERVE_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_keys: list[str] = Field(default_factory=list, description="Bearer keys; required off loopback")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="Largest request body")
    max_tokens_limit: int = Field(1024, ge=1, description="Most answer tokens a request may ask for")
    max_upload_bytes: int = Field(20 << 20, ge=1024, description="Largest document upload")
    rate_limit_per_minute: int = Field(120, ge=0, description="Requests per minute per API key (or client address); 0: none")
    reject_over_target: bool = Field(True, description="429 when the queue alone exceeds the target; else minimum context")
    load_aware: bool = Field(True, description="Plan each request's budget with the queue wait expected ahead of it")

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value):
        if isinstance(value, str):
            return [k.strip() for k in value.split(",") if k.strip()]
        return value

    def check(self) -> None:
        """Refuse settings that would expose the service: a non-loopback
        address without API keys."""
        if not is_loopback(self.host) and not self.api_keys:
            raise RagError(
                f"binding {self.host} exposes the service beyond this machine: set API keys "
                "(RAG_SERVE_API_KEYS=key1,key2) or bind 127.0.0.1"
            )


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine only (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

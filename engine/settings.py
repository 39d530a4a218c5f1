"""How the engine is set up: a validated value object (``engine.opening``
opens the backend it describes).

Every engine default is written here once, in :class:`EngineSettings`. The
values come from ``rag.settings.Settings``, whose ``engine`` field they are
(command-line flags and ``RAG_*`` variables); this module reads no
environment itself.

Does not: decide prompts or keep profiles.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import EngineSettingsError
from .scheduler import BUSY_STEP_TOKENS


def engine_urls(value: str | None) -> list[str]:
    """The engine URLs of an ``engine_url`` setting: one, or several separated by commas.

    ``engine_urls("http://a:8080, http://b:8080") -> ["http://a:8080", "http://b:8080"]``
    """
    return [u.strip() for u in (value or "").split(",") if u.strip()]


DEFAULT_N_CTX = 4096  # tokens of one request's context, in process (a server has its own)
DEFAULT_N_BATCH = 512
DEFAULT_SLOTS = 8  # sequences served at once
DEFAULT_REPEAT_PENALTY = 1.1  # also the remote backend's, sent to its server
DEFAULT_SNAPSHOT_RAM_BYTES = 512 << 20  # saved session KV; also a SnapshotCache's own bounds
DEFAULT_SNAPSHOT_DISK_BYTES = 2 << 30
OFF = ("none", "off")  # the words that switch passage splicing off


def none_for(value: object, words: tuple[str, ...] = OFF) -> object:
    """None where ``value`` is one of ``words`` (a setting switched off by a
    word, ``"off"``), else ``value`` as it came, for pydantic to check."""
    return None if isinstance(value, str) and value.strip().lower() in words else value


class EngineSettings(BaseModel):
    """The engine options, each default written here once. With
    ``engine_url`` set, a server answers (``RemoteBackend``) and the
    local-model fields (passage KV reuse included) do not apply; otherwise
    llama.cpp runs in this process (``LlamaCppBackend`` is built from them).

    :meth:`changed` is a validated copy with some fields changed.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())

    engine_url: Optional[str] = Field(
        None, description="OpenAI-compatible server, e.g. http://127.0.0.1:8080; several, comma-separated, are "
                          "served through vLLM's router, started over them")
    engine_routing: Literal["cache_aware", "round_robin", "power_of_two", "consistent_hash", "random"] = Field(
        "cache_aware", description="the policy of the vLLM router started over several engine URLs")
    engine_model: Optional[str] = Field(None, description="the model name on that server (default: its first)")
    engine_api_key: Optional[str] = Field(None, description="bearer key for that server")
    n_ctx: Optional[int] = Field(
        None, ge=256, description=f"context window of one request in tokens (default {DEFAULT_N_CTX:,}, or the server's)")
    gpu_layers: Optional[int] = Field(None, ge=-1, description="layers offloaded to the GPU; -1 all (default where there is a GPU)")
    n_threads: Optional[int] = Field(None, ge=1, description="CPU threads (default: one per physical core)")
    n_batch: int = Field(DEFAULT_N_BATCH, ge=1, description="prompt tokens one step holds at most")
    flash_attn: Optional[bool] = Field(None, description="flash attention (default: on)")
    kv_type: Literal["f16", "q8_0"] = Field("f16", description="the KV cache's value type")
    slots: int = Field(DEFAULT_SLOTS, ge=1, le=250, description="requests the in-process engine serves at once")
    kv_cells: Optional[int] = Field(None, ge=256, description="KV cells those requests share (default: twice n_ctx)")
    busy_step_tokens: int = Field(
        BUSY_STEP_TOKENS, ge=1, description="prompt tokens a step takes beside decodes, at least (engine.scheduler)")
    repeat_penalty: float = Field(DEFAULT_REPEAT_PENALTY, gt=0, description="the penalty on tokens repeated in an answer")
    check_memory: bool = Field(True, description="refuse a KV cache larger than the memory before llama.cpp allocates it")
    snapshot_ram_bytes: int = Field(DEFAULT_SNAPSHOT_RAM_BYTES, ge=0, description="bytes of saved session KV kept in RAM")
    snapshot_disk_bytes: int = Field(DEFAULT_SNAPSHOT_DISK_BYTES, ge=0, description="bytes of saved session KV kept on disk")
    # Passage KV reuse is off by default: no R of `rag bench splice` reached 0.95 agreement (README).
    splice_fresh: Optional[int] = Field(
        None, ge=0,
        description="passage KV reuse: tokens at a spliced passage's head evaluated again; off (the default) for none")
    exact_passages: bool = Field(
        True, description="lossless passage KV reuse: a prompt takes the exact KV of passages an earlier prompt "
                          "evaluated after the same tokens (ignored while splice_fresh is set)")
    passage_ram_bytes: int = Field(1 << 30, ge=0, description="bytes of stored passage KV kept in RAM")
    passage_disk_bytes: int = Field(8 << 30, ge=0, description="bytes of stored passage KV kept on disk")

    @field_validator("splice_fresh", mode="before")
    @classmethod
    def _off_words(cls, value):
        return none_for(value)  # "none"/"off" switch splicing off

    def changed(self, **changes) -> EngineSettings:
        """A copy with ``changes`` validated (``settings.changed(slots=2)``); a
        TypeError naming the fields for a name that is not one, an
        EngineSettingsError naming the field for a value that is not valid."""
        unknown = sorted(set(changes) - set(type(self).model_fields))
        if unknown:
            raise TypeError(f"unexpected engine setting{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                            f"the engine settings are {', '.join(type(self).model_fields)}")
        if not changes:
            return self
        try:
            return type(self).model_validate(self.model_dump() | changes)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise EngineSettingsError(f"{'.'.join(map(str, first['loc'])) or 'engine settings'}: {first['msg']}") from None

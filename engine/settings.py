"""How the engine is set up: a validated value object, and the one function
that opens the backend it describes.

The values come from ``rag.settings.Settings`` (command-line flags and
``RAG_*`` variables); this module reads no environment itself.

Does not: decide prompts or keep profiles.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from .backend import Backend


def engine_urls(value: str | None) -> list[str]:
    """The engine URLs of an ``engine_url`` setting: one, or several separated by commas.

    ``engine_urls("http://a:8080, http://b:8080") -> ["http://a:8080", "http://b:8080"]``
    """
    return [u.strip() for u in (value or "").split(",") if u.strip()]


class EngineSettings(BaseModel):
    """The engine options. With ``engine_url`` set, a server answers
    (``RemoteBackend``) and the local-model fields (passage KV reuse
    included) do not apply; otherwise
    llama.cpp runs in this process."""

    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())

    engine_url: Optional[str] = Field(
        None, description="OpenAI-compatible server, e.g. http://127.0.0.1:8080; several, comma-separated, are "
                          "served through vLLM's router, started over them")
    engine_routing: Literal["cache_aware", "round_robin", "power_of_two", "consistent_hash", "random"] = Field(
        "cache_aware", description="the policy of the vLLM router started over several engine URLs")
    engine_model: Optional[str] = Field(None, description="the model name on the server (default: its first)")
    engine_api_key: Optional[str] = Field(None, description="bearer key for the server")
    gpu_layers: Optional[int] = Field(None, ge=-1, description="layers offloaded to the GPU; -1 all (default where there is a GPU)")
    flash_attn: Optional[bool] = Field(None, description="flash attention (default: on)")
    kv_type: Literal["f16", "q8_0"] = Field("f16", description="the KV cache's value type")
    slots: int = Field(8, ge=1, le=250, description="requests the in-process engine serves at once")
    kv_cells: Optional[int] = Field(None, ge=256, description="KV cells all of them share (default: twice the context)")
    splice_fresh: Optional[int] = Field(None, ge=0, description="tokens at a spliced passage's head evaluated again; None: splicing off")
    exact_passages: bool = Field(True, description="reuse the exact KV of passages held from earlier prompts (lossless)")
    passage_ram_bytes: int = Field(1 << 30, ge=0, description="stored passage KV kept in RAM, bytes")
    passage_disk_bytes: int = Field(8 << 30, ge=0, description="stored passage KV kept on disk, bytes")


def open_backend(
    settings: EngineSettings,
    *,
    model: str | os.PathLike[str] | None,
    n_ctx: int | None,
    snapshot_dir: Path | None,
    snapshot_ram_bytes: int,
    snapshot_disk_bytes: int,
    check_dir: Path | None = None,
    notice: Callable[[str], None] | None = None,
    extra_bufts: bool | None = None,
) -> Backend:
    """The backend ``settings`` describe: a remote server, or the GGUF
    ``model`` (default: the bundled one) in this process with a context of
    ``n_ctx`` (default 4,096). Raises an EngineError with a message for the
    user: ModelFileError, EngineSettingsError, InsufficientMemory or
    EngineUnreachable, or EngineCrashed (llama.cpp dies on this machine; the
    verdict of its self-check is kept in ``check_dir``; ``extra_bufts``
    given skips it, see ``LlamaCppBackend``). Several comma-separated URLs
    start vLLM's router over them, routing by ``engine_routing``, and the
    backend talks to the router (stopped when the backend closes); without
    ``vllm-router`` installed, EngineUnreachable says how to start it."""
    urls = engine_urls(settings.engine_url)
    if urls:
        from .remote.backend import RemoteBackend

        router = None
        if len(urls) > 1:
            from .remote.router import RouterProcess

            router = RouterProcess(urls, policy=settings.engine_routing)
        try:
            return RemoteBackend(router.url if router else urls[0], model=settings.engine_model,
                                 api_key=settings.engine_api_key, n_ctx=n_ctx, owned=router)
        except BaseException:
            if router is not None:
                router.stop(keep_log=True)
            raise
    from .llama_cpp.backend import DEFAULT_N_CTX, LlamaCppBackend

    return LlamaCppBackend(
        model, n_ctx=n_ctx or DEFAULT_N_CTX, n_gpu_layers=settings.gpu_layers, flash_attn=settings.flash_attn,
        kv_type=settings.kv_type, slots=settings.slots, kv_cells=settings.kv_cells, snapshot_dir=snapshot_dir,
        snapshot_ram_bytes=snapshot_ram_bytes, snapshot_disk_bytes=snapshot_disk_bytes,
        splice_fresh=settings.splice_fresh, exact_passages=settings.exact_passages, passage_ram_bytes=settings.passage_ram_bytes,
        passage_disk_bytes=settings.passage_disk_bytes, check_dir=check_dir, notice=notice,
        extra_bufts=extra_bufts,
    )

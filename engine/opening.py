"""The one function that opens the backend an :class:`~engine.settings.EngineSettings`
describes: a server (``RemoteBackend``, vLLM's router started over several)
or llama.cpp in this process. Kept apart from the settings, which every
backend reads its defaults from, so that no backend module imports the
module that imports it.

Does not: read the environment (``rag.settings`` does) or keep profiles.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from .backend import Backend
from .settings import EngineSettings, engine_urls


def open_backend(
    settings: EngineSettings,
    *,
    model: str | os.PathLike[str] | None,
    snapshot_dir: Path | None,
    check_dir: Path | None = None,
    notice: Callable[[str], None] | None = None,
    extra_bufts: bool | None = None,
) -> Backend:
    """The backend ``settings`` describe: a remote server, or the GGUF
    ``model`` (default: the bundled one) in this process, its session KV
    saved under ``snapshot_dir`` (None: in RAM only). Raises an EngineError
    with a message for the user: ModelFileError, EngineSettingsError,
    InsufficientMemory or EngineUnreachable, or EngineCrashed (llama.cpp
    dies on this machine; the verdict of its self-check is kept in
    ``check_dir``; ``extra_bufts`` given skips it, see ``LlamaCppBackend``).
    Several comma-separated URLs start vLLM's router over them, routing by
    ``engine_routing``, and the backend talks to the router (stopped when
    the backend closes); without ``vllm-router`` installed,
    EngineUnreachable says how to start it."""
    urls = engine_urls(settings.engine_url)
    if urls:
        from .remote.backend import RemoteBackend

        router = None
        if len(urls) > 1:
            from .remote.router import RouterProcess

            router = RouterProcess(urls, policy=settings.engine_routing)
        try:
            return RemoteBackend(router.url if router else urls[0], model=settings.engine_model,
                                 api_key=settings.engine_api_key, n_ctx=settings.n_ctx,
                                 repeat_penalty=settings.repeat_penalty, owned=router)
        except BaseException:
            if router is not None:
                router.stop(keep_log=True)
            raise
    from .llama_cpp.backend import LlamaCppBackend

    return LlamaCppBackend(model, settings, snapshot_dir=snapshot_dir, check_dir=check_dir, notice=notice,
                           extra_bufts=extra_bufts)

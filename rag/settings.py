"""rag-budget's settings: one validated object, read once.

Every field ``name`` may come from the variable ``RAG_NAME``; command-line
flags (and arguments of :meth:`Settings.load`) override the variables, in
that one place. The pipeline, every command and the service take their
index, model, retrieval mode, target, paths and engine from it. The engine's
options are one field, ``engine`` (an ``engine.settings.EngineSettings``,
where their defaults are written); each keeps its flat name: ``RAG_SLOTS``,
``Settings.load(slots=2)``, read as ``settings.engine.slots``.

Does not: open anything; it only says where and how.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from typing import Literal, Optional, Union

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from engine.settings import EngineSettings, none_for

from . import paths
from .errors import RagError
from .index.location import as_index_location


RetrievalMode = Literal["dense", "bm25", "hybrid"]
DEFAULT_TARGET_TTFT = 2.0
NO_TARGET = ("none", "off", "inf")
ENGINE_FIELDS = frozenset(EngineSettings.model_fields)  # Settings.engine's, each also a flat name here

# The flag each field is set by on the command line, for error messages.
FLAGS = {
    "index": "--index", "model": "--model", "retrieval": "--retrieval", "target_ttft": "--target-ttft",
    "engine_url": "--engine-url", "engine_routing": "--engine-routing", "engine_model": "--engine-model",
    "gpu_layers": "--gpu-layers", "flash_attn": "--flash-attn", "kv_type": "--kv-type", "max_file_mb": "--max-file-mb",
    "no_server": "--no-server", "service_url": "--service-url",
    "splice_fresh": "--splice-fresh", "exact_passages": "--exact-passages",
}


# Evidence score (rag.qa.evidence: word share plus passage cosine) under which the documents are
# taken not to answer. Measured (`rag bench answers --evidence-only`, 2026-12-05): the 38 answerable
# questions scored 1.07 and up, the 20 "how do I" and 30 follow-up questions 0.86 and up, 12 the
# Python docs do not answer 0.24-0.60; on the small sample corpus a partly answered question scored
# 0.52, unanswerable ones 0.08-0.15. At 0.45: 8 of those 12 declined, no answerable one.
# Chosen again on the tuning halves alone (issue 44; `rag bench answers --half tuning --evidence-floor 0`
# over git_docs and french_docs, 56 answerable and 8 unanswerable questions, every one asked): the
# highest floor that declines no question the model answered right and at most 5 % of the answerable
# ones. At 0.45 / 0.55 / 0.6: right answers lost 0 / 0 / 0, answerable declined 1 / 1 / 4 of 56,
# unanswerable declined 1 / 4 / 4 of 8.
DEFAULT_EVIDENCE_FLOOR = 0.55


class Settings(BaseSettings):
    """Where the index, conversations and caches live, which model and
    engine answer, how candidates are retrieved and the default TTFT target."""

    model_config = SettingsConfigDict(env_prefix="RAG_", extra="ignore", protected_namespaces=(), frozen=True)

    index: Optional[Union[str, Path]] = Field(
        None, description="index folder, or a postgresql:// URL (default: the per-user index, else the sample corpus)")
    model: Optional[Path] = Field(None, description="GGUF model file (default: the bundled SmolLM2-135M-Instruct)")
    retrieval: RetrievalMode = Field("hybrid", description="hybrid (dense + BM25), dense or bm25")
    target_ttft: Optional[float] = Field(
        DEFAULT_TARGET_TTFT, gt=0, description="seconds to first token to plan for; none for no target")
    evidence_floor: float = Field(
        DEFAULT_EVIDENCE_FLOOR, ge=0,
        description="evidence score under which a question is answered that the documents do not seem to answer; 0: never")
    conversations: Optional[Union[str, Path]] = Field(
        None, description="conversation store: a SQLite file, or a postgresql:// URL (default: a file under the data folder)")
    data_dir: Optional[Path] = Field(None, description="user data (default: $XDG_DATA_HOME/rag-budget)")
    cache_dir: Optional[Path] = Field(None, description="rebuildable caches (default: $XDG_CACHE_HOME/rag-budget)")
    max_file_mb: float = Field(16.0, gt=0, description="files larger than this many MiB are not ingested")
    engine: EngineSettings = Field(
        default_factory=EngineSettings,
        description="the engine's options, each also set by its flat name (RAG_SLOTS, RAG_ENGINE_URL, ...)")
    no_server: bool = Field(False, description="rag ask, chat and search answer in process, not through the resident server")
    service_url: Optional[str] = Field(
        None, pattern=r"^https?://", description="rag ask, chat and search answer through the rag server at this URL "
                                                 "(`rag serve` elsewhere), not through a server of their own")
    service_key: Optional[str] = Field(None, description="the bearer key that server wants (RAG_SERVICE_KEY only)")
    server_idle_s: float = Field(900.0, gt=0, description="seconds a resident server waits idle before it exits")
    runtime_dir: Optional[Path] = Field(None, description="resident servers' sockets (default: $XDG_RUNTIME_DIR/rag-budget)")

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):
        return init_settings, env_settings, FlatEngineVariables(settings_cls), dotenv_settings, file_secret_settings

    @model_validator(mode="before")
    @classmethod
    def _engine_by_flat_names(cls, data):
        # slots=2 (a flag, an argument of load) is engine.slots; over the variables', and over an engine given.
        if not isinstance(data, dict) or not ENGINE_FIELDS & data.keys():
            return data
        data = dict(data)
        engine = data.get("engine") or {}
        engine = engine.model_dump(exclude_unset=True) if isinstance(engine, EngineSettings) else dict(engine)
        data["engine"] = engine | {name: data.pop(name) for name in ENGINE_FIELDS & data.keys()}
        return data

    def __getattr__(self, name: str):
        # The engine's options were flat before they were one field: settings.slots still reads one, with a warning.
        if name in ENGINE_FIELDS:
            warnings.warn(f"Settings.{name} is now Settings.engine.{name}", DeprecationWarning, stacklevel=2)
            return getattr(self.engine, name)
        return super().__getattr__(name)

    @field_validator("target_ttft", mode="before")
    @classmethod
    def _none_words(cls, value):
        return none_for(value, NO_TARGET)  # "none", "off" and "inf" switch the target off

    @field_validator("target_ttft", "max_file_mb", "server_idle_s")
    @classmethod
    def _finite(cls, value):
        if value is not None and not math.isfinite(value):
            raise ValueError("must be a finite number of seconds")
        return value

    @field_validator("model", "data_dir", "cache_dir", "runtime_dir")
    @classmethod
    def _expand(cls, value):
        return value.expanduser() if value is not None else None

    @field_validator("index")
    @classmethod
    def _index(cls, value):
        # A database URL stays as written (a Path would fold its "//").
        return as_index_location(value) if value is not None else None

    @field_validator("conversations")
    @classmethod
    def _store(cls, value):
        # A database URL stays as written (a Path would fold its "//").
        if value is None or paths.is_database_url(value):
            return value
        return Path(value).expanduser()

    @classmethod
    def load(cls, **overrides) -> "Settings":
        """The settings from ``RAG_*`` variables, with ``overrides`` (the
        command-line flags; None means not given) on top; a RagError naming
        the flag or variable for any value that is not valid."""
        given = {k: v for k, v in overrides.items() if v is not None}
        try:
            return cls(**given)
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = [str(part) for part in first.get("loc", ())]
            field = loc[1] if loc[:1] == ["engine"] and len(loc) > 1 else (loc[0] if loc else "settings")
            if field in given:
                source = FLAGS.get(field, field)
            elif loc[:1] == ["engine"] and "engine" in given:
                source = ".".join(loc)
            else:
                source = f"RAG_{field.upper()}"
            raise RagError(f"{source}: {first['msg']}") from None

    @property
    def max_file_bytes(self) -> int:
        """The largest file an ingest reads, in bytes."""
        return int(self.max_file_mb * 2**20)

    @property
    def data_folder(self) -> Path:
        """Where user data lives (``RAG_DATA_DIR``, else the XDG data folder)."""
        return self.data_dir or paths.data_dir()

    @property
    def cache_folder(self) -> Path:
        """Where rebuildable caches live (``RAG_CACHE_DIR``, else the XDG cache folder)."""
        return self.cache_dir or paths.cache_dir()

    @property
    def index_folder(self) -> Path | str:
        """The index to use: ``RAG_INDEX``/``--index`` (a folder, or a
        ``postgresql://`` URL), else the per-user folder."""
        return self.index or self.data_folder / "index"

    @property
    def conversations_path(self) -> Path | str:
        """The conversation store: ``RAG_CONVERSATIONS`` (a file, or a
        PostgreSQL URL), else a file under the data folder."""
        return self.conversations or self.data_folder / "conversations.sqlite"

    @property
    def runtime_folder(self) -> Path:
        """Where resident servers keep their sockets (``RAG_RUNTIME_DIR``, else
        ``$XDG_RUNTIME_DIR/rag-budget``, else ``/tmp/rag-budget-UID``)."""
        return self.runtime_dir or paths.runtime_dir()

    @property
    def profile_folder(self) -> Path:
        """Where measured prefill profiles are kept."""
        return self.cache_folder / "profiles"

    @property
    def engine_check_folder(self) -> Path:
        """Where the verdicts of the engine's self-check are kept (``engine.llama_cpp.selfcheck``)."""
        return self.cache_folder / "engine-checks"

    @property
    def kv_folder(self) -> Path:
        """Where KV snapshots are kept on disk."""
        return self.cache_folder / "kv"


class FlatEngineVariables(PydanticBaseSettingsSource):
    """The engine's options from their flat variables, ``RAG_SLOTS``,
    ``RAG_ENGINE_URL`` and so on, as ``{"engine": {...}}`` (the names the
    options had before they were one field, kept)."""

    def get_field_value(self, field, field_name):
        return None, field_name, False  # not used: __call__ reads them all

    def __call__(self) -> dict[str, object]:
        variables = {name.lower(): value for name, value in os.environ.items()}  # as RAG_* variables are read
        found = {name: variables[f"rag_{name}"] for name in EngineSettings.model_fields if f"rag_{name}" in variables}
        return {"engine": found} if found else {}

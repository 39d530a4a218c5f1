"""Settings of ``rag serve``: from its options or ``RAG_SERVE_*`` variables.

Does not: hold what the pipeline needs (``rag.settings`` does).
"""

from __future__ import annotations

import ipaddress
import json
import warnings
from pathlib import Path
from typing import Annotated, Literal, NamedTuple, Optional

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from ..errors import RagError
from ..index.collection_names import DEFAULT_COLLECTION, check_collection_name


class WatchedFolder(NamedTuple):
    """A folder a service keeps indexed, and the collection it goes into."""

    folder: Path
    collection: str = DEFAULT_COLLECTION

    @classmethod
    def parse(cls, text: "str | Path | WatchedFolder") -> "WatchedFolder":
        """``DIR`` or ``DIR=COLLECTION`` (the default collection when none
        is named); a ValueError for a collection name that cannot be one.

        ``WatchedFolder.parse("docs=handbook") -> WatchedFolder(Path("docs"), "handbook")``
        """
        if isinstance(text, WatchedFolder):
            return text
        if isinstance(text, Path):
            return cls(text)
        folder, equals, collection = str(text).rpartition("=")
        if not equals:
            return cls(Path(collection))
        try:
            return cls(Path(folder), check_collection_name(collection, "watch"))
        except RagError as exc:
            raise ValueError(str(exc)) from None


class ServiceSettings(BaseSettings):
    """Settings of ``rag serve``, from arguments or ``RAG_SERVE_*`` variables."""

    model_config = SettingsConfigDict(env_prefix="RAG_SERVE_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Bearer keys, comma-separated or a JSON list; required off loopback")
    keys_file: Optional[Path] = Field(
        None, description="A TOML or JSON file of keys: each key's holder and its rights per collection "
                          "(rag.service.keys); beside any api_keys")
    public_docs: bool = Field(False, description="Serve /docs and /openapi.json without a key when keys are set "
                                                 "(/metrics always takes a key that may read every collection)")
    auth_failures_per_minute: int = Field(10, ge=1, description="Wrong keys a client address may send a minute")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="Largest request body")
    max_tokens_limit: int = Field(1024, ge=1, description="Most answer tokens a request may ask for")
    max_upload_bytes: int = Field(20 << 20, ge=1024, description="Largest document upload")
    rate_limit_per_minute: int = Field(
        600, ge=0, description="Against floods only: requests a minute per caller (API key, else client address) "
                               "and kind (questions, uploads, the rest), in bursts of a tenth of that; 0: none")
    questions_in_flight: int = Field(
        16, ge=0, description="Questions (/v1/ask, /v1/chat/completions) one caller may have in flight at once; "
                              "0: no limit")
    uploads_in_flight: int = Field(4, ge=0, description="Uploads one caller may have in flight at once; 0: no limit")
    upload_bytes_in_flight: int = Field(
        80 << 20, ge=0, description="Bytes of uploads one caller may have in flight at once (at least "
                                    "max_upload_bytes); 0: no limit")
    reject_over_target: bool = Field(True, description="429 when the queue alone exceeds the target; else minimum context")
    # One admission decision since issue 56: the engine's own report of its queue (rag.service.README).
    # These chose between that and a queue estimate the service kept; accepted for one more release,
    # with a warning, and no longer read.
    load_aware: bool = Field(True, description="deprecated, no longer read")
    admission: Literal["deadline", "queue"] = Field("deadline", description="deprecated, no longer read")
    watch: Annotated[list[WatchedFolder], NoDecode] = Field(
        default_factory=list, description="Folders kept indexed: ingested at start and whenever a file changes, "
                                          "each DIR or DIR=COLLECTION (default: the default collection; "
                                          "comma-separated or a JSON list)")

    @field_validator("load_aware", "admission")
    @classmethod
    def _no_longer_read(cls, value, info):
        if value != cls.model_fields[info.field_name].default:
            warnings.warn(f"the service setting {info.field_name} is no longer read: every request is admitted and "
                          "planned by the engine's own report of its queue (rag/service/README.md)",
                          DeprecationWarning, stacklevel=2)
        return value

    @field_validator("api_keys", "watch", mode="before")
    @classmethod
    def _split(cls, value, info):
        if info.field_name != "watch":
            return listed(value, info.field_name)
        if isinstance(value, list) and not all(isinstance(v, str) for v in value):
            return [WatchedFolder.parse(v) for v in value]  # paths given in code: a Path is a folder whole
        value = listed(value, "watch")
        return [WatchedFolder.parse(v) for v in value] if isinstance(value, list) else value

    @field_validator("watch")
    @classmethod
    def _existing(cls, value: list[WatchedFolder]) -> list[WatchedFolder]:
        missing = [str(w.folder) for w in value if not w.folder.expanduser().exists()]
        if missing:
            raise ValueError(f"no such folder to watch: {', '.join(missing)}")
        return [WatchedFolder(w.folder.expanduser(), w.collection) for w in value]

    @model_validator(mode="after")
    def _room_for_one_upload(self) -> "ServiceSettings":
        if self.upload_bytes_in_flight and self.upload_bytes_in_flight < self.max_upload_bytes:
            raise ValueError(f"upload_bytes_in_flight ({self.upload_bytes_in_flight}) is below max_upload_bytes "
                             f"({self.max_upload_bytes}): set it to at least that, or 0 for no limit")
        return self

    def check(self) -> None:
        """Refuse settings that would expose the service: a non-loopback
        address without API keys."""
        if not is_loopback(self.host) and not self.api_keys and self.keys_file is None:
            raise RagError(
                f"binding {self.host} exposes the service beyond this machine: set API keys "
                "(RAG_SERVE_API_KEYS=key1,key2, or a key file in RAG_SERVE_KEYS_FILE) or bind 127.0.0.1"
            )

    @property
    def keyed(self) -> bool:
        """Whether requests need a key (plain API keys or a key file)."""
        return bool(self.api_keys) or self.keys_file is not None

    def keyring(self):
        """The keys accepted (:class:`~rag.service.keys.KeyRing`): the key
        file's, and the plain API keys with every right; a RagError naming
        a key file that cannot be read."""
        from .keys import KeyRing

        ring = KeyRing.plain(self.api_keys)
        return ring.merged(KeyRing.read(self.keys_file)) if self.keys_file is not None else ring


def listed(value, name: str):
    """A setting given as ``a,b`` or a JSON list, as a list of stripped,
    non-empty strings (anything else is left for pydantic to refuse).

    ``listed(" k1, k2 ,", "api_keys") -> ["k1", "k2"]``
    """
    if isinstance(value, str):
        text = value.strip()
        if not text.startswith("["):
            return [k.strip() for k in text.split(",") if k.strip()]
        try:
            value = json.loads(text)
        except ValueError:
            raise ValueError(f"{name}: not a JSON list; give them as a,b or [\"a\", \"b\"]") from None
    if isinstance(value, list):
        return [str(k).strip() for k in value if str(k).strip()]
    return value


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine only (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

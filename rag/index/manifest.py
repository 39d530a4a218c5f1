"""What an index generation was built with, and what its files must be.

``manifest.json`` (JSON, never pickled) records the format version, the
embedding model and its dimension, the chunker settings, the number of
chunks, and each file of the generation with its size and SHA-256, so a
damaged file is found before it is used.

Does not: open or write the files it describes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import IndexMismatch

FORMAT_NAME = "rag-budget-index"
# 2: chunks carry their context (title, headings) and location; 3: and their language; 4: and their
# document's units (sentences, items, definitions, rows, code lines), each with what it is about
FORMAT_VERSION = 4


@dataclass(frozen=True)
class Manifest:
    """What an index was built with; an index is only opened by the same.
    ``files`` maps each file of the generation (relative, ``/``-separated)
    to ``{"bytes": n, "sha256": hex}``; empty in generations written before
    it was recorded."""

    embedder: str
    dim: int
    chunker: dict[str, int]
    format_version: int = FORMAT_VERSION
    chunks: int | None = None
    files: dict[str, dict[str, object]] = field(default_factory=dict)

    def to_json(self) -> str:
        raw: dict[str, object] = {
            "format": FORMAT_NAME,
            "format_version": self.format_version,
            "embedder": self.embedder,
            "dim": self.dim,
            "chunker": self.chunker,
        }
        if self.chunks is not None:
            raw["chunks"] = self.chunks
        if self.files:
            raw["files"] = self.files
        return json.dumps(raw, indent=2, sort_keys=True)

    @classmethod
    def read(cls, path: Path) -> "Manifest":
        """The manifest at ``path``; IndexMismatch if it is not one."""
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
                raise ValueError("not a rag-budget manifest")
            files = raw.get("files") or {}
            if not isinstance(files, dict) or not all(isinstance(v, dict) for v in files.values()):
                raise ValueError("its file list is malformed")
            return cls(
                embedder=str(raw["embedder"]),
                dim=int(raw["dim"]),
                chunker={str(k): int(v) for k, v in raw["chunker"].items()},
                format_version=int(raw["format_version"]),
                chunks=int(raw["chunks"]) if raw.get("chunks") is not None else None,
                files={str(k): dict(v) for k, v in files.items()},
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise IndexMismatch(
                f"{path}: unreadable index manifest ({exc}); rebuild the index with `rag ingest --rebuild`"
            ) from None


def sha256_of(path: Path, block: int = 1 << 20) -> str:
    """The SHA-256 of a file's bytes, read a block at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def describe_files(generation: Path, names: list[str]) -> dict[str, dict[str, object]]:
    """``{name: {"bytes": n, "sha256": hex}}`` for the files ``names`` of ``generation``."""
    return {name: {"bytes": (generation / name).stat().st_size, "sha256": sha256_of(generation / name)}
            for name in names}


def check_manifest(manifest: Manifest, directory: Path, *, embedder: str, dim: int,
                   chunker: dict[str, int] | None = None) -> None:
    """Raise IndexMismatch unless ``manifest`` matches what is asked for."""
    if manifest.format_version != FORMAT_VERSION:
        raise IndexMismatch(
            f"{directory}: index format version {manifest.format_version}, this rag-budget reads version "
            f"{FORMAT_VERSION}; rebuild it with `rag ingest --rebuild PATH --index {directory}`"
        )
    if manifest.embedder != embedder or manifest.dim != dim:
        raise IndexMismatch(
            f"{directory}: index built with embedder {manifest.embedder} (dim {manifest.dim}), "
            f"not {embedder} (dim {dim}); rebuild it into a new --index directory"
        )
    if chunker is not None and manifest.chunker != chunker:
        raise IndexMismatch(
            f"{directory}: index chunked with {_fmt(manifest.chunker)}, not {_fmt(chunker)}; "
            "ingest with the index's settings or into a new --index directory"
        )


def _fmt(settings: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(settings.items()))

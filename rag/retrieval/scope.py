"""Which documents a question may draw on: source globs and file types.

A :class:`Scope` is applied inside retrieval (dense, BM25 and hybrid alike),
before the budget, so every candidate the budgeter sees is in scope and the
budget is spent on passages from the documents asked about. Globs match a
chunk's ``source`` as ``rag ingest --include`` does (``rag.ingest.files``):
its path relative to the folder ingested, or its name, case-insensitively,
``**`` across folders.

Does not: search (``search`` does) or know which documents exist.
"""

from __future__ import annotations

from typing import Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..ingest.files import matches, usable_glob
from ..ingest.formats import SUPPORTED_SUFFIXES, format_suffix

MAX_SCOPE_ITEMS = 64


class Scope(BaseModel):
    """Documents whose source matches one of ``sources`` (globs; none: any)
    and whose type is one of ``types`` (file extensions such as ``pdf`` or
    ``.docx``; none: any)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sources: tuple[str, ...] = Field((), max_length=MAX_SCOPE_ITEMS)
    types: tuple[str, ...] = Field((), max_length=MAX_SCOPE_ITEMS)

    @field_validator("sources")
    @classmethod
    def _globs(cls, value: Sequence[str]) -> tuple[str, ...]:
        return tuple(usable_glob(g) for g in value)

    @field_validator("types")
    @classmethod
    def _types(cls, value: Sequence[str]) -> tuple[str, ...]:
        types = tuple("." + t.strip().lower().lstrip(".") for t in value)
        unknown = [t for t in types if t not in SUPPORTED_SUFFIXES]
        if unknown:
            raise ValueError(f"{', '.join(unknown)} is not a type rag-budget reads; "
                             f"use one of {' '.join(sorted(SUPPORTED_SUFFIXES))}")
        return types

    @property
    def everything(self) -> bool:
        """Whether the scope lets every document through."""
        return not self.sources and not self.types

    def allows(self, source: str) -> bool:
        """Whether the document ``source`` is in scope.

        ``Scope(sources=["notes/*"], types=["md"]).allows("notes/a.MD") -> True``
        """
        if self.types:
            name = source.rsplit("/", 1)[-1]
            # By the suffix that picks the file's reader: "tcp.7.gz" is a man page (".man").
            if format_suffix(name) not in self.types:
                return False
        return not self.sources or matches(source, self.sources) is not None

    def describe(self) -> str:
        """The scope as the command line writes it: ``--source 'a/*' --type pdf``."""
        parts = [f"--source {g!r}" for g in self.sources] + [f"--type {t.lstrip('.')}" for t in self.types]
        return " ".join(parts) or "(everything)"

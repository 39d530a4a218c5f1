"""An indexed document read back from its file, to be shown: its text as
it is indexed (chunk spans are offsets into it), or its bytes as they are.

Does not: find documents by a path it is given (only by the index's own
records: see ``DocumentLibrary.locate``), or write anything.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import DocumentNotFound, RagError
from .files import DEFAULT_MAX_FILE_BYTES
from .formats import format_suffix, load_document
from .formats.document import text_limit
from .formats.pdf import PDF_SUFFIXES


@dataclass(frozen=True)
class DocumentText:
    """A document's text as the index holds it: ``pages`` are ``(page,
    offset)`` pairs (empty without pages); ``current`` is False when the
    file changed since it was indexed, so spans may no longer match."""

    id: str
    source: str
    text: str
    pages: tuple[tuple[int, int], ...]
    current: bool

    def to_dict(self) -> dict[str, object]:
        return {"id": self.id, "source": self.source, "text": self.text,
                "pages": [list(p) for p in self.pages], "current": self.current}


@dataclass(frozen=True)
class DocumentFile:
    """The file of the indexed document ``id``: ``path`` is where it lies,
    ``sha256`` what the index read."""

    id: str
    source: str
    path: Path
    sha256: str

    @property
    def is_pdf(self) -> bool:
        """Whether it is a PDF (shown by a PDF viewer, not as text)."""
        return format_suffix(self.path.name) in PDF_SUFFIXES

    @property
    def media_type(self) -> str:
        """How to serve its bytes: PDFs as PDFs; every other type as plain
        text, so that an uploaded HTML page is shown, never run."""
        return "application/pdf" if self.is_pdf else "text/plain; charset=utf-8"

    def read(self, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> bytes:
        """The file's bytes; DocumentNotFound when it is gone, a RagError
        when it cannot be read or is over ``max_bytes``."""
        try:
            with open(self.path, "rb") as fh:
                data = fh.read(max_bytes + 1)
        except FileNotFoundError:
            raise DocumentNotFound(f"{self.source}: its file is gone from {self.path.parent}; "
                                   "upload or ingest it again") from None
        except OSError as exc:
            raise RagError(f"{self.source}: cannot read its file ({exc.strerror or exc})") from None
        if len(data) > max_bytes:
            raise RagError(f"{self.source}: its file is now over {max_bytes} bytes; ingest it again")
        return data

    def text(self, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> DocumentText:
        """The text the index was made from (loaded as at ingest); a
        DocumentError when the file no longer loads."""
        data = self.read(max_bytes)
        loaded = load_document(self.source, format_suffix(self.path.name), data,
                               max_chars=text_limit(len(data), max_bytes))
        current = hashlib.sha256(data).hexdigest() == self.sha256
        return DocumentText(self.id, self.source, loaded.text, loaded.page_starts, current)


_ESCAPED_BYTE = re.compile(r"\\x([89a-f][0-9a-f])")  # how a byte that is not UTF-8 is written in a name


def raw_name(source: str) -> str:
    """The file system name that ``source`` spells, bytes that are not UTF-8
    written as ``\\xNN`` (the reverse of ``files.safe_name``).

    ``raw_name("caf\\xe9.md") -> os.fsdecode(b"caf\\xe9.md")``
    """
    parts = _ESCAPED_BYTE.split(source)
    data = b"".join(bytes([int(part, 16)]) if i % 2 else part.encode("utf-8", "surrogateescape")
                    for i, part in enumerate(parts))
    return os.fsdecode(data)


def file_in(root: str, source: str) -> Path:
    """Where the document ``source`` ingested from ``root`` lies. Both come
    from the index, never from a client; still, a source that would lead
    outside its root, by its name or through a symbolic link, is refused
    (DocumentNotFound)."""
    base = os.path.normpath(root)
    path = os.path.normpath(os.path.join(base, source))
    if not os.path.lexists(path):  # a name that is not UTF-8 is indexed spelled with \xNN
        path = os.path.normpath(os.path.join(base, raw_name(source)))
    if os.path.commonpath([base, path]) != base or path == base:
        raise DocumentNotFound(f"{source}: not a file inside {root}")
    real_base, real = os.path.realpath(base), os.path.realpath(path)
    if os.path.commonpath([real_base, real]) != real_base:
        raise DocumentNotFound(f"{source}: a symbolic link that leads outside {root}; not served")
    return Path(path)

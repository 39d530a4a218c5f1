"""Splitting document text into chunks sized in embedding-model tokens.

Uses langchain-text-splitters' recursive splitter, which breaks at
paragraphs, then lines, then words (source code: at the language's classes,
functions and blocks first), and measures each piece with the embedding
model's own tokenizer so no chunk is cut short by the embedder. Each chunk
keeps its location (no chunk spans two pages, slides, sheets or chapters)
and its context: the document's title and the headings above it; and the
document's own units (sentences, items, definitions, rows) that lie in it.

Does not: read files or embed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

from ..errors import RagError
from .formats import Location, LoadedDocument
from .formats.document import Unit, units_within

# Chosen by measurement on the Python documentation corpus (README,
# "Chunk size"): the embedder reads at most 256 tokens, and retrieval
# recall peaked at this size.
DEFAULT_CHUNK_TOKENS = 200
DEFAULT_OVERLAP_TOKENS = 30
SECTION_CHARS = 1 << 20  # longer texts are chunked a section at a time, with progress


class OverChunkLimit(RagError):
    """A document made more chunks than its limit: ``chunks`` holds its
    first ``limit`` (what a sheet cut at the limit keeps; any other
    document is refused with this message)."""

    def __init__(self, limit: int, chunks: list["TextChunk"]) -> None:
        super().__init__(f"it makes over {limit:,} chunks, the most a file of its size may make; not indexed "
                         "(thousands of tiny pages or chapters?): split the file, or raise --max-file-mb "
                         "(RAG_MAX_FILE_MB) for a large one")
        self.limit = limit
        self.chunks = chunks


def sections(text: str, size: int) -> list[tuple[int, int]]:
    """``(start, end)`` spans covering ``text`` in order, each at most about
    ``size`` characters, cut at a paragraph break, else a line break, else a
    space, where there is one in the second half of the span.

    ``sections("aa\\n\\nbb", 4) -> [(0, 4), (4, 6)]``
    """
    spans, start = [], 0
    while len(text) - start > size:
        end = start + size
        for mark in ("\n\n", "\n", " "):
            cut = text.rfind(mark, start + size // 2, end)
            if cut >= 0:
                end = cut + len(mark)
                break
        spans.append((start, end))
        start = end
    spans.append((start, len(text)))
    return spans


@dataclass(frozen=True)
class ChunkerSettings:
    """Chunk size and overlap, in embedding-model tokens."""

    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    overlap_tokens: int = DEFAULT_OVERLAP_TOKENS

    def __post_init__(self) -> None:
        if self.chunk_tokens < 16:
            raise ValueError(f"chunk size {self.chunk_tokens} tokens is too small; use at least 16")
        if not 0 <= self.overlap_tokens < self.chunk_tokens:
            raise ValueError(
                f"chunk overlap {self.overlap_tokens} must be at least 0 and less than the chunk size {self.chunk_tokens}"
            )

    def to_dict(self) -> dict[str, int]:
        """The settings as stored in the index manifest."""
        return asdict(self)


@dataclass(frozen=True)
class TextChunk:
    """A piece of a document: ``text == document.text[start:end]``, where
    it lies (``location``), and the title and headings above it (``context``)."""

    text: str
    start: int
    end: int
    n_tokens: int
    location: Location = Location()
    context: str = ""
    units: tuple[Unit, ...] = ()  # the document's units within it, offsets into ``text``

    @property
    def page(self) -> int | None:
        """The chunk's page, for paged documents."""
        return self.location.page


class Chunker:
    """Splits documents into overlapping chunks of at most ``chunk_tokens``."""

    def __init__(self, count_tokens: Callable[[str], int], settings: ChunkerSettings = ChunkerSettings()) -> None:
        self.settings = settings
        self._count = count_tokens
        self._splitters: dict[str | None, object] = {}

    def _splitter(self, language: str | None):
        """The splitter for prose (None) or for a programming language."""
        if language not in self._splitters:
            from langchain_text_splitters import Language, RecursiveCharacterTextSplitter

            options = dict(chunk_size=self.settings.chunk_tokens, chunk_overlap=self.settings.overlap_tokens,
                           length_function=self._count, strip_whitespace=True)
            self._splitters[language] = (
                RecursiveCharacterTextSplitter(**options) if language is None
                else RecursiveCharacterTextSplitter.from_language(Language(language), **options)
            )
        return self._splitters[language]

    def split(self, document: LoadedDocument, progress: Callable[[float], None] | None = None, *,
              max_chunks: int | None = None) -> list[TextChunk]:
        """The document's chunks in reading order, each with its span,
        location and context; ``progress(share)`` is told the share of the
        text done as it goes. OverChunkLimit (a RagError naming the limit,
        holding the first ``max_chunks`` chunks) as soon as there are more
        than ``max_chunks`` (None: no limit).

        Segments (pages, slides, sheets, chapters) are split separately, so
        a chunk never spans two and its location is exact. A text longer
        than ``SECTION_CHARS`` is split in sections at paragraph breaks, so
        that progress can be reported inside it.
        """
        text = document.text
        spans = [
            (start + a, start + b)
            for start, end in document.spans()
            for a, b in sections(text[start:end], SECTION_CHARS)
        ]
        splitter = self._splitter(document.language)
        chunks: list[TextChunk] = []
        for start, end in spans:
            for chunk_text, at in self._split_span(splitter, text[start:end]):
                chunks.append(TextChunk(
                    text=chunk_text, start=start + at, end=start + at + len(chunk_text),
                    n_tokens=self._count(chunk_text),
                    location=document.locate(start + at, start + at + len(chunk_text)),
                    context=document.context(start + at),
                    units=units_within(document.units, text, start + at, start + at + len(chunk_text)),
                ))
                if max_chunks is not None and len(chunks) > max_chunks:
                    raise OverChunkLimit(max_chunks, chunks[:max_chunks])
            if progress:
                progress(end / max(len(text), 1))
        return chunks

    @staticmethod
    def _split_span(splitter, text: str) -> list[tuple[str, int]]:
        """``(chunk text, offset in text)`` of each chunk of ``text``."""
        found = []
        # Each chunk starts after the one before it (the overlap is smaller
        # than a chunk), so searching from just past the previous start finds
        # its true place even when the same text occurs earlier, as table
        # borders do. The splitter's own start_index cannot be used: it
        # subtracts the overlap, counted here in tokens, as characters.
        previous = -1
        for chunk_text in splitter.split_text(text):
            start = text.find(chunk_text, previous + 1)
            if start < 0:  # cannot happen for substrings; keep the span honest if it does
                start = text.find(chunk_text)
            previous = start
            found.append((chunk_text, start))
        return found

"""Splitting document text into chunks sized in embedding-model tokens.

Uses langchain-text-splitters' recursive splitter, which breaks at
paragraphs, then lines, then words, and measures each piece with the
embedding model's own tokenizer so no chunk is cut short by the embedder.

Does not: read files or embed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

from .loaders import LoadedDocument

# Chosen by measurement on the Python documentation corpus (README,
# "Chunk size"): the embedder reads at most 256 tokens, and retrieval
# recall peaked at this size.
DEFAULT_CHUNK_TOKENS = 200
DEFAULT_OVERLAP_TOKENS = 30
SECTION_CHARS = 1 << 20  # longer texts are chunked a section at a time, with progress


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
    """A piece of a document: ``text == document.text[start:end]``."""

    text: str
    start: int
    end: int
    page: int | None
    n_tokens: int


class Chunker:
    """Splits documents into overlapping chunks of at most ``chunk_tokens``."""

    def __init__(self, count_tokens: Callable[[str], int], settings: ChunkerSettings = ChunkerSettings()) -> None:
        from langchain_text_splitters import RecursiveCharacterTextSplitter

        self.settings = settings
        self._count = count_tokens
        self._splitter = RecursiveCharacterTextSplitter(
            chunk_size=settings.chunk_tokens,
            chunk_overlap=settings.overlap_tokens,
            length_function=count_tokens,
            strip_whitespace=True,
        )

    def split(self, document: LoadedDocument, progress: Callable[[float], None] | None = None) -> list[TextChunk]:
        """The document's chunks in reading order, each with its span and page;
        ``progress(share)`` is told the share of the text done as it goes.

        Pages are split separately, so a chunk never spans two pages and its
        page number is exact. A text longer than ``SECTION_CHARS`` is split
        in sections at paragraph breaks, so that progress can be reported
        inside it.
        """
        text = document.text
        if not document.page_starts:
            spans = [(start, end, None) for start, end in sections(text, SECTION_CHARS)]
        else:
            bounds = [start for _, start in document.page_starts[1:]] + [len(text)]
            spans = [(start, end, page) for (page, start), end in zip(document.page_starts, bounds)]
        chunks: list[TextChunk] = []
        for start, end, page in spans:
            chunks.extend(self._split_span(text[start:end], start, page))
            if progress:
                progress(end / max(len(text), 1))
        return chunks

    def _split_span(self, text: str, offset: int, page: int | None) -> list[TextChunk]:
        chunks = []
        # Each chunk starts after the one before it (the overlap is smaller
        # than a chunk), so searching from just past the previous start finds
        # its true place even when the same text occurs earlier, as table
        # borders do. The splitter's own start_index cannot be used: it
        # subtracts the overlap, counted here in tokens, as characters.
        previous = -1
        for chunk_text in self._splitter.split_text(text):
            start = text.find(chunk_text, previous + 1)
            if start < 0:  # cannot happen for substrings; keep the span honest if it does
                start = text.find(chunk_text)
            previous = start
            chunks.append(
                TextChunk(
                    text=chunk_text,
                    start=offset + start,
                    end=offset + start + len(chunk_text),
                    page=page,
                    n_tokens=self._count(chunk_text),
                )
            )
        return chunks

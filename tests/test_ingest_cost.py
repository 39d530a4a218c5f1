"""What one file may cost an ingest (issue 37): a small EPUB expanding to
tens of MB of text is refused after reading its text limit, before anything
of it is embedded; a cancelled ingest stops within one batch and leaves the
previous index as it was; a lock file that is a link or a folder, a damaged
BM25 folder and what a killed ingest left are dealt with once. On the real
loaders, the real embedder (counted through a wrapper) and a real index;
every bound is a count (chapters parsed, texts embedded, calls, files)."""

from __future__ import annotations

import io
import threading
import zipfile

import pytest

from rag.errors import DocumentError
from rag.ingest import ingest
from rag.ingest.formats import epub as epub_format
from rag.ingest.formats import load_document
from rag.ingest.library import DocumentLibrary
from rag.ingest.run import EMBED_GROUP_CHUNKS
from tests.support.samples import make_epub

try:  # imported here so that each test fails on its own on the code before issue 37
    from rag.ingest.formats.document import MIN_TEXT_CHARS, text_limit
    from rag.ingest.run import IngestCancelled
except ImportError:
    MIN_TEXT_CHARS, text_limit, IngestCancelled = 2 << 20, None, type("IngestCancelled", (Exception,), {})

from .conftest import indexed_sources, write_corpus

CHAPTERS = 40


def _sentences(n: int, tag: str) -> str:
    """``n`` distinct sentences (distinct chunks: none is embedded once for all)."""
    return " ".join(f"Note {tag}-{i} says the valve {i % 97} opens at step {i}." for i in range(n))


def _bomb(chapters: int = CHAPTERS, chapter_chars: int = 1_100_000) -> bytes:
    """A small EPUB whose ``chapters`` chapters each hold about
    ``chapter_chars`` characters of text that deflates a thousandfold."""
    data = make_epub("Bomb", [(f"C{i}", ["x"]) for i in range(chapters)])
    source = zipfile.ZipFile(io.BytesIO(data))
    paragraph = b"<p>" + b"The quick brown fox jumps over the lazy dog. " * 20 + b"</p>\n"
    body = b"<html><body>" + paragraph * (chapter_chars // 900) + b"</body></html>"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as bomb:
        for info in source.infolist():
            chapter = info.filename.endswith((".xhtml", ".html")) and "nav" not in info.filename
            bomb.writestr(info.filename, body if chapter else source.read(info), zipfile.ZIP_DEFLATED, 9)
    return out.getvalue()


class Counted:
    """The real embedder, its calls and texts counted; ``on_call(n)`` runs
    after the n-th call; more than ``most`` texts fail the test at once (an
    unbounded ingest would run for minutes)."""

    def __init__(self, inner, most: int = 10_000, on_call=lambda n: None) -> None:
        self.inner, self.most, self.on_call = inner, most, on_call
        self.name, self.dim, self.max_tokens = inner.name, inner.dim, inner.max_tokens
        self.calls = self.texts = 0
        self.embedded: list[str] = []

    def embed(self, texts):
        self.calls += 1
        self.texts += len(texts)
        self.embedded.extend(texts)
        assert self.texts <= self.most, f"{self.texts} texts embedded: the ingest is not bounded"
        vectors = self.inner.embed(texts)
        self.on_call(self.calls)
        return vectors

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)


def test_a_small_epub_expanding_to_tens_of_mb_is_refused_after_its_text_limit(monkeypatch):
    data = _bomb()
    assert len(data) < 1 << 20  # a small file...
    parsed: list[int] = []
    real = epub_format.parse_html

    def counting(html, **kw):
        parsed.append(len(html))
        return real(html, **kw)

    monkeypatch.setattr(epub_format, "parse_html", counting)
    with pytest.raises(DocumentError) as refused:
        load_document("bomb.epub", ".epub", data)
    message = str(refused.value)
    assert f"{MIN_TEXT_CHARS:,} characters" in message and "\n" not in message, message
    # ...that expands to ~44 MB: reading stopped at the chapter that passed 2 MiB of text.
    assert len(parsed) <= 3 < CHAPTERS, len(parsed)
    assert sum(parsed) < 4 * MIN_TEXT_CHARS


def test_text_limit_follows_the_file_size_within_the_file_size_limit():
    assert text_limit(46_711) == 2 << 20  # the EPUB: 47 MB of text
    assert text_limit(1_000_000) == 4_000_000  # under a minute of chunks at 2 cores
    assert text_limit(10 << 20) == 16 << 20  # never past the plain-file limit
    assert text_limit(10 << 20, ceiling=64 << 20) == 40 << 20


def test_ingest_refuses_the_bomb_before_embedding_any_of_it_and_indexes_the_rest(tmp_path, embedder, chunker):
    corpus = write_corpus(tmp_path / "corpus")
    (corpus / "bomb.epub").write_bytes(_bomb(chapters=6, chapter_chars=200_000))
    counted = Counted(embedder, most=200)  # the corpus is a few dozen chunks; the bomb some 1,500
    report = ingest(tmp_path / "index", [corpus], embedder=counted, chunker=chunker, max_file_bytes=256 << 10)
    failed = dict(report.failed)
    assert "bomb.epub" in failed and f"{256 << 10:,} characters" in failed["bomb.epub"], report.failed
    assert "bomb.epub" not in indexed_sources(tmp_path / "index", embedder)
    assert report.added and counted.texts == report.chunks_embedded <= 200


def test_chunking_stops_as_soon_as_a_file_passes_its_chunk_limit(embedder):
    from rag.errors import RagError
    from rag.ingest.chunking import Chunker

    calls = 0

    def counting(text: str) -> int:
        nonlocal calls
        calls += 1
        return embedder.count_tokens(text)

    # Thousands of tiny chapters: a chunk each, however little text they hold.
    doc = load_document("tiny.epub", ".epub", make_epub("Tiny", [(f"C{i}", [f"Word{i}."]) for i in range(600)]))
    whole = len(Chunker(counting).split(doc))
    calls_whole, calls = calls, 0
    assert whole >= 600
    with pytest.raises(RagError, match="over 100 chunks"):
        Chunker(counting).split(doc, max_chunks=100)
    assert calls < calls_whole / 4  # stopped at the 101st chunk, not after the 600th


def _big_note() -> str:
    """A Markdown file of about 6 batches of chunks."""
    return "\n\n".join(_sentences(12, f"p{i}") for i in range(6 * EMBED_GROUP_CHUNKS))


def test_a_cancelled_ingest_stops_within_one_batch_and_keeps_the_previous_index(tmp_path, embedder, chunker):
    corpus = write_corpus(tmp_path / "corpus")
    index = tmp_path / "index"
    ingest(index, [corpus], embedder=embedder, chunker=chunker)
    before = indexed_sources(index, embedder)
    generations_before = sorted(p.name for p in index.glob("gen-*"))
    (corpus / "big.md").write_text(_big_note(), encoding="utf-8")
    cancel = threading.Event()
    counted = Counted(embedder, on_call=lambda n: cancel.set() if n == 2 else None)
    with pytest.raises(IngestCancelled):
        ingest(index, [corpus], embedder=counted, chunker=chunker, cancel=cancel)
    assert counted.calls == 2  # set after the second batch: the third never starts
    assert indexed_sources(index, embedder) == before
    assert sorted(p.name for p in index.glob("gen-*")) == generations_before  # nothing half-built is left


def test_stopping_the_library_stops_an_upload_at_its_next_batch(tmp_path, embedder):
    library: DocumentLibrary

    def stop_on_first(n: int) -> None:
        if n == 1:
            library.stop_ingests()  # what a server told to exit does

    counted = Counted(embedder, on_call=stop_on_first)
    library = DocumentLibrary(tmp_path / "index", lambda: counted, lambda: None)
    with pytest.raises(IngestCancelled):
        library.add("big.md", _big_note().encode("utf-8"))
    assert counted.calls == 1
    assert not [p for p in library.uploads_dir.iterdir() if not p.name.startswith(".")]  # the file went too
    with pytest.raises(IngestCancelled):  # and every ingest after it, before anything is embedded
        library.add("small.md", b"A small note.\n")
    assert counted.calls == 1


def test_the_server_exit_handler_stops_the_ingests(tmp_path, embedder):
    import signal

    import uvicorn

    from rag.service.watching import stop_ingests_on_exit

    library = DocumentLibrary(tmp_path / "index", lambda: embedder, lambda: None)
    server = uvicorn.Server(uvicorn.Config(lambda scope, receive, send: None))
    stop_ingests_on_exit(server, library)
    server.handle_exit(signal.SIGTERM, None)
    assert server.should_exit and library.stopping.is_set()


def test_rag_serve_stops_its_ingests_on_sigterm(tmp_path, embedder, monkeypatch):
    """``rag serve``'s server (``rag.service.app.serve``) has the handler: a
    SIGTERM during an upload stops its ingest instead of waiting for it."""
    import signal
    from types import SimpleNamespace

    import uvicorn

    from rag.service import app as service_app
    from rag.service.settings import ServiceSettings

    library = DocumentLibrary(tmp_path / "index", lambda: embedder, lambda: None)
    ran: list[bool] = []

    def run(self, sockets=None):  # the SIGTERM uvicorn's own handler would receive, then the end
        self.handle_exit(signal.SIGTERM, None)
        ran.append(self.should_exit)

    monkeypatch.setattr(uvicorn.Server, "run", run)
    monkeypatch.setattr(service_app, "create_app", lambda pipeline, settings: (lambda scope, receive, send: None))
    service_app.serve(SimpleNamespace(library=library), ServiceSettings(port=0))
    assert ran == [True] and library.stopping.is_set()


# --- review of issue 37's bounds -------------------------------------------------------------------------------

_LONG_HEADERS = ["Measurement timestamp (UTC)", "Station identifier code", "Air temperature (degrees C)",
                 "Relative humidity (percent)", "Barometric pressure (hPa)", "Wind speed (metres per second)",
                 "Wind direction (degrees)", "Rainfall last hour (mm)", "Solar radiation (W per m2)",
                 "Sensor battery voltage (V)"]


def _readings_csv(target_bytes: int = 1_000_000) -> bytes:
    """A numeric CSV of about ``target_bytes`` under ten long headers: its
    text, each value beside its header, is some five times its bytes."""
    from tests.support.samples import make_csv

    row = [f"{(i * 37) % 1000 + 0.125:.3f}" for i in range(len(_LONG_HEADERS))]
    per_row = len(make_csv([row]))
    return make_csv([_LONG_HEADERS] + [row] * (target_bytes // per_row))


def test_a_1mb_csv_with_long_headers_is_read_whole_not_refused_as_a_bomb():
    data = _readings_csv()
    assert 900_000 < len(data) < 1 << 20
    doc = load_document("readings.csv", ".csv", data)  # refused before: its text passed 4 MB
    assert len(doc.text) > text_limit(len(data))  # the headers, repeated, are most of it
    assert doc.text.count("\n") + 1 == data.count(b"\n") and not doc.warnings


def test_a_sheet_whose_cells_expand_past_the_limit_is_still_refused():
    from tests.support.samples import make_xlsx

    cell = "The valve opens at dawn and closes at dusk. " * 11  # one shared string, some 480 characters
    data = make_xlsx({"S": [["A", "B"]] + [[cell, cell] for _ in range(3_000)]})  # ~2.9 MB of cells
    assert len(data) < 256 << 10
    with pytest.raises(DocumentError, match=f"{MIN_TEXT_CHARS:,} characters"):
        load_document("bomb.xlsx", ".xlsx", data)


def test_the_chunks_a_file_under_1mb_may_make_fit_a_minute_of_embedding():
    from rag.ingest.formats.document import chunk_limit

    # The rate on 2 cores: 11,765 chunks in 123 s, about 95 a second.
    assert chunk_limit(text_limit(1_000_000)) <= 60 * 95
    assert chunk_limit(text_limit(46_711)) <= 60 * 95


def test_a_docx_expanding_past_its_limit_is_refused_after_reading_part_of_it(monkeypatch):
    import docx.text.paragraph

    from tests.support.samples import make_docx

    paragraph = "The quick brown fox jumps over the lazy dog while the valve opens. " * 15  # ~1,000 characters
    data = make_docx("Long", [(f"Part {i}", [paragraph] * 20) for i in range(200)])  # ~4 MB of text
    read: list[int] = []
    real = docx.text.paragraph.Paragraph.text.fget
    monkeypatch.setattr(docx.text.paragraph.Paragraph, "text", property(lambda self: read.append(1) or real(self)))
    with pytest.raises(DocumentError, match="characters"):
        load_document("long.docx", ".docx", data, max_chars=200_000)
    assert len(read) < 2 * 240 < 4_200, len(read)  # stopped near 200 paragraphs of the 4,200


def test_the_resident_servers_own_stop_stops_the_ingests(tmp_path, embedder):
    from types import SimpleNamespace

    from rag.resident.server import Life

    library = DocumentLibrary(tmp_path / "index", lambda: embedder, lambda: None)
    life = Life(address=None, idle_timeout_s=60)
    life.server, life.library = SimpleNamespace(should_exit=False), library
    life.stop("told to stop")  # what /v1/resident/stop and the idle stop do
    assert life.server.should_exit and library.stopping.is_set()


def _indexed_chunks(index_location, embedder) -> dict[str, int]:
    """Chunks in the index at ``index_location``, by source."""
    from rag.index.store import FolderIndex

    index = FolderIndex.open(index_location, embedder=embedder.name, dim=embedder.dim)
    try:
        return {source: record.n_chunks for (_, source), record in index.files().items()}
    finally:
        index.close()


def test_a_csv_past_its_chunk_limit_keeps_its_first_rows_and_says_so(tmp_path, embedder, chunker, monkeypatch):
    """A sheet over the chunk cap is cut at it, as at MAX_ROWS, not refused
    (issue 37 review: the 1 MB readings CSV makes ~13,000 chunks); a note
    over the cap of another format is still refused whole."""
    import re

    from rag.ingest.formats import document
    from rag.ingest.formats.document import chunk_limit

    data = _readings_csv()
    # The cap for this file made 100 chunks, not 5,194: the bound is the same code, the embedding 50 times less.
    monkeypatch.setattr(document, "CHARS_PER_CHUNK", text_limit(len(data)) // 100)
    limit = chunk_limit(text_limit(len(data)))
    assert 90 <= limit <= 110
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "readings.csv").write_bytes(data)
    note = _big_note().encode("utf-8")  # some 6 x 64 chunks: over its own cap too
    (corpus / "notes.md").write_bytes(note)
    counted = Counted(embedder, most=3 * limit)
    report = ingest(tmp_path / "index", [corpus], embedder=counted, chunker=chunker)
    failed = dict(report.failed)
    assert "readings.csv" not in failed and report.added == ["readings.csv"], report.to_dict()
    assert f"over {chunk_limit(text_limit(len(note))):,} chunks" in failed["notes.md"]  # prose: refused as before
    chunks = _indexed_chunks(tmp_path / "index", embedder)
    assert chunks == {"readings.csv": limit} == {"readings.csv": report.chunks_added}
    notes = [w for source, w in report.warnings if source == "readings.csv"]
    assert len(notes) == 1 and f"{limit:,} chunks" in notes[0], report.warnings
    kept = int(re.search(r"first ([\d,]+) rows", notes[0]).group(1).replace(",", ""))
    rows = data.count(b"\n")
    assert limit // 2 <= kept <= 2 * limit < rows // 5, notes[0]  # about a row a chunk; ~13,000 rows in the file
    assert counted.texts <= limit


def test_a_workbook_cut_at_its_chunk_limit_names_the_sheet_and_row_it_kept_to(embedder):
    from tests.support.samples import make_xlsx
    from rag.ingest.chunking import Chunker, OverChunkLimit
    from rag.ingest.formats.sheets import rows_cut_note

    rows = [[f"Station {i}", f"{i * 0.5:.1f}", f"Reading {i} of the valve at dawn"] for i in range(300)]
    book = load_document("book.xlsx", ".xlsx", make_xlsx({"First": [["Name", "Value", "Note"]] + rows[:20],
                                                          "Second": [["Name", "Value", "Note"]] + rows}))
    with pytest.raises(OverChunkLimit) as over:
        Chunker(embedder.count_tokens).split(book, max_chunks=10)
    kept = over.value.chunks
    assert len(kept) == 10 and kept[-1].location.sheet == "Second"
    note = rows_cut_note(book, kept[-1].end, 10)
    assert f"sheet 'Second', row {kept[-1].location.rows[1]:,}" in note and "over 10 chunks" in note, note
    prose = load_document("notes.md", ".md", _big_note().encode("utf-8"))
    assert rows_cut_note(prose, 100, 10) is None  # not a sheet: refused whole, not cut

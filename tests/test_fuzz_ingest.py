"""A fuzz pass over the ingest formats (issue 27): files of every format
family that hypothesis writes (text in each format's own alphabet, real
sample files damaged byte by byte or cut short, real containers with one
part replaced by generated markup) go through the real loaders and the real
chunker. Each either loads or is refused with one line (a RagError), never
a traceback; each is bounded in time by an alarm far above what a file of
this size takes (a bound, not a benchmark). A last test ingests a folder of
such files into a real index.

The number of examples is kept modest so the suite stays short; run with
``--hypothesis-show-statistics`` to see the cases tried."""

from __future__ import annotations

import contextlib
import io
import signal
import zipfile
from functools import lru_cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rag.errors import RagError
from rag.ingest import ingest
from rag.ingest.chunking import Chunker
from rag.ingest.formats import load_document
from tests.support.samples import make_csv, make_docx, make_epub, make_pdf, make_pptx, make_xlsx

EXAMPLES = 40
BOUND_S = 60  # per file: the files are a few KB; a hang or a blow-up is what this catches
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@contextlib.contextmanager
def _bounded(seconds: int = BOUND_S):
    """Fail the test if the block runs past ``seconds`` (SIGALRM)."""
    def expired(signum, frame):
        raise AssertionError(f"still loading after {seconds} s: unbounded time")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _load_or_refuse(name: str, suffix: str, data: bytes, chunker: Chunker) -> None:
    """The property: loaded (and chunked) or refused with one line."""
    with _bounded():
        try:
            document = load_document(name, suffix, data)
        except RagError as exc:
            assert str(exc) and "\n" not in str(exc), repr(str(exc))
            return
        chunker.split(document)


# -- text in each format's own alphabet -------------------------------------------

_ALPHABETS = {
    ".md": "#=-*`_[]()<>:!| \t\nab1",
    ".rst": "=-~^\"'`#*+<>:._ \t\nab:mod",
    ".txt": " \t\nab\r\x0b\u00e9\u2028",
    ".html": "<>/=\"' \n!-&;#pbrhdivtle1script",
    ".csv": ",;\t|\"'\n\r ab1",
    ".py": "defclass():\n \t@#\"'\\ab=",
}


@st.composite
def _markup(draw, alphabet: str) -> bytes:
    # Tokens as well as characters, so tags and headings appear often.
    tokens = st.sampled_from(["<br>", "<h1>", "</h1>", "<p>", "</p>", "<script>", "<!--", "-->", "&amp;", "&#0;",
                              "# ", "## ", "\n===\n", "```", ":a:`x`", "\"", "\n", " " * 40, "class A:\n",
                              "def f():\n"])
    parts = draw(st.lists(st.one_of(st.text(alphabet, max_size=40), tokens), max_size=60))
    text = "".join(parts)
    if draw(st.booleans()):
        return text.encode("utf-8")
    return text.encode("utf-8", "surrogatepass") + draw(st.binary(max_size=8))


@pytest.mark.parametrize("suffix", sorted(_ALPHABETS))
def test_fuzz_text_formats(suffix, chunker):
    @FUZZ
    @given(_markup(_ALPHABETS[suffix]))
    def check(data):
        _load_or_refuse(f"fuzz{suffix}", suffix, data, chunker)

    check()


# -- real sample files, damaged -----------------------------------------------------


@lru_cache(maxsize=None)
def _sample(suffix: str) -> bytes:
    return {
        ".pdf": lambda: make_pdf(["Llamas graze on the altiplano.", "Alpacas are smaller."]),
        ".docx": lambda: make_docx("Camelids", [("Llamas", ["Llamas are pack animals."])],
                                   table=[["Name", "Weight"], ["Llama", "150 kg"]]),
        ".pptx": lambda: make_pptx([("Llamas", "Pack animals", "Speaker notes")]),
        ".xlsx": lambda: make_xlsx({"Herd": [["Name", "Age"], ["Lola", 4], ["Pepe", 7]]}),
        ".epub": lambda: make_epub("Camelids", [("Llamas", ["Llamas hum."]), ("Alpacas", ["Alpacas spit."])]),
        ".csv": lambda: make_csv([["Name", "Age"], ["Lola", 4]]),
    }[suffix]()


@st.composite
def _damaged(draw, suffix: str) -> bytes:
    data = bytearray(_sample(suffix))
    for _ in range(draw(st.integers(0, 12))):
        at = draw(st.integers(0, len(data) - 1))
        data[at] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    return bytes(data)


@pytest.mark.parametrize("suffix", [".pdf", ".docx", ".pptx", ".xlsx", ".epub", ".csv"])
def test_fuzz_damaged_files(suffix, chunker):
    @FUZZ
    @given(_damaged(suffix))
    def check(data):
        _load_or_refuse(f"fuzz{suffix}", suffix, data, chunker)

    check()


# -- real containers, one part replaced by generated markup ---------------------------

_XML_TOKENS = ["<w:p>", "</w:p>", "<w:r>", "<w:t>", "</w:t>", "<a:t>", "</a:t>", "<si>", "<t>", "</t>", "</si>",
               "<row>", "<c t=\"s\"><v>0</v></c>", "<c t=\"n\"><v>x</v></c>", "<p>", "<br/>", "<!DOCTYPE x [",
               "<!ENTITY a \"aaaa\">", "&a;", "]>", "<?xml version=\"1.0\"?>", "<", ">", "\"", "\x00", "\u00e9"]


@st.composite
def _container(draw, suffix: str) -> bytes:
    source = zipfile.ZipFile(io.BytesIO(_sample(suffix)))
    names = [n for n in source.namelist() if n.endswith((".xml", ".rels", ".xhtml", ".opf"))]
    victim = draw(st.sampled_from(sorted(names)))
    body = "".join(draw(st.lists(st.one_of(st.sampled_from(_XML_TOKENS), st.text(max_size=12)), max_size=50)))
    original = source.read(victim).decode("utf-8", "replace")
    keep = draw(st.integers(0, len(original)))
    content = (original[:keep] + body).encode("utf-8", "surrogatepass")
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for info in source.infolist():
            z.writestr(info, content if info.filename == victim else source.read(info))
    return out.getvalue()


@pytest.mark.parametrize("suffix", [".docx", ".pptx", ".xlsx", ".epub"])
def test_fuzz_container_parts(suffix, chunker):
    @FUZZ
    @given(_container(suffix))
    def check(data):
        _load_or_refuse(f"fuzz{suffix}", suffix, data, chunker)

    check()


# -- a folder of such files, ingested ------------------------------------------------


def test_fuzz_ingest_a_folder(tmp_path_factory, embedder, chunker):
    @settings(max_examples=8, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(st.lists(st.tuples(st.sampled_from([".md", ".html", ".docx", ".xlsx", ".epub", ".pdf"]),
                              st.data()), min_size=1, max_size=4))
    def check(files):
        folder = tmp_path_factory.mktemp("fuzz")
        corpus = folder / "corpus"
        corpus.mkdir()
        for i, (suffix, data) in enumerate(files):
            if suffix in _ALPHABETS:
                content = data.draw(_markup(_ALPHABETS[suffix]))
            else:
                content = data.draw(st.one_of(_damaged(suffix), _container(suffix)) if suffix != ".pdf"
                                    else _damaged(suffix))
            (corpus / f"f{i}{suffix}").write_bytes(content)
        with _bounded(300):
            report = ingest(folder / "index", [corpus], embedder=embedder, chunker=chunker)
        assert len(report.added) + len(report.failed) + len(report.ignored) == len(files), report.to_dict()
        assert all(why and "\n" not in why for _, why in report.failed)

    check()

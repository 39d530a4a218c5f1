"""Reading documents: visible text, pages, and clear errors for bad input."""

from __future__ import annotations

import pytest

from rag.errors import DocumentError
from rag.ingest.formats import LoadedDocument, html_to_text, load_document


def test_html_keeps_visible_text_only():
    html = (
        "<html><head><title>T</title><style>.x{color:red}</style><script>alert('no')</script></head>"
        "<body><h1>Head</h1><p>One &amp; <b>two</b></p><noscript>hidden</noscript><div>three</div></body></html>"
    )
    text = html_to_text(html)
    assert text == "T\n\nHead\n\nOne & two\n\nthree"
    for hidden in ("alert", "color", "hidden", "<", ">"):
        assert hidden not in text


def test_text_formats_decode_utf8_and_normalise_newlines():
    doc = load_document("a.md", ".md", "\ufeffcafé\r\nline two\r".encode("utf-8"))
    assert doc.text == "café\nline two\n"
    assert doc.page_at(3) is None


def test_pdf_pages_are_kept(pdf_bytes):
    doc = load_document("doc.pdf", ".pdf", pdf_bytes)
    assert "llamas" in doc.text and "alpacas" in doc.text
    assert doc.page_at(doc.text.index("llamas")) == 1
    assert doc.page_at(doc.text.index("alpacas")) == 2


def test_page_at_picks_the_page_holding_the_offset():
    doc = LoadedDocument.paged("x" * 200, ((1, 0), (3, 120)))
    assert [doc.page_at(o) for o in (0, 119, 120, 199)] == [1, 1, 3, 3]


@pytest.mark.parametrize(
    "name, data, problem",
    [
        ("empty.txt", b"", "no text"),
        ("blank.md", b"  \n\t\n", "no text"),
        ("latin1.txt", "caf\xe9".encode("latin-1"), "not UTF-8"),
        ("binary.txt", b"\x7fELF\x00\x00\x01\x02", "binary"),
        ("broken.pdf", b"%PDF-1.4\n1 0 obj << /Type /Catalog", "PDF"),
        ("fake.pdf", b"this is not a pdf at all", "malformed PDF"),
        ("image.png", b"\x89PNG", "unsupported file type"),
    ],
)
def test_bad_input_raises_a_document_error_naming_the_file(name, data, problem):
    suffix = "." + name.rsplit(".", 1)[1]
    with pytest.raises(DocumentError) as info:
        load_document(name, suffix, data)
    message = str(info.value)
    assert message.startswith(name + ":")
    assert problem in message
    assert "\n" not in message

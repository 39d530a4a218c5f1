"""HTML: the text a browser shows (no scripts, styles or markup), one block
per paragraph, with the page's ``<title>`` and its ``<h1>``-``<h6>``
headings for the outline. EPUB chapters are read with it too.

Does not: run scripts, follow links or read other formats.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

from .document import LoadedDocument
from .text import decode_text

HTML_SUFFIXES = frozenset({".html", ".htm", ".xhtml"})

# Private-use characters mark where headings start and end while the text
# is assembled; whitespace is normalised afterwards, and these survive it.
_OPEN = {f"h{n}": chr(0xE000 + n) for n in range(1, 7)}
_CLOSE = "\ue00f"
_MARKS = re.compile("[\ue001-\ue006\ue00f]")


class _VisibleText(HTMLParser):
    """Collects text a browser would show: no scripts, styles or markup."""

    _HIDDEN = frozenset({"script", "style", "noscript", "template", "head", "svg", "iframe", "object"})
    _BLOCK = frozenset(
        {
            "p", "div", "br", "li", "ul", "ol", "dl", "dt", "dd", "tr", "table", "section",
            "article", "header", "footer", "nav", "aside", "main", "blockquote", "pre",
            "h1", "h2", "h3", "h4", "h5", "h6", "hr", "title", "figure", "figcaption",
        }
    )

    def __init__(self, show_title: bool = True) -> None:
        super().__init__(convert_charrefs=True)
        self._show_title = show_title
        self.parts: list[str] = []
        self.title: list[str] = []
        self._hidden_depth = 0
        self._in_title = False
        self._heading: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        elif tag in self._HIDDEN:
            self._hidden_depth += 1
        if tag in self._BLOCK:
            self.parts.append("\n")
        if tag in _OPEN and self._hidden_depth == 0 and self._heading is None:
            self._heading = tag
            self.parts.append(_OPEN[tag])

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        elif tag in self._HIDDEN and self._hidden_depth:
            self._hidden_depth -= 1
        if tag == self._heading:
            self._heading = None
            self.parts.append(_CLOSE)
        if tag in self._BLOCK:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        data = _MARKS.sub("", data)
        # The title sits inside <head> but is shown to the reader.
        if self._in_title:
            self.title.append(data)
        if self._hidden_depth == 0 or (self._in_title and self._show_title):
            self.parts.append(data)


def parse_html(html: str, *, show_title: bool = True) -> LoadedDocument:
    """The visible text of an HTML page with its title and headings; the
    title is part of the text unless ``show_title`` is False (an EPUB
    chapter's title repeats its heading).

    ``parse_html("<h1>A</h1><p>b</p>").headings -> ((0, 1, "A"),)``
    """
    parser = _VisibleText(show_title)
    parser.feed(html)
    parser.close()
    if parser._heading is not None:
        parser.parts.append(_CLOSE)
    lines = (" ".join(line.split()) for line in "".join(parser.parts).split("\n"))
    marked = "\n".join(lines)
    # A heading's own leading and trailing spaces go, as a line's would. The
    # lookbehind starts a match only where a run of spaces starts: without
    # it each position inside a long run (many <br>) is tried, quadratically.
    marked = re.sub(r"(?<![ \n])[ \n]+(\ue00f)", r"\1", re.sub(r"([\ue001-\ue006])[ \n]+", r"\1", marked))
    marked = re.sub(r"\n{3,}", "\n\n", marked).strip()
    text, headings = _unmark(marked)
    title = " ".join("".join(parser.title).split()) or None
    return LoadedDocument(text, title=title, headings=headings)


def _unmark(marked: str) -> tuple[str, tuple[tuple[int, int, str], ...]]:
    """The text without heading marks, and ``(offset, level, heading)`` of each."""
    out: list[str] = []
    headings: list[tuple[int, int, str]] = []
    length, pos = 0, 0
    open_at: tuple[int, int, int] | None = None  # (offset in the text, level, position in ``marked``)
    for m in _MARKS.finditer(marked):
        out.append(marked[pos:m.start()])
        length += m.start() - pos
        pos = m.end()
        if m.group() != _CLOSE:
            open_at = (length, ord(m.group()) - 0xE000, m.end())
        elif open_at is not None:
            start, level, begun = open_at
            heading = " ".join(_MARKS.sub("", marked[begun:m.start()]).split())
            if heading:
                headings.append((start, level, heading))
            open_at = None
    out.append(marked[pos:])
    return "".join(out), tuple(headings)


def html_to_text(html: str) -> str:
    """The visible text of an HTML page, one block per paragraph.

    ``"<p>a <b>b</b></p><script>x()</script>" -> "a b"``
    """
    return parse_html(html).text


def load_html(source: str, suffix: str, data: bytes) -> LoadedDocument:
    """An HTML file: its visible text, title and headings."""
    return parse_html(decode_text(source, data))

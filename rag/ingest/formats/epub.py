"""EPUB books, read with the standard library: the package's spine gives
the chapters in reading order (``zipfile`` and ``xml.etree``), each chapter's
XHTML is read as HTML; one segment per chapter, each chunk knowing its
chapter number, the chapter's first heading heading it in the outline.
Each chapter's units are those the HTML reader finds in it (else its prose
split by :func:`~.units.prose_units`), moved to where the chapter starts in
the book; a unit (not a heading) above the chapter's first heading is about
the chapter.

Does not: read DRM-protected books (refused with a message), images or
styles.
"""

from __future__ import annotations

import posixpath
import xml.etree.ElementTree as ET
import zipfile
from dataclasses import replace
from urllib.parse import unquote

from ...errors import DocumentError
from .containers import open_zip
from .document import Location, LoadedDocument, Segment, Unit, check_text
from .html import parse_html
from .units import prose_units

EPUB_SUFFIXES = frozenset({".epub"})
_NS = {
    "c": "urn:oasis:names:tc:opendocument:xmlns:container",
    "opf": "http://www.idpf.org/2007/opf",
    "dc": "http://purl.org/dc/elements/1.1/",
}
_CHAPTER_TYPES = {"application/xhtml+xml", "text/html", "application/xml"}


def _xml(source: str, archive: zipfile.ZipFile, name: str) -> ET.Element:
    try:
        return ET.fromstring(archive.read(name))
    except KeyError:
        raise DocumentError(source, f"not an EPUB: {name} is missing; re-export the book") from None
    except ET.ParseError as exc:
        raise DocumentError(source, f"malformed EPUB ({name}: {exc}); re-export the book") from None


def _spine(source: str, archive: zipfile.ZipFile) -> tuple[list[str], str | None]:
    """The chapter files in reading order, and the book's title."""
    rootfile = _xml(source, archive, "META-INF/container.xml").find(".//c:rootfile", _NS)
    if rootfile is None or not rootfile.get("full-path"):
        raise DocumentError(source, "malformed EPUB (its container names no package file); re-export the book")
    opf_path = rootfile.get("full-path", "")
    package = _xml(source, archive, opf_path)
    base = posixpath.dirname(opf_path)
    items = {
        item.get("id"): (posixpath.normpath(posixpath.join(base, unquote(item.get("href", "")))), item.get("media-type"))
        for item in package.iterfind(".//opf:manifest/opf:item", _NS)
    }
    chapters = []
    for ref in package.iterfind(".//opf:spine/opf:itemref", _NS):
        path, media = items.get(ref.get("idref"), (None, None))
        if path and media in _CHAPTER_TYPES and path not in chapters:
            chapters.append(path)
    title = package.find(".//dc:title", _NS)
    return chapters, (" ".join((title.text or "").split()) or None) if title is not None else None


def _encrypted(source: str, archive: zipfile.ZipFile) -> set[str]:
    """The files ``META-INF/encryption.xml`` says are encrypted (DRM, or
    fonts obfuscated as the EPUB standard allows, which does not matter here)."""
    if "META-INF/encryption.xml" not in archive.namelist():
        return set()
    found = _xml(source, archive, "META-INF/encryption.xml")
    return {posixpath.normpath(unquote(ref.get("URI", ""))) for ref in found.iter()
            if ref.tag.endswith("CipherReference")}


def load_epub(source: str, suffix: str, data: bytes, *, max_chars: int | None = None) -> LoadedDocument:
    """A book's chapters in reading order, a segment per chapter; reading
    stops at the first chapter that takes the text over ``max_chars``
    (TextOverLimit)."""
    with open_zip(source, data, ".epub") as archive:
        chapters, title = _spine(source, archive)
        if set(chapters) & _encrypted(source, archive):
            raise DocumentError(source, "DRM-protected (encrypted) EPUB; only books without DRM can be read")
        parts: list[str] = []
        length = 0
        segments: list[Segment] = []
        headings: list[tuple[int, int, str]] = []
        units: list[Unit] = []
        for path in chapters:
            try:
                raw = archive.read(path)
            except KeyError:
                continue  # listed but missing: the other chapters still count
            chapter = parse_html(raw.decode("utf-8", "replace"), show_title=False)
            if not chapter.text.strip():
                continue
            if parts:
                parts.append("\n\n")
                length += 2
            segments.append(Segment(length, Location(chapter=len(segments) + 1)))
            heading = chapter.headings[0][2] if chapter.headings else chapter.title
            if heading:
                headings.append((length, 1, heading))
            headings.extend((length + at, level + 1, h) for at, level, h in chapter.headings[1:])
            parts.append(chapter.text)
            check_text(length + len(chapter.text), max_chars)
            units.extend(_chapter_units(chapter, heading or "", length))
            length += len(chapter.text)
    return LoadedDocument("".join(parts), tuple(segments), title=title, headings=tuple(headings), units=tuple(units))


def _chapter_units(chapter: LoadedDocument, heading: str, offset: int) -> list[Unit]:
    """A chapter's units, moved by ``offset`` (where it starts in the
    book): the HTML reader's, else its prose's; one (not a heading) with
    nothing it is about is about the chapter's ``heading``. Units that do
    not lie in order inside the chapter's text are left out."""
    found = chapter.units or tuple(prose_units(chapter.text, chapter.headings))
    units: list[Unit] = []
    last = 0
    for unit in found:
        if not last <= unit.start < unit.end <= len(chapter.text):
            continue
        last = unit.end
        if not unit.about and heading and unit.kind != "heading":
            unit = replace(unit, about=heading)
        units.append(unit.shifted(offset))
    return units

"""Zip containers (.docx, .pptx, .xlsx, .epub) opened safely: a password-
protected Office file, a corrupt zip, or one that would expand beyond a
bound (a zip bomb) is refused before anything is decompressed.

The bounds are checked first on the sizes the zip's directory declares;
Python's zipfile never returns more bytes for an entry than its declared
size (a lying entry fails its CRC check), so what is read stays within them.
Then, since the format libraries (python-docx, python-pptx, openpyxl) build
a tree of every part they parse, which takes many times its bytes, every
entry is streamed through once, in constant memory, and counted: the parts
parsed whole may hold at most ``MAX_PARSED_BYTES`` and ``MAX_PARSED_TAGS``
tags, an entry a loader streams (a worksheet) at most ``MAX_ROW_BYTES`` in
one row. Memory then follows what is really in the file, within bounds far
below the expansion cap.

Does not: parse what is inside (the format modules do).
"""

from __future__ import annotations

import io
import zipfile
import zlib
from typing import Callable

from ...errors import DocumentError

MAX_ZIP_ENTRIES = 10_000
MAX_EXPANDED_BYTES = 256 << 20  # far above a real document's XML; a bomb's is gigabytes
# Of the entries parsed whole: a 1,000-page Word document holds some 20 MB
# and 500,000 tags; a tree of a million tags takes a few hundred MB.
MAX_PARSED_BYTES = 48 << 20
MAX_PARSED_TAGS = 1_000_000
MAX_ROW_BYTES = 1 << 20  # one row of a streamed worksheet, built whole by openpyxl
# Entries parsed (XML, XHTML, relationships): the rest (images) is only held.
_MARKUP = (".xml", ".rels", ".xhtml", ".html", ".htm", ".opf", ".ncx", ".vml")
_STREAM_BLOCK = 1 << 20
# Office encrypts a password-protected .docx/.xlsx/.pptx into an OLE compound file.
OLE_SIGNATURE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"


def open_zip(source: str, data: bytes, kind: str, *, streamed: Callable[[str], bool] = lambda name: False,
             counted: bool = True) -> zipfile.ZipFile:
    """``data`` as a zip container of a ``kind`` file (".docx", ...), its
    directory checked: DocumentError for an encrypted or corrupt file, or
    one over ``MAX_ZIP_ENTRIES`` entries or ``MAX_EXPANDED_BYTES`` expanded.
    With ``counted``, its entries are then read through and counted (see the
    module's docstring): ``streamed`` names those the loader reads as a
    stream of rows rather than whole."""
    if data[:8] == OLE_SIGNATURE:
        raise DocumentError(source, f"password-protected (encrypted) {kind} file; open it, remove the password, "
                                    "save it and ingest it again")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        entries = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError) as exc:
        raise DocumentError(source, f"corrupt {kind} file (not a readable zip container: {_one_line(exc)}); "
                                    "re-save or repair it") from None
    if len(entries) > MAX_ZIP_ENTRIES:
        raise DocumentError(source, f"{kind} container of {len(entries):,} entries, over the limit of "
                                    f"{MAX_ZIP_ENTRIES:,}; not read (a zip bomb?)")
    expanded = sum(e.file_size for e in entries)
    if expanded > MAX_EXPANDED_BYTES:
        raise DocumentError(source, f"{kind} container expands to {expanded / 2**20:,.0f} MiB, over the limit of "
                                    f"{MAX_EXPANDED_BYTES >> 20} MiB; not read (a zip bomb?)")
    if any(e.flag_bits & 0x1 for e in entries):
        raise DocumentError(source, f"{kind} file with password-protected (encrypted) entries; remove the "
                                    "password and ingest it again")
    if counted:
        try:
            _count(source, archive, kind, streamed, len(data))
        except BaseException:
            archive.close()
            raise
    return archive


def _count(source: str, archive: zipfile.ZipFile, kind: str, streamed: Callable[[str], bool], size: int) -> None:
    """Read every entry through once, a block at a time, and refuse the
    file (DocumentError) when its markup parsed whole holds over
    ``MAX_PARSED_BYTES``, or over ``MAX_PARSED_TAGS`` tags and lines; when
    a streamed part has a row over ``MAX_ROW_BYTES``; or when its other
    entries (images, read as they are) expand to more than that or twice
    the file, whichever is more: real images do not compress."""
    parsed_bytes = parsed_tags = other_bytes = 0
    other_limit = max(MAX_PARSED_BYTES, 2 * size)
    for entry in archive.infolist():
        if entry.is_dir():
            continue
        rows = streamed(entry.filename)
        markup = entry.filename.lower().endswith(_MARKUP)
        row = 0  # bytes of the row being read
        try:
            with archive.open(entry) as stream:
                while block := stream.read(_STREAM_BLOCK):
                    if rows:
                        pieces = block.split(b"</row>")
                        row += len(pieces[0])
                        longest = max(row, *(len(p) for p in pieces[1:-1])) if len(pieces) > 2 else row
                        row = len(pieces[-1]) if len(pieces) > 1 else row
                        if max(longest, row) > MAX_ROW_BYTES:
                            raise DocumentError(source, f"{kind} file with a row over {MAX_ROW_BYTES >> 20} MiB in "
                                                        f"{entry.filename}; not read (a zip bomb?)")
                    elif markup:
                        parsed_bytes += len(block)
                        parsed_tags += block.count(b"<") + block.count(b"\n")
                        if parsed_bytes > MAX_PARSED_BYTES or parsed_tags > MAX_PARSED_TAGS:
                            raise DocumentError(source, (
                                f"{kind} file whose text and markup hold over {MAX_PARSED_BYTES >> 20} MiB or "
                                f"{MAX_PARSED_TAGS:,} tags once expanded; not read (a zip bomb?), or split it"))
                    else:
                        other_bytes += len(block)
                        if other_bytes > other_limit:
                            raise DocumentError(source, (
                                f"{kind} file whose images and other parts expand to over "
                                f"{other_limit >> 20} MiB; not read (a zip bomb?)"))
        except DocumentError:
            raise
        except (zipfile.BadZipFile, zlib.error, ValueError, OSError, EOFError, NotImplementedError) as exc:
            raise DocumentError(source, f"corrupt {kind} file ({entry.filename}: {_one_line(exc)}); "
                                        "re-save or repair it") from None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:160] or type(exc).__name__

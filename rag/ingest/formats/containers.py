"""Zip containers (.docx, .pptx, .xlsx, .epub) opened safely: a password-
protected Office file, a corrupt zip, or one that would expand beyond a
bound (a zip bomb) is refused before anything is decompressed.

The bounds are checked on the sizes the zip's directory declares; Python's
zipfile never returns more bytes for an entry than its declared size (a
lying entry fails its CRC check), so what is read stays within them.

Does not: parse what is inside (the format modules do).
"""

from __future__ import annotations

import io
import zipfile

from ...errors import DocumentError

MAX_ZIP_ENTRIES = 10_000
MAX_EXPANDED_BYTES = 256 << 20  # far above a real document's XML; a bomb's is gigabytes
# Office encrypts a password-protected .docx/.xlsx/.pptx into an OLE compound file.
OLE_SIGNATURE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"


def open_zip(source: str, data: bytes, kind: str) -> zipfile.ZipFile:
    """``data`` as a zip container of a ``kind`` file (".docx", ...), its
    directory checked: DocumentError for an encrypted or corrupt file, or
    one over ``MAX_ZIP_ENTRIES`` entries or ``MAX_EXPANDED_BYTES`` expanded."""
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
    return archive


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:160] or type(exc).__name__

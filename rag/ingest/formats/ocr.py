"""Reading PDF pages that have no text layer (scans) with Tesseract.

Optional: needs the ``ocr`` extra (``pytesseract``, a maintained wrapper over
the ``tesseract`` program, and ``pypdfium2``, which renders PDF pages and
ships its own PDFium) and Debian's ``tesseract-ocr`` package. Without them
:func:`ocr_problem` says what to install.

Does not: find which pages need it (``pdf`` does) or download anything.
"""

from __future__ import annotations

import os
import shutil
from typing import Sequence

OCR_DPI = 300  # Tesseract reads printed text best at about 300 dpi
INSTALL_EXTRA = "pip install 'rag-budget[ocr]'"
INSTALL_TESSERACT = "apt-get install tesseract-ocr"


def ocr_problem() -> str | None:
    """None when pages can be read with OCR here, else what to install."""
    missing = []
    try:
        import pypdfium2  # noqa: F401
        import pytesseract  # noqa: F401
    except ImportError:
        missing.append(f"the ocr extra (`{INSTALL_EXTRA}`)")
    if shutil.which(os.environ.get("RAG_TESSERACT", "tesseract")) is None:
        missing.append(f"Tesseract (`{INSTALL_TESSERACT}`)")
    if not missing:
        return None
    return "to read it with OCR, install " + " and ".join(missing) + ", then ingest it again"


def ocr_pages(data: bytes, pages: Sequence[int], language: str | None = None) -> dict[int, str]:
    """The text Tesseract reads on each of ``pages`` (1-based) of the PDF
    ``data``, rendered at ``OCR_DPI``; ``language`` is Tesseract's (default
    ``$RAG_OCR_LANG``, else ``eng``). Call only when :func:`ocr_problem` is None."""
    import pypdfium2
    import pytesseract

    pytesseract.pytesseract.tesseract_cmd = os.environ.get("RAG_TESSERACT", "tesseract")
    language = language or os.environ.get("RAG_OCR_LANG", "eng")
    found: dict[int, str] = {}
    pdf = pypdfium2.PdfDocument(data)
    try:
        for number in pages:
            page = pdf[number - 1]
            try:
                image = page.render(scale=OCR_DPI / 72).to_pil()
            finally:
                page.close()
            found[number] = pytesseract.image_to_string(image, lang=language)
    finally:
        pdf.close()
    return found

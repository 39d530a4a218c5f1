"""Driving the web page from a program: where Chromium is, the flags it
runs headless with, and a tab on the page past its key prompt (by the
page's own element ids, ``#key-dialog`` and ``#key-input``). For ``rag
bench page`` and the page's browser tests; the caller brings Playwright
and its browser.

Does not: import Playwright, or start a browser or a server.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# Debian's Chromium without a display, a sandbox or any network of its own.
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def find_chromium(explicit: str | os.PathLike[str] | None = None) -> str | None:
    """The Chromium to drive: ``explicit``, else ``$RAG_CHROMIUM``, else
    ``chromium`` on the PATH; None if there is none."""
    for candidate in (explicit, os.environ.get("RAG_CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium"):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    return None


def open_page(browser, url: str, key: str | None = None, errors: list[str] | None = None, **context):
    """A new tab on the page at ``url``, past the key prompt when ``key``;
    the page's script errors are added to ``errors``."""
    page = browser.new_context(**context).new_page()
    if errors is not None:
        page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{url}/")
    if key:
        page.wait_for_selector("#key-dialog[open]")
        page.fill("#key-input", key)
        page.press("#key-input", "Enter")
        page.wait_for_selector("#key-dialog:not([open])", state="attached")
    return page

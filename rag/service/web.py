"""The web page: ``GET /`` and its static files under ``/static/`` (HTML,
CSS and JavaScript in this package, no build step, nothing fetched from
elsewhere). The page itself needs no key; it asks for one and sends it with
every ``/v1`` call, as any other client does.

Does not: answer anything itself; the page calls the service's own API.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).resolve().parent / "static"

# The page runs only its own scripts and styles and talks only to this
# service; blob: frames show a fetched PDF in the browser's own viewer.
PAGE_HEADERS = {
    "Content-Security-Policy": ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
                                "frame-src blob:; object-src blob:; connect-src 'self'; base-uri 'none'; "
                                "form-action 'self'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


@router.get("/")
async def page() -> FileResponse:
    """The page."""
    return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8", headers=PAGE_HEADERS)


def add_page(app: FastAPI) -> None:
    """Serve the page at ``/`` and its files under ``/static/``."""
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

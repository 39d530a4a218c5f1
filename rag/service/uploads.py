"""Uploads on their way into the index, and the questions that wait for
the first one: on a service that started with no index, a question asked
while a document is being uploaded or indexed waits for that ingest (as
long as its client stays, up to :data:`FIRST_INDEX_WAIT_S`) instead of
failing because the index is not there yet.

An upload counts from its request's first byte (:class:`TrackUploads`, before
its body is read), so a question sent just after a file was dropped on the
page already finds it on its way.

Does not: ingest anything (the upload route does) or answer questions.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Awaitable, Callable, Iterator

from fastapi.responses import Response

from ..index.location import index_exists
from ..qa.pipeline import Pipeline
from .errors import error

# At most this long a question waits for the first upload's ingest; chosen: the ingest of a large PDF on a
# laptop's CPU, well past which the client is better told to ask again.
FIRST_INDEX_WAIT_S = 300.0
POLL_S = 0.25  # how often a waiting question looks again (and asks whether its client is still there); chosen
STILL_INDEXING = "the first document is still being indexed; ask again in a moment"


class Uploads:
    """How many uploads are in flight now, from their request's start to
    its answer, and how many questions wait for them (changed on the event
    loop only)."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.questions_waiting = 0

    @contextlib.contextmanager
    def arriving(self) -> Iterator[None]:
        """Count one upload while the block runs."""
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1


class TrackUploads:
    """ASGI middleware: each ``POST /v1/documents`` that reaches it counts
    in ``uploads`` from its start, before its body is read, to its answer."""

    def __init__(self, app, uploads: Uploads) -> None:
        self.app, self.uploads = app, uploads

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == "/v1/documents":
            with self.uploads.arriving():
                await self.app(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def has_index(pipeline: Pipeline) -> bool:
    """Whether ``pipeline`` has an index to answer from (its own, or the sample's)."""
    return pipeline.use_sample or index_exists(pipeline.index_location)


async def first_index(pipeline: Pipeline, uploads: Uploads, gone: Callable[[], Awaitable[bool]]) -> Response | None:
    """None once a question can go on: there is an index, or none is on its
    way (no upload in flight: the question then fails saying no document is
    indexed). While there is none and an upload is in flight, waits; the
    response to send instead if ``gone()`` (499) or if
    :data:`FIRST_INDEX_WAIT_S` pass first (409 ``indexing``, with Retry-After)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + FIRST_INDEX_WAIT_S
    uploads.questions_waiting += 1
    try:
        while uploads.in_flight and not has_index(pipeline):
            if loop.time() >= deadline:
                return error(409, STILL_INDEXING, "indexing", {"Retry-After": "5"})
            if await gone():
                return Response(status_code=499)
            await asyncio.sleep(POLL_S)
    finally:
        uploads.questions_waiting -= 1
    return None

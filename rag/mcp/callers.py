"""Who calls the MCP server's tools: over HTTP with keys, the holder of the
request's bearer key (the service's keys: ``RAG_SERVE_KEYS_FILE`` and
``RAG_SERVE_API_KEYS``, with the same rights); on stdio, or over HTTP on
loopback without keys, the local user, with every right.

Does not: check rights (``tools`` does, as the service's routes do).
"""

from __future__ import annotations

import json
from typing import Mapping

from ..errors import RagError
from ..service.keys import LOCAL_USER, Caller, KeyRing


class NotAuthorised(RagError):
    """A tool call over HTTP without a key the server accepts."""


def bearer(headers: Mapping[str, str]) -> str | None:
    """The key an ``Authorization: Bearer KEY`` header carries, or None."""
    value = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
    scheme, _, key = value.partition(" ")
    return key.strip() if scheme.lower() == "bearer" and key.strip() else None


def caller_of(headers: Mapping[str, str] | None, keys: KeyRing | None) -> Caller:
    """The caller of a tool call with these request ``headers`` (None: stdio)."""
    if headers is None or keys is None:
        return LOCAL_USER
    key = bearer(headers)
    found = keys.caller(key) if key is not None else None
    if found is None:
        raise NotAuthorised("missing or wrong API key: send Authorization: Bearer KEY")
    return found


class RequireKey:
    """ASGI middleware: every HTTP request needs a key of ``keys`` (401 otherwise),
    before the MCP transport reads anything of it."""

    def __init__(self, app, keys: KeyRing) -> None:
        self.app, self.keys = app, keys

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ())}
            key = bearer(headers)
            if key is None or self.keys.caller(key) is None:
                body = json.dumps({"error": {"message": "missing or wrong API key: send Authorization: Bearer KEY",
                                             "type": "unauthorized"}}).encode()
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)

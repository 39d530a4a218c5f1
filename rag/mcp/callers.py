"""Who calls the MCP server's tools. The transport decides, never what a
request happens to carry: on stdio, the local user, with every right; over
HTTP with keys, the holder of the request's bearer key (the service's keys:
``RAG_SERVE_KEYS_FILE`` and ``RAG_SERVE_API_KEYS``, with the same rights),
and a call without one, or without headers at all, is refused; over HTTP on
loopback without keys, the local user.

Does not: check rights (``tools`` does, as the service's routes do) or turn
requests away at the door (the service's gate does, in front of the HTTP
transport: ``server.serve_http``).
"""

from __future__ import annotations

from typing import Literal, Mapping

from ..errors import RagError
from ..service.keys import LOCAL_USER, Caller, KeyRing

Transport = Literal["stdio", "http"]


class NotAuthorised(RagError):
    """A tool call over HTTP without a key the server accepts."""


def bearer(headers: Mapping[str, str]) -> str | None:
    """The key an ``Authorization: Bearer KEY`` header carries, or None."""
    value = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
    scheme, _, key = value.partition(" ")
    return key.strip() if scheme.lower() == "bearer" and key.strip() else None


def caller_of(transport: Transport, headers: Mapping[str, str] | None, keys: KeyRing | None) -> Caller:
    """The caller of a tool call that came over ``transport`` with these
    request ``headers`` (None: the transport gave none), served with
    ``keys`` (None: without keys); NotAuthorised over HTTP with keys when
    the headers carry no key of them, or there are no headers."""
    if transport == "stdio" or keys is None:
        return LOCAL_USER
    key = bearer(headers) if headers is not None else None
    found = keys.caller(key) if key is not None else None
    if found is None:
        raise NotAuthorised("missing or wrong API key: send Authorization: Bearer KEY")
    return found

"""HTTP/1.1 with a resident server over its Unix socket, with the standard
library's ``http.client``: a request, its JSON answer or its server-sent
events, and the service's JSON errors as one-line RagErrors.

Why not httpx (used elsewhere in rag-budget): imported after the ``rag``
command's own modules, httpx and its transport took 70-90 ms here against
3-4 ms for ``http.client``, and a question through a running server has
0.5 s for everything before the engine starts on it.

Does not: decide what to ask (``client``) or start servers (``lifecycle``).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
from typing import Iterator

from ..errors import RagError
from ..service.api_client import api_error

CONNECT_S = 5.0
Response = http.client.HTTPResponse
STOPPING = "server_stopping"  # the error type of a request refused by a server that decided to stop
BROKEN = (OSError, http.client.HTTPException)  # a server that went away or does not answer (timeouts are OSErrors)


class Unanswered(RagError):
    """The server took nothing from the request: the connection was
    refused, reset or closed before a status line came (a server going
    away), or it answered 503 ``server_stopping``. A server stopping on its
    own refuses new requests and finishes the admitted ones, so such a
    request may be sent again to a fresh server. (A timeout is not this: the
    server may still be working on the request.)"""


class Unreachable(Unanswered):
    """No server listens on the socket (missing, or stale: refused)."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("rag", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(CONNECT_S)
        try:
            sock.connect(self._path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            raise Unreachable(f"no rag server at {self._path} ({exc.strerror})") from None
        sock.settimeout(self.timeout)  # None: an answer takes as long as it takes (Ctrl-C stops it)
        self.sock = sock


@contextlib.contextmanager
def exchange(socket_path: str, method: str, path: str, body: dict | None = None, *,
             timeout: float | None = 30.0, params: str = "") -> Iterator[Response]:
    """Send one request to the server at ``socket_path`` and yield its
    response, open for reading; closed when the block ends (which, in the
    middle of an answer, tells the server the client went away).
    Unreachable when nothing listens there; ``socket.timeout`` and OSError
    as they come; Unanswered when the connection is reset or closed
    before the response's status line."""
    connection = _UnixConnection(socket_path, timeout)
    try:
        payload = None if body is None else json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        try:
            connection.request(method, path + (f"?{params}" if params else ""), body=payload, headers=headers)
            response = connection.getresponse()
        except ConnectionError as exc:  # reset, broken pipe, or closed without a response (RemoteDisconnected)
            raise Unanswered(f"the rag server at {socket_path} closed the connection before answering "
                             f"({exc or type(exc).__name__})") from None
        try:
            yield response
        finally:
            response.close()
    finally:
        connection.close()


def error_of(response: Response, data: bytes) -> RagError:
    """The one-line error a failed response carries (the service's
    ``{"error": {"message", "type"}}``, read as every client of the service
    reads it: :func:`~rag.service.api_client.api_error`); Unanswered for a
    server stopping."""
    try:
        error = json.loads(data)["error"]
        if error.get("type") == STOPPING:
            return Unanswered(error["message"])
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    return api_error(response.status, data, response.getheader("Retry-After"))


def call(socket_path: str, method: str, path: str, body: dict | None = None, *,
         timeout: float | None = 30.0, params: str = "", missing_ok: bool = False) -> dict | None:
    """One request and its JSON answer; None for a 404 when ``missing_ok``,
    a RagError with the server's message for any other failure."""
    with exchange(socket_path, method, path, body, timeout=timeout, params=params) as response:
        data = response.read()
    if response.status == 404 and missing_ok:
        return None
    if response.status >= 400:
        raise error_of(response, data)
    return json.loads(data)


def events(response: Response) -> Iterator[dict]:
    """The server-sent events of ``response``, each ``data:`` line's JSON."""
    for line in response:
        if line.startswith(b"data: "):
            yield json.loads(line[6:])

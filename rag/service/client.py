"""A ``rag serve`` elsewhere, answering as a pipeline here would: the
service's API (:class:`~rag.service.api_client.ApiAnswerer`) over HTTP,
with the service's bearer key where it wants one. ``rag ask``, ``rag
chat`` and ``rag search`` use it when ``RAG_SERVICE_URL`` (or
``--service-url``) names a server; the key is ``RAG_SERVICE_KEY``, never a
flag (a command line is seen by every user of the machine).

Does not: start, stop or retry a server; open its conversation store.
"""

from __future__ import annotations

import json
from typing import Iterator

import httpx

from ..errors import EngineUnavailable, RagError
from ..settings import Settings
from .api_client import ApiAnswerer, api_error

CONNECT_S = 10.0  # seconds to reach the server; an answer streams for as long as it takes


class ServiceClient(ApiAnswerer):
    """The rag server at ``url`` (``http://host:8000``), its key ``key``."""

    via = "service"

    def __init__(self, url: str, settings: Settings, key: str | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        super().__init__(settings)
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, transport=transport,
                                  timeout=httpx.Timeout(CONNECT_S, read=None))

    @classmethod
    def of(cls, settings: Settings) -> "ServiceClient":
        """The server ``settings.service_url`` names, with ``settings.service_key``."""
        return cls(str(settings.service_url), settings, settings.service_key)

    def _unreachable(self, exc: httpx.HTTPError) -> RagError:
        return EngineUnavailable(f"the rag server at {self.url} does not answer ({exc}); is `rag serve` running there?")

    def _call(self, method: str, path: str, body: dict | None = None, *, missing_ok: bool = False) -> dict | None:
        try:
            response = self._http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        if response.status_code == 404 and missing_ok:
            return None
        if response.status_code >= 400:
            raise api_error(response.status_code, response.content, response.headers.get("retry-after"))
        try:
            return response.json()
        except ValueError:
            raise RagError(f"{self.url} answered {path} with something other than JSON: is it a rag server?") from None

    def _events(self, path: str, body: dict) -> Iterator[dict]:
        try:
            with self._http.stream("POST", path, json=body) as response:
                if response.status_code != 200:
                    raise api_error(response.status_code, response.read(), response.headers.get("retry-after"))
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        yield json.loads(line[6:])
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None

    def _unfinished(self) -> RagError:
        return RagError(f"the rag server at {self.url} ended the answer without its sources and timings")

    def close(self) -> None:
        """Close the connections kept to the server."""
        self._http.close()

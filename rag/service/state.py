"""What the service's routes share: the pipeline, the settings, the
metrics, the answering in progress, the limits per caller, the ingest lock and
the uploads in flight.

Does not: handle requests.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from fastapi import Request

from ..qa.pipeline import Pipeline
from .answering import Answering
from .keys import LOCAL_USER, Caller, KeyRing
from .metrics import Metrics
from .ratelimit import CallerLimits
from .settings import ServiceSettings
from .uploads import Uploads
from .warmup import WarmUp


@dataclass
class ServiceState:
    """One service's shared parts (kept in ``app.state.service``)."""

    pipeline: Pipeline
    settings: ServiceSettings
    metrics: Metrics
    answering: Answering
    limits: CallerLimits  # in flight and against floods, per caller; wrong API keys, per address
    warmup: WarmUp
    keys: KeyRing  # the keys accepted and what each may do (empty: no key needed, loopback)
    ingesting: asyncio.Lock = field(default_factory=asyncio.Lock)  # one ingest at a time; queries go on
    uploads: Uploads = field(default_factory=Uploads)  # in flight: a question with no index yet waits for them

    @classmethod
    def create(cls, pipeline: Pipeline, settings: ServiceSettings) -> "ServiceState":
        """The parts of a new service over ``pipeline``."""
        metrics = Metrics()
        return cls(pipeline, settings, metrics, Answering(pipeline, settings, metrics),
                   CallerLimits.of(settings), WarmUp(pipeline), settings.keyring())


def service(request: Request) -> ServiceState:
    """The state of the app serving ``request`` (a FastAPI dependency)."""
    return request.app.state.service


def caller(request: Request) -> Caller:
    """Who is asking and what it may do (a FastAPI dependency): the key's
    holder the gate found, or with no keys (loopback, the resident
    server's socket) the local user, with every right."""
    found = request.scope.get("rag.rights")
    return found if found is not None else getattr(request.app.state, "keyless_caller", LOCAL_USER)


async def warmed(request: Request) -> None:
    """Wait until the service has warmed up (a FastAPI dependency of every
    route that needs the pipeline)."""
    await request.app.state.service.warmup.ready()

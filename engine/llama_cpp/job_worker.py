"""A daemon thread that serves one object's queue of jobs for as long as
that object lives (the snapshot cache's disk writer and reader).

Does not: queue, order or lock: the owner's ``take`` does.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Callable

log = logging.getLogger("rag_budget.cache")
# How long ``take`` waits for a job before the worker looks again whether its owner still lives.
TAKE_WAIT_S = 1.0


def start_worker(owner: object, name: str, take: Callable, do: Callable, what: Callable[..., str]) -> threading.Thread:
    """Start a thread that calls ``take(owner, wait_s)`` for the next job
    (None: none yet) and ``do(owner, job)`` for each, until ``owner`` is
    garbage (held weakly, so a dropped owner ends it). A job that raises is
    logged as ``what(job)`` and the worker goes on."""
    thread = threading.Thread(target=_serve, name=name, daemon=True, args=(weakref.ref(owner), take, do, what))
    thread.start()
    return thread


def _serve(ref: weakref.ref, take: Callable, do: Callable, what: Callable[..., str]) -> None:
    while True:
        owner = ref()
        if owner is None:
            return
        job = take(owner, TAKE_WAIT_S)
        if job is not None:
            try:
                do(owner, job)
            except Exception as exc:  # noqa: BLE001 - one job's failure, not the worker's
                log.warning("%s failed: %r", what(job), exc)
        del owner

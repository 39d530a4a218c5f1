"""What a request that ended well leaves behind for later prompts: its
session's state as a snapshot, and the passages of its prompt kept in the
passage store (a warming request's, or those a plain prompt evaluated).

Does not: release the sequence or tell the request (the loop does).
"""

from __future__ import annotations

import logging
import time
from typing import Sequence

import numpy as np

from .native import NativeContext
from .requests import Active
from .snapshots import Snapshot, SnapshotCache
from .splicing import Splicer

log = logging.getLogger("rag_budget.engine")


def keep_state(ctx: NativeContext, snapshots: SnapshotCache, splicer: Splicer, a: Active, held: list[int],
                   system: Sequence[int]) -> tuple[list[int], float]:
    """Save ``a``'s state for its session and keep its passages; the tokens
    its sequence goes on holding (none for a warming request, whose cells
    went to the store) and the seconds the saving took. A snapshot that
    cannot be saved, or a plain prompt's passages that cannot be kept, is
    only a cache entry lost (logged); a warming request's failure to keep
    its passage is raised, as its error."""
    req, snapshot_s = a.req, 0.0
    if req.session is not None and held:
        began = time.perf_counter()
        try:
            data = ctx.save(a.seq)
            if data:
                # Of the request's scope: a session's state is found again only by prompts of that scope.
                snapshots.put(req.session, Snapshot(np.asarray(held, dtype=np.int32), data, req.cache_scope),
                              pin=req.pin)
        except Exception as exc:  # noqa: BLE001 - the answer stands; its state is not kept
            log.warning("saving the state of %s failed: %r", req.session, exc)
        snapshot_s = time.perf_counter() - began
    if req.store is not None:
        splicer.keep(a, system)
        return [], snapshot_s
    began = time.perf_counter()
    try:
        splicer.keep_segments(a, system)
    except Exception as exc:  # noqa: BLE001 - the answer stands; its segments are not kept
        log.warning("keeping the passages of a prompt failed: %r", exc)
    return held, snapshot_s + time.perf_counter() - began  # saving state, like a session's snapshot

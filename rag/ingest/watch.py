"""Watching folders and files, and ingesting again when they change.

``watchfiles`` reports changes (inotify on Linux) and debounces them: a
burst of saves is one change. Each change runs the same incremental ingest
as ``rag ingest``, which publishes a new index generation atomically, so a
question asked meanwhile is answered from the last complete one. Changes to
files of types that cannot be read, hidden files and the index's own
folders are not changes. Stopping (Ctrl-C, or the ``stop`` event) during an
ingest leaves the index as it was before that ingest.

Does not: ingest by itself (it is handed the ingest to run) or poll.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

from ..errors import IndexBusy, RagError
from .formats import is_supported
from .run import IngestReport

DEBOUNCE_MS = 800  # changes within this long of each other are one change
BUSY_RETRIES = 20  # another writer holds the index: try again, a second apart


class ChangeFilter:
    """Which changes under the watched paths matter: files of a readable
    type (or a folder removed), not hidden, not under ``ignore``, and for a
    watched file only that file."""

    def __init__(self, paths: Sequence[Path], ignore: Sequence[Path] = ()) -> None:
        self.files = {str(p) for p in paths if not p.is_dir()}
        self.folders = tuple(str(p) for p in paths if p.is_dir())
        self.ignore = tuple(str(p) + os.sep for p in ignore) + tuple(str(p) for p in ignore)

    def __call__(self, change, path: str) -> bool:
        if path.startswith(self.ignore):
            return False
        if path not in self.files and not any(path.startswith(f + os.sep) for f in self.folders):
            return False
        under = next((path[len(f) + 1:] for f in self.folders if path.startswith(f + os.sep)), Path(path).name)
        if any(part.startswith(".") for part in under.split(os.sep)):
            return False
        return is_supported(Path(path)) or not Path(path).suffix


def watched(paths: Sequence[str | os.PathLike[str]]) -> tuple[list[Path], list[Path]]:
    """The given paths resolved, and the folders to watch for them (a
    file's folder: editors save by replacing the file). RagError for a
    path that does not exist."""
    resolved, folders = [], []
    for raw in paths:
        path = Path(raw).expanduser().resolve()
        if not path.exists():
            raise RagError(f"{raw}: no such file or folder to watch; check the path")
        resolved.append(path)
        folder = path if path.is_dir() else path.parent
        if folder not in folders:
            folders.append(folder)
    return resolved, folders


def watch(
    paths: Sequence[str | os.PathLike[str]],
    ingest_once: Callable[[], IngestReport],
    on_report: Callable[[IngestReport | None, str | None, int], None],
    *,
    ignore: Sequence[Path] = (),
    stop: threading.Event | None = None,
    debounce_ms: int = DEBOUNCE_MS,
) -> None:
    """Run ``ingest_once()`` each time a relevant file under ``paths``
    changes, until ``stop`` is set (or Ctrl-C, which is raised).
    ``on_report(report, error, n_changes)`` is told each ingest's report,
    or the one-line error that stopped it (the watch goes on)."""
    import watchfiles

    resolved, folders = watched(paths)
    accept = ChangeFilter(resolved, ignore)
    for changes in watchfiles.watch(*folders, watch_filter=accept, debounce=debounce_ms, stop_event=stop,
                                    raise_interrupt=True):
        report, problem = _ingest_when_free(ingest_once, stop)
        on_report(report, problem, len(changes))


def _ingest_when_free(ingest_once: Callable[[], IngestReport],
                      stop: threading.Event | None) -> tuple[IngestReport | None, str | None]:
    """The report of one ingest, retried while another writer holds the
    index; or the error that stopped it."""
    for attempt in range(BUSY_RETRIES):
        try:
            return ingest_once(), None
        except IndexBusy as exc:
            if attempt == BUSY_RETRIES - 1 or (stop is not None and stop.wait(1.0)):
                return None, str(exc)
            if stop is None:
                time.sleep(1.0)
        except RagError as exc:
            return None, str(exc)
    return None, None

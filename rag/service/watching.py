"""Folders a running service keeps indexed (``RAG_SERVE_WATCH``): ingested
when the service starts, then again whenever a file in them changes, on a
thread of its own; questions meanwhile are answered from the last
generation published. And what stops a service's ingests when the server
is told to exit (SIGTERM, Ctrl-C): :func:`stop_ingests_on_exit`.

Does not: watch by itself (``rag.ingest.watch`` does) or take requests.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Sequence

from ..errors import RagError
from ..ingest.library import DocumentLibrary
from ..ingest.run import IngestReport
from ..qa.pipeline import Pipeline

log = logging.getLogger("rag.serve.watch")


class FolderWatcher:
    """Keeps ``paths`` ingested into ``pipeline``'s index while running;
    ``reports`` counts the ingests done (the first is the one at start)."""

    def __init__(self, pipeline: Pipeline, paths: Sequence[Path]) -> None:
        self.pipeline, self.paths = pipeline, [Path(p) for p in paths]
        self.stop_event = threading.Event()
        self.reports = 0
        self.last: IngestReport | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Ingest the folders and watch them, on a daemon thread."""
        self._thread = threading.Thread(target=self._run, name="rag-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        library = self.pipeline.library
        # Stopping the watch stops its ingest too, before its next batch embedded.
        options = {"max_file_bytes": self.pipeline.settings.max_file_bytes, "cancel": self.stop_event}
        try:
            self._told(library.ingest(self.paths, **options), None, 0)
            library.watch(self.paths, self._told, stop=self.stop_event, **options)
        except RagError as exc:
            log.error("watching %s stopped: %s", ", ".join(map(str, self.paths)), exc)

    def _told(self, report: IngestReport | None, problem: str | None, n_changes: int) -> None:
        if report is None:
            log.error("ingest after a change failed: %s", problem)
            return
        self.last, self.reports = report, self.reports + 1
        c = report.counts()
        log.info("ingested %s: added %d, updated %d, removed %d, failed %d", ", ".join(map(str, self.paths)),
                 c["added"], c["updated"], c["removed"], c["failed"])
        for source, error in report.failed:
            log.warning("failed: %s: %s", source, error)

    def stop(self) -> None:
        """Stop watching; an ingest in progress stops before its next
        batch embedded, publishing nothing."""
        self.stop_event.set()
        if self._thread is not None:
            self._thread.join(timeout=60)


def stop_ingests_on_exit(server, library: DocumentLibrary) -> None:
    """Make the uvicorn ``server``'s exit (its SIGTERM and SIGINT handler)
    stop every ingest of ``library`` before its next batch embedded: uvicorn
    waits for the requests in flight, and an upload's ingest could run for
    minutes. The server's own handling goes on as before."""
    exit_handler = server.handle_exit

    def handle_exit(sig, frame) -> None:
        library.stop_ingests()
        exit_handler(sig, frame)

    server.handle_exit = handle_exit

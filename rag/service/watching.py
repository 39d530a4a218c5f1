"""Folders a running service keeps indexed (``RAG_SERVE_WATCH``, each
``DIR`` or ``DIR=COLLECTION``): ingested into their collection when the
service starts, then again whenever a file in them changes, on a thread
for each collection; the index's own folders under them are never walked.
Questions meanwhile are answered from the last generation published. And what stops a service's ingests when the server
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
from .settings import WatchedFolder

log = logging.getLogger("rag.serve.watch")


class FolderWatcher:
    """Keeps the ``watched`` folders ingested into ``pipeline``'s index
    while running, each into its collection (one thread a collection);
    ``reports`` counts the ingests done (the first of each is the one at start)."""

    def __init__(self, pipeline: Pipeline, watched: Sequence[WatchedFolder | Path]) -> None:
        self.pipeline = pipeline
        self.watched = [WatchedFolder.parse(w) for w in watched]
        self.paths = [w.folder for w in self.watched]
        self.stop_event = threading.Event()
        self.reports = 0
        self.last: IngestReport | None = None
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._first = threading.Lock()

    def start(self) -> None:
        """Ingest the folders and watch them, on a daemon thread a collection."""
        collections = dict.fromkeys(w.collection for w in self.watched)
        for collection in collections:
            paths = [w.folder for w in self.watched if w.collection == collection]
            thread = threading.Thread(target=self._run, args=(paths, collection), name=f"rag-watch-{collection}",
                                      daemon=True)
            self._threads.append(thread)
            thread.start()

    def _run(self, paths: list[Path], collection: str) -> None:
        library = self.pipeline.library
        # Stopping the watch stops its ingest too, before its next batch embedded.
        # Another collection's watched folder inside these is its own: never walked for this one.
        others = [w.folder for w in self.watched if w.collection != collection]
        options = {"max_file_bytes": self.pipeline.settings.max_file_bytes, "cancel": self.stop_event,
                   "collection": collection, "skip": others}
        told = lambda report, problem, n: self._told(paths, collection, report, problem)  # noqa: E731
        try:
            with self._first:  # the collections' first ingests one at a time: one writer at a time
                first = library.ingest(paths, **options)
            told(first, None, 0)
            library.watch(paths, told, stop=self.stop_event, **options)  # retries while another writes
        except RagError as exc:
            log.error("watching %s stopped: %s", ", ".join(map(str, paths)), exc)

    def _told(self, paths: list[Path], collection: str, report: IngestReport | None, problem: str | None) -> None:
        if report is None:
            log.error("ingest after a change failed: %s", problem)
            return
        with self._lock:
            self.last, self.reports = report, self.reports + 1
        c = report.counts()
        log.info("ingested %s into %s: added %d, updated %d, removed %d, failed %d", ", ".join(map(str, paths)),
                 collection, c["added"], c["updated"], c["removed"], c["failed"])
        for source, error in report.failed:
            log.warning("failed: %s: %s", source, error)

    def stop(self) -> None:
        """Stop watching; an ingest in progress stops before its next
        batch embedded, publishing nothing."""
        self.stop_event.set()
        for thread in self._threads:
            thread.join(timeout=60)


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

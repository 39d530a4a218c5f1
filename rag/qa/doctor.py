"""What ``rag doctor`` reports: versions, the engine, and the index.

Does not: fix anything.
"""

from __future__ import annotations

import importlib.metadata as md
import platform

from ..errors import RagError
from ..index.location import index_exists, shown, verify

DISTRIBUTIONS = ("rag-budget", "llama-cpp-python", "sentence-transformers", "faiss-cpu", "torch",
                 "langchain-text-splitters", "pypdf", "typer", "rich")


def doctor_report(pipeline) -> dict[str, object]:
    """Versions, engine build and device, model, context, threads and index
    statistics of ``pipeline`` (a :class:`~rag.qa.pipeline.Pipeline`)."""
    versions = {}
    for dist in DISTRIBUTIONS:
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            versions[dist] = None
    report: dict[str, object] = {
        "python": platform.python_version(), "versions": versions, "retrieval": pipeline.retrieval,
        "engine": pipeline.backend.describe(), "passages": pipeline.passages.describe(),
    }
    try:
        index = pipeline.index()
        report["index"] = index.stats() | {"sample": pipeline.use_sample, "notes": list(index.notes)}
    except RagError as exc:
        report["index"] = {"path": shown(pipeline.index_location), "error": str(exc)}
    # A database that could not be reached is said once, above: asking it again would lose the report.
    if "error" not in report["index"] and index_exists(pipeline.index_location):
        checked = verify(pipeline.index_location)
        report["index"]["integrity"] = checked["generations"]
        report["index"]["live_generation"] = checked["live"]
    return report

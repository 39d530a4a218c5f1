"""What ``rag doctor`` reports: versions, the engine, and the index.

Does not: fix anything.
"""

from __future__ import annotations

import importlib.metadata as md
import platform

from ..errors import RagError

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
        "engine": pipeline.backend.describe(),
    }
    try:
        report["index"] = pipeline.index().stats() | {"sample": pipeline.use_sample}
    except RagError as exc:
        report["index"] = {"path": str(pipeline.index_dir), "error": str(exc)}
    return report

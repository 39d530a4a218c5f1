"""rag-budget: local document question answering that treats the prompt as a cost.

    from rag import Pipeline
    p = Pipeline.open()                    # $RAG_INDEX or the per-user index
    p.ingest(["docs/"])
    print(p.ask("How do I ...?").answer)

Importing this package loads no model, and imports the parts behind its
names only when a name is first used: the ``rag`` command reaches a resident
server without importing the index, the engine or numpy.
"""

from __future__ import annotations

import time as _time

# The first line of rag's own code in this process, and the CPU the process
# had used by then: the `rag` command's seen TTFT never starts before the
# process began running rag (see rag.cli.seen).
CODE_STARTED = (_time.perf_counter(), _time.process_time())

import importlib  # noqa: E402
import sys  # noqa: E402
from typing import Callable


def lazy_exports(package: str, names: dict[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, whose re-exported
    ``names`` (name -> submodule, relative) are imported on first use and
    then kept in the package like an eager import would.

    ``lazy_exports("rag", {"Pipeline": ".qa"})`` makes ``rag.Pipeline`` import ``rag.qa`` when first read.
    """

    def __getattr__(name: str) -> object:
        where = names.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where, package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __getattr__, __dir__


_ERRORS = ("DocumentError", "DocumentNotFound", "EngineMisconfigured", "EngineUnavailable", "IndexBusy",
           "IndexMismatch", "IndexNotFound", "ModelNotFound", "QuestionTooLong", "RagError")
_EXPORTS = {name: ".errors" for name in _ERRORS} | {
    "Hit": ".index.store",
    "IngestReport": ".ingest.run",
    "Answer": ".qa.answer",
    "AnswerStream": ".qa.stream",
    "AskOptions": ".qa.options",
    "Budget": ".qa.answer",
    "Pipeline": ".qa.pipeline",
    "Source": ".qa.answer",
    "Scope": ".retrieval.scope",
    "Settings": ".settings",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

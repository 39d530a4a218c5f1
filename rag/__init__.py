"""rag-budget: local document question answering that treats the prompt as a cost.

    from rag import Pipeline
    p = Pipeline.open()                    # $RAG_INDEX or the per-user index
    p.ingest(["docs/"])
    print(p.ask("How do I ...?").answer)

Importing this package loads no model.
"""

from .answer import Answer, Budget, Source
from .errors import (
    DocumentError,
    EngineUnavailable,
    IndexBusy,
    IndexMismatch,
    IndexNotFound,
    ModelNotFound,
    QuestionTooLong,
    RagError,
)
from .ingest import IngestReport
from .pipeline import Pipeline
from .store import Hit

__all__ = [
    "Answer",
    "Budget",
    "DocumentError",
    "EngineUnavailable",
    "Hit",
    "IndexBusy",
    "IndexMismatch",
    "IndexNotFound",
    "IngestReport",
    "ModelNotFound",
    "Pipeline",
    "QuestionTooLong",
    "RagError",
    "Source",
]

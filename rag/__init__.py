"""rag-budget: local document question answering that treats the prompt as a cost.

    from rag import Pipeline
    p = Pipeline.open()                    # $RAG_INDEX or the per-user index
    p.ingest(["docs/"])
    print(p.ask("How do I ...?").answer)

Importing this package loads no model.
"""

from .errors import (
    DocumentError,
    DocumentNotFound,
    EngineMisconfigured,
    EngineUnavailable,
    IndexBusy,
    IndexMismatch,
    IndexNotFound,
    ModelNotFound,
    QuestionTooLong,
    RagError,
)
from .index.store import Hit
from .ingest.run import IngestReport
from .qa import Answer, AnswerStream, AskOptions, Budget, Pipeline, Source
from .retrieval import Scope
from .settings import Settings

__all__ = [
    "Answer",
    "AnswerStream",
    "AskOptions",
    "Budget",
    "DocumentError",
    "DocumentNotFound",
    "EngineMisconfigured",
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
    "Scope",
    "Settings",
    "Source",
]

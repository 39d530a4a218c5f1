"""Questions to answers: the :class:`Pipeline` facade, the options of a
question, prompt planning, the answer stream, and the cost model that learns.

The names below are imported on first use (see :func:`rag.lazy_exports`)."""

from .. import lazy_exports

_EXPORTS = {"Answer": ".answer", "Budget": ".answer", "BudgetDecision": ".answer", "Source": ".answer",
            "AskOptions": ".options", "Pipeline": ".pipeline", "Retrieval": ".pipeline", "AnswerStream": ".stream"}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

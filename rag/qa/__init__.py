"""Questions to answers: the :class:`Pipeline` facade, the options of a
question, prompt planning, the answer stream, and the cost-model keeper."""

from .answer import Answer, Budget, BudgetDecision, Source
from .options import AskOptions
from .pipeline import Pipeline, Retrieval
from .stream import AnswerStream

__all__ = ["Answer", "AnswerStream", "AskOptions", "Budget", "BudgetDecision", "Pipeline", "Retrieval", "Source"]

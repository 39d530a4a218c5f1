"""Pure prompt-cost logic: what goes into a prompt and what it will cost.

No model, no I/O: everything here is testable in milliseconds.
"""

from .budgeter import BudgetRequest, Candidate, ContextTooSmall, Decision, Plan, fit_to_context, plan_budget
from .cost import Fit, PrefillCostModel, PrefillSample, PromptShape, best_fit, fit_samples
from .history import HistoryPolicy, turns_to_fold, turns_to_skip
from .layout import (SYSTEM_PROMPT, ContextPassage, PastTurn, Quote, answer_lead, answer_opening, build_messages,
                     canonical_order, format_passage, passage_body, system_message)

__all__ = [
    "BudgetRequest",
    "HistoryPolicy",
    "PastTurn",
    "Quote",
    "answer_lead",
    "answer_opening",
    "canonical_order",
    "system_message",
    "turns_to_fold",
    "turns_to_skip",
    "Candidate",
    "Decision",
    "Fit",
    "best_fit",
    "fit_samples",
    "plan_budget",
    "ContextPassage",
    "ContextTooSmall",
    "Plan",
    "PrefillCostModel",
    "PrefillSample",
    "PromptShape",
    "SYSTEM_PROMPT",
    "build_messages",
    "fit_to_context",
    "format_passage",
    "passage_body",
]

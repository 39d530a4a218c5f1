"""Pure prompt-cost logic: what goes into a prompt and what it will cost.

No model, no I/O: everything here is testable in milliseconds.
"""

from .budgeter import BudgetRequest, Candidate, ContextTooSmall, Decision, Plan, fit_to_context, plan_budget
from .cost import Fit, PrefillCostModel, PrefillSample, best_fit, fit_samples
from .layout import SYSTEM_PROMPT, ContextPassage, build_messages, format_passage

__all__ = [
    "BudgetRequest",
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
    "SYSTEM_PROMPT",
    "build_messages",
    "fit_to_context",
    "format_passage",
]

"""Pure prompt-cost logic: what goes into a prompt and what it will cost.

No model, no I/O: everything here is testable in milliseconds.
"""

from .budgeter import Candidate, ContextTooSmall, Plan, fit_to_context
from .cost import PrefillCostModel, PrefillSample
from .layout import SYSTEM_PROMPT, ContextPassage, build_messages, format_passage

__all__ = [
    "Candidate",
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

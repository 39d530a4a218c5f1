"""A question's options on the command line, built from their declaration.

Every option :class:`~rag.qa.options.AskOptions` offers on the command
line (``Offered("cli", ...)``) becomes a flag of ``rag ask`` and ``rag
chat`` with its type, default and words: a new option is declared in one
place and found here.

Does not: validate values (``AskOptions.of`` does, as for every front end).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import typer

from ..qa.options import AskOptions, OfferedOption, offered


def option_parameter(option: OfferedOption) -> inspect.Parameter:
    """The typer parameter of one offered option: ``--the-name`` and its
    other flags, its declared default, its words as the help."""
    default = option.field.get_default(call_default_factory=True)
    return inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, annotation=option.field.annotation,
                             default=typer.Option(default, *option.flags, help=option.words(default=False) + "."))


def with_question_options(command: Callable[..., Any], options: "type[AskOptions] | None" = None) -> Callable[..., Any]:
    """``command`` with a flag for every option offered on the command line
    that it does not take itself; it receives their values, by their
    :class:`AskOptions` names, as its ``asked`` argument."""
    own = [p for p in inspect.signature(command).parameters.values() if p.name != "asked"]
    taken = {p.name for p in own}
    added = [option_parameter(o) for o in offered("cli", options) if o.name not in taken]

    @functools.wraps(command)
    def run(**given: Any) -> Any:
        asked = {p.name: given.pop(p.name) for p in added}
        return command(**given, asked=asked)

    run.__signature__ = inspect.Signature(own + added)  # what typer reads
    return run

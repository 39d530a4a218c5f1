"""The command line's side of every ``rag bench`` run: a
:class:`rag.bench.setup.Harness` whose settings take the engine options
given before the command, whose pipelines are the commands' own (telling
the user on stderr what they do on their own), and whose progress is drawn
on stderr.

Does not: build, run or measure anything.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

from ..bench.setup import Harness
from .common import IngestBar, command_pipeline, counting, err, settings


@contextlib.contextmanager
def _status(label: str) -> Iterator[Callable[[str], None]]:
    with err().status(label) as status:
        yield lambda message: status.update(message)


def harness() -> Harness:
    """The harness of a ``rag bench`` command."""
    return Harness(settings=settings, open=command_pipeline, ingesting=lambda: IngestBar.shown(transient=True),
                   counting=counting, status=_status, line=lambda line: err().print(f"[dim]{line}[/]"),
                   notice=lambda message: err().print(message))

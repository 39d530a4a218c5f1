"""The ``rag`` command: a thin layer over :class:`rag.Pipeline`.

Each module holds a few commands: ``documents`` (ingest), ``ask`` (search,
ask, chat), ``admin`` (calibrate, serve, doctor), ``server`` (the resident
server's status, start and stop), ``bench_answers``, ``bench_grade``, ``bench_parts``,
``bench_page`` and ``bench_splice`` (the benchmarks); ``common`` what they
share, ``seen`` the clock of what the person at the terminal waits for. Commands parse
arguments, call the Python API and format what comes back; errors meant for
the user are one line on stderr with a non-zero exit.
"""

from . import admin, ask, bench_answers, bench_grade, bench_page, bench_parts, bench_splice, documents, server  # noqa: F401 - each registers its commands
from .common import app
from .seen import clock


def main() -> None:
    """Entry point of the ``rag`` console script."""
    clock.process_started()  # the person pressed Enter when this process started
    app()


__all__ = ["app", "main"]

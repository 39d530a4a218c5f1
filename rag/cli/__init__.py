"""The ``rag`` command: a thin layer over :class:`rag.Pipeline`.

Each module holds a few commands: ``documents`` (ingest), ``ask`` (search,
ask, chat), ``admin`` (calibrate, serve, doctor), ``bench_answers`` and
``bench_parts``, ``bench_splice`` (the benchmarks); ``common`` what they share. Commands parse
arguments, call the Python API and format what comes back; errors meant for
the user are one line on stderr with a non-zero exit.
"""

from . import admin, ask, bench_answers, bench_parts, bench_splice, documents  # noqa: F401 - each registers its commands
from .common import app


def main() -> None:
    """Entry point of the ``rag`` console script."""
    app()


__all__ = ["app", "main"]

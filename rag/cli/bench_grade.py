"""``rag bench answers``: answer accuracy against gold key facts, ours
beside LangChain; runs ``rag.bench.answers`` (``rag.bench.evidence`` with
``--evidence-only``) and prints its figures.

Does not: build pipelines, or measure or score anything itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from ..errors import RagError
from ..qa.options import DEFAULT_EVIDENCE, EVIDENCE_PLACES
from ..settings import DEFAULT_EVIDENCE_FLOOR
from ..bench.setup import DEFAULT_CHAT_CORPUS
from .bench_harness import harness
from .common import MODEL_OPTION, bench_app, echo_json, seconds_list, user_errors


@bench_app.command("answers")
def bench_answers(
    corpus: List[Path] = typer.Option([DEFAULT_CHAT_CORPUS], "--corpus", help="Folder of documents (apt-get install python3.11-doc); repeatable with --half."),
    include: List[str] = typer.Option(["library/*"], "--include", help="Only corpus files matching this glob (repeatable)."),
    questions: Optional[Path] = typer.Option(None, "--questions", help="JSON lines of {question, gold, facts, reference[, answerable, lang, id]} (default: the bundled Python-docs answer set)."),
    half: Optional[str] = typer.Option(None, "--half", help="Score one question set as a user meets it: its tuning, heldout or all half (split with a fixed seed); answerable and unanswerable questions, declines paired with the model's answer, passages against --targets."),
    targets: str = typer.Option("1,2,4", "--targets", help="With --half: the targets each question is also planned at (passages per prompt, gold passage in it)."),
    limit: int = typer.Option(0, "--limit", help="Only the first N questions (0: all)."),
    target_ttft: Optional[float] = typer.Option(None, "--target-ttft", help="rag-budget's TTFT target (default: $RAG_TARGET_TTFT, else 2.0)."),
    max_tokens: int = typer.Option(64, "--max-tokens", min=1, help="Answer tokens per question."),
    peer: bool = typer.Option(True, "--peer/--no-peer", help="Also answer with the classic LangChain RAG (k=4)."),
    also_targets: str = typer.Option("", "--also-targets", help="Also answer with rag-budget at these targets (seconds, comma-separated)."),
    index: Optional[Path] = typer.Option(None, "--index", help="Index for the corpus (default: a cache folder per corpus)."),
    evidence: str = typer.Option(DEFAULT_EVIDENCE, "--evidence", help="Where rag-budget puts the evidence: last, prefill, both, open (the answer opens with it) or off."),
    evidence_variants: str = typer.Option("off", "--evidence-variants", help="Also rag-budget at the target with the evidence placed so (comma-separated; off: today's prompt; none: no variant)."),
    evidence_embed: bool = typer.Option(False, "--evidence-embed", help="Rank the evidence by embedding similarity too."),
    evidence_floor: float = typer.Option(DEFAULT_EVIDENCE_FLOOR, "--evidence-floor", min=0.0, help="Evidence score under which rag-budget says the documents do not answer."),
    free: bool = typer.Option(True, "--free/--no-free", help="Also rag-budget with no target."),
    evidence_only: bool = typer.Option(False, "--evidence-only", help="No model: plan each prompt and score its evidence, and the best evidence score of questions the docs do not answer."),
    unanswerable: Optional[Path] = typer.Option(None, "--unanswerable", help="With --evidence-only: JSON lines of {question} the corpus does not answer (default: the bundled set)."),
    model: Optional[Path] = MODEL_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the bench object as JSON."),
) -> None:
    """Every question answered by rag-budget at its target, beside today's
    prompt (the evidence not prompted), rag-budget with no target and
    LangChain k=4 on the same model, taking turns; each answer scored by the
    key facts it states, the evidence by whether it states them alone:
    accuracy, median and p95 TTFT with bootstrap 95 % intervals, and a
    paired comparison."""
    with user_errors():
        if limit < 0 or (target_ttft is not None and target_ttft <= 0):
            raise RagError("--limit must be 0 (all) or more and --target-ttft positive")
        extra = seconds_list(also_targets, "--also-targets")
        places = [p.strip() for p in evidence_variants.split(",") if p.strip() and p.strip() != "none"]
        unknown = [p for p in [evidence, *places] if p not in EVIDENCE_PLACES]
        if unknown:
            raise RagError(f"--evidence/--evidence-variants: {', '.join(unknown)}? use {', '.join(EVIDENCE_PLACES)}")
        if half is not None:
            from ..bench.sets import run as run_set
            from ..evaluation.sets import HALVES

            if half not in HALVES or questions is None:
                raise RagError(f"--half takes {', '.join(HALVES)}, with --questions FILE")
            result = run_set(harness(), corpus, include, questions=questions, half=half, target_ttft=target_ttft,
                             max_tokens=max_tokens, floor=evidence_floor,
                             targets=seconds_list(targets, "--targets", empty_ok=False),
                             options={"evidence": evidence, "evidence_embed": evidence_embed},
                             evidence_only=evidence_only, index=index, model=model)
        if len(corpus) != 1 and half is None:
            raise RagError("--corpus once, unless --half")
        options = {"evidence": evidence, "evidence_embed": evidence_embed, "evidence_floor": evidence_floor}
        asked = dict(questions=questions, limit=limit, target_ttft=target_ttft, options=options, index=index,
                     model=model)
        if half is not None:
            pass
        elif evidence_only:
            from ..bench.evidence import run as run_evidence

            result = run_evidence(harness(), corpus[0], include, unanswerable=unanswerable, **asked)
        else:
            from ..bench.answers import run

            result = run(harness(), corpus[0], include, max_tokens=max_tokens, peer=peer, also_targets=extra,
                         evidence_places=places, free=free, **asked)
    if as_json:
        echo_json(result)
    elif half is not None:
        print_set(result)
    else:
        print_evidence(result) if evidence_only else print_answers(result)


def print_answers(result: dict) -> None:
    """The per-system table of a ``rag bench answers`` object."""
    config = result["config"]
    table = Table(title=f"rag bench answers ({config['questions']} questions, target {config['target_ttft_s']:g} s, "
                        f"{config['max_tokens']} answer tokens, {Path(config['model']).name})", title_justify="left")
    for c in ("system", "right", "accuracy [95% CI]", "evidence right", "prompt states facts",
              "median TTFT s [95% CI]", "p95 TTFT s [95% CI]", "F1", "mean chunks", "prompt recall",
              "invented citations (ours: removed)"):
        table.add_column(c, justify="right")

    def interval(value, ci, digits: int) -> str:
        return "-" if value is None else f"{value:.{digits}f} [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"

    for row in result["summary"]["systems"]:
        n = row["questions"]
        table.add_row(row["name"], f"{row['right']}/{n}", interval(row["accuracy"], row["accuracy_ci95"], 2),
                      "-" if row.get("evidence_right") is None else f"{row['evidence_right']}/{n}",
                      "-" if row.get("prompt_states_facts") is None else f"{row['prompt_states_facts']}/{n}",
                      interval(row["median_ttft_s"], row["median_ttft_ci95"], 3),
                      interval(row["p95_ttft_s"], row["p95_ttft_ci95"], 3),
                      "-" if row["mean_f1"] is None else f"{row['mean_f1']:.2f}", f"{row['mean_chunks']:.1f}",
                      f"{row['prompt_recall'] * 100:.0f}%", str(row["invented_citations"]))
    console = Console(highlight=False)
    console.print(table)
    for key, v in result["summary"].items():
        if key.startswith("vs_"):
            console.print(f"rag-budget {key.replace('_', ' ')}: right only ours {v['only_ours_right']}, "
                          f"only theirs {v['only_theirs_right']} (sign test p {v['sign_test_p']}; accuracy "
                          f"difference {v['accuracy_difference']:+.3f} {v['accuracy_difference_ci95']}); "
                          f"their median TTFT / ours {v['ttft_ratio']}")


def print_evidence(result: dict) -> None:
    """The summary of a ``rag bench answers --evidence-only`` object."""
    s = result["summary"]
    console = Console(highlight=False)
    console.print(f"evidence alone states the facts: {s['evidence_right']}/{s['questions']} "
                  f"(the prompt's passages: {s['prompt_states_facts']}/{s['questions']}); "
                  f"{s['mean_evidence_words']} words, {s['mean_evidence_ms']} ms to find")
    console.print(f"best evidence score: lowest of the answerable {s['lowest_answerable_score']}, "
                  f"highest of the unanswerable {s['highest_unanswerable_score']} "
                  f"({'a floor between them separates them' if s['floor_separates'] else 'no floor separates them'})")


def _share(figure: dict | None) -> str:
    if not figure or figure.get("share") is None:
        return "-"
    low, high = figure["ci95"]
    return f"{figure['count']}/{figure['of']} {figure['share'] * 100:.0f}% [{low * 100:.0f}, {high * 100:.0f}]"


def print_set(result: dict) -> None:
    """The figures of a ``rag bench answers --half`` object: one set's half."""
    c, s = result["config"], result["summary"]
    console = Console(highlight=False)
    console.print(f"rag bench answers --half {c['half']} ({Path(c['questions']).name}: {s['answerable']} answerable, "
                  f"{s['unanswerable']} not; target {c['target_ttft_s']:g} s, floor {c['evidence_floor']:g})")
    table = Table(show_header=True, title_justify="left")
    table.add_column("figure")
    table.add_column("value [95% CI]", justify="right")
    for name, key in (("answers right", "right"), ("evidence right (<= 60 words)", "evidence_right"),
                      ("answer right where its evidence was (paired)", "answer_keeps_evidence"),
                      ("top unit right", "top_unit_right"), ("some unit of the prompt right", "prompt_unit_right"),
                      ("prompt's passages state the facts", "prompt_states_facts"),
                      ("declined, answerable", "declined_answerable"), ("declined, unanswerable", "declined_unanswerable"),
                      ("would decline, answerable", "would_decline_answerable"),
                      ("would decline, unanswerable", "would_decline_unanswerable"),
                      ("gold passage in the prompt", "gold_in_prompt")):
        if key in s:
            table.add_row(name, _share(s[key]))
    if "ttft_p95_s" in s:
        table.add_row("declines that cost a right answer", str(s["declines_that_cost_a_right_answer"]))
        table.add_row("passages per prompt (asked)", f"{s['mean_chunks']}")
        table.add_row("TTFT p50 / p95 s (engine)", f"{s['ttft_p50_s']:.3f} / {s['ttft_p95_s']:.3f} "
                      f"[{s['ttft_p95_ci95'][0]:.3f}, {s['ttft_p95_ci95'][1]:.3f}] = {s['ttft_p95_over_target']:.2f}x")
        table.add_row("seen p50 / p95 s (call to first text)", f"{s['seen_p50_s']:.3f} / {s['seen_p95_s']:.3f} "
                      f"= {s['seen_p95_over_target']:.2f}x")
    console.print(table)
    for t in s["by_target"]:
        console.print(f"planned at {t['target_s']:g} s: {t['mean_chunks']} passages, gold in prompt "
                      f"{_share(t['gold_in_prompt'])}")
    console.print(f"best evidence score: lowest answerable {s['lowest_answerable_score']}, "
                  f"highest unanswerable {s['highest_unanswerable_score']}")

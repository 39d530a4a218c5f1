"""``rag search``, ``rag ask`` and ``rag chat``: questions from the
command line, answers streamed to stdout, figures on stderr. They go to the
resident server of this set-up (started in the background on first use),
or with ``--no-server`` to a pipeline in this process; either gives an
:class:`~rag.qa.stream.AnswerStream`, printed by the same code, so the
output is the same.

Does not: plan or answer (the pipeline does, here or in the server).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Sequence

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..errors import RagError
from ..qa.answer import Answer, Evidence, where
from ..qa.stream import EvidenceFound, TextPiece
from ..qa.options import AskOptions
from .asked import with_question_options
from .common import (
    COLLECTION_OPTION,
    INDEX_OPTION,
    MODEL_OPTION,
    NO_SERVER_OPTION,
    RETRIEVAL_OPTION,
    SOURCE_OPTION,
    TARGET_OPTION,
    TYPE_OPTION,
    app,
    echo_json,
    err,
    question_pipeline,
    scope_of,
    settings,
    user_errors,
)
from .seen import Seen, clock

if TYPE_CHECKING:
    from ..qa.answerer import Answerer


@app.command()
def search(
    query: str = typer.Argument(..., help="What to look for."),
    index: Optional[str] = INDEX_OPTION,
    k: int = typer.Option(5, "-k", help="How many chunks to return."),
    retrieval: Optional[str] = RETRIEVAL_OPTION,
    source: List[str] = SOURCE_OPTION,
    file_type: List[str] = TYPE_OPTION,
    collection: str = COLLECTION_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
    no_server: bool = NO_SERVER_OPTION,
) -> None:
    """Show the chunks that best match QUERY, without asking the model."""
    with user_errors():
        scope = scope_of(source, file_type)
        pipeline = question_pipeline(settings(index=index, retrieval=retrieval, no_server=no_server or None))
        hits = pipeline.search(query, k=k, scope=scope, collection=collection)
    if as_json:
        echo_json({"results": [h.to_dict() for h in hits]})
        return
    console = Console(highlight=False)
    if not hits:
        console.print("no results (is the index empty?)")
    for rank, h in enumerate(hits, start=1):
        shown = escape(where(h.source, h.location, h.context))
        console.print(f"[bold]{rank}. {shown}[/]  score {h.score:.3f}  [dim]{h.chunk_id}[/]")
        console.print(" ".join(h.text.split())[:300], soft_wrap=True, markup=False)  # document text, not markup
        console.print()


@app.command()
@with_question_options
def ask(
    question: str = typer.Argument(..., help="The question to answer from your documents."),
    index: Optional[str] = INDEX_OPTION,
    target_ttft: Optional[str] = TARGET_OPTION,
    model: Optional[Path] = MODEL_OPTION,
    retrieval: Optional[str] = RETRIEVAL_OPTION,
    source: List[str] = SOURCE_OPTION,
    file_type: List[str] = TYPE_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the answer, sources, budget and timings as JSON."),
    explain: bool = typer.Option(False, "--explain", help="Show the budget decision for every candidate."),
    no_server: bool = NO_SERVER_OPTION,
    asked: Optional[dict] = None,
) -> None:
    """Answer QUESTION from the index, streaming, then list the sources.
    --source and --type limit the documents it draws on."""
    with user_errors():
        options = AskOptions.of(**(asked or {}), scope=scope_of(source, file_type))
        pipeline = question_pipeline(settings(index=index, model=model, retrieval=retrieval, target_ttft=target_ttft,
                                              no_server=no_server or None))
        pipeline.prepare()  # loading the models is not part of the question's time to first token
        seen = Seen.of(pipeline, clock.started)
        answer = stream_answer(pipeline, question, options, seen, echo=not as_json)
        if as_json:
            echo_json(answer.to_dict() | {"cli": seen.to_dict()})
            if explain:
                print_explain(answer, err())
            finish_background(pipeline)
            return
        console = Console(highlight=False)
        print_sources(answer, console)
        if explain:
            print_explain(answer, console)
        print_cost_line(answer, seen)
        finish_background(pipeline)


def stream_answer(pipeline: Answerer, question: str, options: AskOptions, seen: Seen, *, echo: bool = True) -> Answer:
    """Write the answer to stdout as it is generated (unless not ``echo``),
    noting in ``seen`` when the first text was shown; return the Answer."""
    with pipeline.stream(question, options) as stream:
        try:
            for event in stream.events():
                if isinstance(event, EvidenceFound):
                    if echo:  # before the answer: it is known before the first token, and it is what answers
                        # Where the answer opens with the quotes, only where each lies is said here.
                        print_evidence(event.evidence, quoted=options.evidence == "open")
                    seen.evidence_known()
                    continue
                if not isinstance(event, TextPiece):
                    continue  # AnswerDone: read below, as the stream's answer
                if echo:
                    sys.stdout.write(event.text)
                    sys.stdout.flush()
                seen.text_shown()
        finally:
            if echo:
                sys.stdout.write("\n")
    seen.ended = time.perf_counter()
    return stream.answer


def print_evidence(evidence: Sequence[Evidence], console: Console | None = None, *, quoted: bool = False) -> None:
    """The evidence, marked: where each sentence is and what it is about,
    then the sentence itself highlighted (on stdout, before the answer);
    where the answer quotes it (``quoted``), where it lies alone."""
    if not evidence:
        return
    console = console or Console(highlight=False)
    for e in evidence:
        about = f" — {escape(' '.join(e.about.split()))}" if e.about and not quoted else ""
        console.print(f"[bold]Evidence[/] [{e.passage}] {escape(where(e.source, e.location))}{about}", soft_wrap=True)
        if not quoted:
            console.print(f"  [reverse]{escape(' '.join(e.text.split()))}[/]", soft_wrap=True)
    console.print()


def print_sources(answer: Answer, console: Console) -> None:
    """The numbered sources of ``answer``, as its citations [n] refer to them."""
    console.print("\n[bold]Sources[/]")
    for n, s in enumerate(answer.sources, start=1):
        console.print(f"  [{n}] {escape(s.where())}  (score {s.score:.3f})")


def print_cost_line(answer: Answer, seen: Seen) -> None:
    """One dim line on stderr: chunks, tokens, TTFT (the engine's, and as
    seen from the command's start) against target and prediction."""
    t, b = answer.timings, answer.budget
    target = "no target" if b.target_ttft is None else f"target {b.target_ttft:.2f} s"
    shown = "no text" if seen.ttft_s is None else f"{seen.ttft_s:.2f} s"
    err().print(
        f"[dim]{b.chosen}/{b.candidates} chunks, {t.prompt_tokens} prompt tokens ({t.cached_tokens} cached), "
        f"TTFT {t.ttft_s:.2f} s ({target}, predicted {b.predicted_ttft_s:.2f} s; seen {shown}), "
        f"{t.decode_tokens} tokens in {t.total_s:.2f} s[/]"
    )
    if b.turns_left_out:
        err().print(f"[yellow]{b.turns_left_out} earlier turn(s) of this conversation were left out of the prompt: "
                    "the context could not hold them beside the passages while their summary is being written[/]")


def print_explain(answer: Answer, console: Console) -> None:
    """The budget decision for every candidate, then predicted against measured TTFT."""
    b, t = answer.budget, answer.timings
    table = Table(title="budget decision", title_justify="left")
    for column in ("#", "source", "tokens", "score", "cum. TTFT s", "decision"):
        right = column in {"#", "tokens", "score", "cum. TTFT s"}
        table.add_column(column, justify="right" if right else "left", no_wrap=column != "source",
                         overflow="fold" if column == "source" else "ellipsis")
    for n, d in enumerate(b.decisions, start=1):
        decision = ", ".join(["chosen", *(["trimmed"] if d.trimmed else []), *(["spliced"] if d.spliced else [])]) \
            if d.chosen else f"dropped: {d.reason}"
        table.add_row(str(n), escape(d.source), str(d.tokens), f"{d.score:.3f}", f"{d.ttft_s:.2f}" if d.ttft_s else "",
                      escape(decision), style=None if d.chosen else "dim")
    console.print(table)
    target = "none" if b.target_ttft is None else f"{b.target_ttft:.2f} s"
    console.print(
        f"target {target}; predicted {b.predicted_ttft_s:.2f} s (planned with x{b.safety:.2f} margin: "
        f"{(b.planned_ttft_s or 0):.2f} s); measured {t.ttft_s:.2f} s"
        + ("" if b.feasible else "  [red]infeasible: even one chunk exceeds the target[/]")
    )
    if t.spliced_tokens:
        console.print(f"{t.spliced_tokens} prompt tokens placed from the passage store in {t.splice_s * 1000:.0f} ms "
                      "(counted as cached)")


def finish_background(pipeline: Answerer) -> None:
    """Let a summary that is being written finish before the process ends
    (the answer is already out)."""
    if pipeline.background_busy():
        err().print("[dim]folding older turns into the conversation summary...[/]")
    pipeline.wait_idle()


CHAT_COMMANDS = "/sources /stats /reset /quit"


@app.command()
@with_question_options
def chat(
    session: Optional[str] = typer.Option(None, "--session", help="Conversation id to continue (default: a new one)."),
    index: Optional[str] = INDEX_OPTION,
    target_ttft: Optional[str] = TARGET_OPTION,
    model: Optional[Path] = MODEL_OPTION,
    no_server: bool = NO_SERVER_OPTION,
    asked: Optional[dict] = None,
) -> None:
    """Talk with your documents: each question continues the conversation.

    Commands: /sources (of the last answer), /stats (tokens and TTFT per
    turn), /reset (forget this conversation), /quit.
    """
    with user_errors():
        session = session or time.strftime("chat-%Y%m%d-%H%M%S")
        options = AskOptions.of(**(asked or {}), session=session)
        pipeline = question_pipeline(settings(index=index, model=model, target_ttft=target_ttft,
                                              no_server=no_server or None))
        ChatLoop(pipeline, options).run()


class ChatLoop:
    """The read-answer loop of ``rag chat`` over one session."""

    def __init__(self, pipeline: Answerer, options: AskOptions) -> None:
        self.pipeline, self.options = pipeline, options
        self.session = str(options.session)
        self.console, self.err = Console(highlight=False), err()
        self.answers: list[tuple[Answer, Seen]] = []

    def run(self) -> None:
        """Read lines until /quit or end of input; answer each question."""
        earlier = self.pipeline.conversation(self.session)
        resumed = f", resuming after {earlier.next_number - 1} turns" if earlier.next_number > 1 else ""
        self.err.print(f"[dim]session {self.session}{resumed}; {CHAT_COMMANDS}[/]")
        while True:
            try:
                line = self.console.input("[bold green]you>[/] ").strip()
                asked = time.perf_counter()  # the person pressed Enter: this question's clock starts
            except EOFError:
                self.console.print()
                break
            if line in {"/quit", "/exit", "/q"}:
                break
            if line:
                self.handle(line, asked)
        finish_background(self.pipeline)
        self.err.print(f"[dim]continue later with: rag chat --session {self.session}[/]")

    def handle(self, line: str, asked: float) -> None:
        """One line, entered at ``asked``: a command, or a question to answer."""
        if line == "/reset":
            self.pipeline.reset(self.session)
            self.answers = []
            self.err.print(f"[dim]session {self.session} forgotten; starting over[/]")
        elif line == "/sources":
            if self.answers:
                print_sources(self.answers[-1][0], self.console)
            else:
                self.err.print("[dim]no answer yet[/]")
        elif line == "/stats":
            print_chat_stats(self.answers, self.console, self.pipeline)
        elif line.startswith("/"):
            self.err.print(f"[yellow]unknown command {line.split()[0]}[/]; try {CHAT_COMMANDS}")
        else:
            try:
                self.console.print("[bold blue]rag>[/] ", end="")
                seen = Seen.of(self.pipeline, asked)
                answer = stream_answer(self.pipeline, line, self.options, seen)
            except RagError as exc:  # one bad question does not end the conversation
                self.err.print(f"[bold red]error:[/] {escape(str(exc))}", soft_wrap=True)
                return
            self.answers.append((answer, seen))
            print_cost_line(answer, seen)


def print_chat_stats(answers: list[tuple[Answer, Seen]], console: Console, pipeline: Answerer) -> None:
    """Tokens and TTFT per turn of this conversation (the engine's, and as
    seen from the question's Enter), and its summaries."""
    table = Table(title="this conversation", title_justify="left")
    for column in ("turn", "prompt tok", "cached", "prefilled", "restored", "chunks", "TTFT s", "predicted s"):
        table.add_column(column, justify="right")
    for a, _ in answers:
        t = a.timings
        table.add_row(str(a.turn), str(t.prompt_tokens), str(t.cached_tokens), str(t.prefill_tokens),
                      str(t.restored_tokens), str(a.budget.chosen), f"{t.ttft_s:.2f}", f"{a.budget.predicted_ttft_s:.2f}")
    console.print(table)
    if answers:
        prompt = sum(a.timings.prompt_tokens for a, _ in answers)
        cached = sum(a.timings.cached_tokens for a, _ in answers)
        console.print(f"cached/prompt tokens: {cached / prompt:.2f}")
        seen = ", ".join("-" if s.ttft_s is None else f"{s.ttft_s:.2f}" for _, s in answers)
        console.print(f"TTFT seen, from Enter to the first text, per turn: {seen} s")
    folds = [e for e in pipeline.background_log if e.get("kind") == "summary" and not e.get("interrupted")]
    if folds:
        spent = sum(float(e["seconds"]) for e in folds)
        console.print(f"summaries: {len(folds)} ({', '.join(str(e['method']) for e in folds)}), "
                      f"{spent:.1f} s in the background")

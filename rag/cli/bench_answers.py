"""The benchmarks that ask questions: ``rag bench ttft``, ``chat``, ``peer``
and ``serve``; each parses its options, runs ``rag.bench.NAME.run`` and
prints its figures.

Does not: build pipelines or servers, or measure anything itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from ..bench.setup import DEFAULT_CHAT_CORPUS
from ..errors import RagError
from .bench_harness import harness
from .common import MODEL_OPTION, bench_app, echo_json, err, int_list, seconds_list, user_errors


@bench_app.command("ttft")
def bench_ttft(
    corpus: Path = typer.Option(..., "--corpus", help="Folder of documents (ingested incrementally into --index)."),
    questions: Path = typer.Option(..., "--questions", help="JSON lines of {question, gold}."),
    targets: str = typer.Option("0.5,1,2,4", "--targets", help="Comma-separated TTFT targets in seconds."),
    index: Optional[Path] = typer.Option(None, "--index", help="Index for the corpus (default: a cache folder per corpus)."),
    include: List[str] = typer.Option([], "--include", help="Only corpus files matching this glob (repeatable)."),
    max_tokens: int = typer.Option(16, "--max-tokens", help="Answer tokens per request (TTFT does not depend on it)."),
    no_learn: bool = typer.Option(False, "--no-learn", help="Freeze the cost model: no online learning."),
    passes: int = typer.Option(1, "--passes", min=1, help="Ask everything this many times; between passes the engine stores the passages wished for (passage KV reuse)."),
    busy_first_half: bool = typer.Option(False, "--busy-first-half", help="Run a CPU-bound neighbour on one core for the first half of the questions, none for the second; report each half."),
    model: Optional[Path] = MODEL_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the bench object as JSON."),
    plot: Optional[Path] = typer.Option(
        None, "--plot", help="Also draw measured and predicted TTFT against the target, per question, into this "
                             "SVG or PNG file (needs matplotlib: the bench extra)."),
) -> None:
    """Answer every question under every TTFT target; report how well the target held.
    KV snapshots and stored passages are kept in RAM only: every run starts cold."""
    from ..bench.ttft import run

    with user_errors():
        wanted = seconds_list(targets, "--targets", empty_ok=False)
        result = run(harness(), corpus, questions, wanted, index=index, include=include, model=model,
                     max_tokens=max_tokens, learn=not no_learn, passes=passes, busy_first_half=busy_first_half,
                     plot=plot)
    if plot is not None:
        err().print(f"plot: {plot}", markup=False, soft_wrap=True)
    echo_json(result) if as_json else print_ttft(result)


def print_ttft(result: dict) -> None:
    """The per-target (and per-pass) table of a ``rag bench ttft`` object."""
    config = result["config"]
    splice = config.get("splice_fresh")
    table = Table(title=f"rag bench ttft ({config['questions']} questions, learning {'on' if config['learn'] else 'off'}, "
                        f"passage KV reuse {'off' if splice is None else f'R={splice}'})", title_justify="left")
    columns = ["pass", "target s", "feasible", "requests", "p50 meas/target", "p95 meas/target", "over target",
               "mean chunks", "mean prompt tok", "mean spliced tok", "pred err p50", "pred err p95"]
    for c in columns:
        table.add_column(c, justify="right")
    for row in result["summary"]["targets"]:
        table.add_row(
            str(row["pass"]), f"{row['target_s']:g}", "yes" if row["feasible"] else f"no ({row['infeasible_requests']})",
            str(row["requests"]), f"{row['p50_ratio']:.2f}", f"{row['p95_ratio']:.2f}", f"{row['over_share'] * 100:.0f}%",
            f"{row['mean_chunks']:.1f}", f"{row['mean_prompt_tokens']:.0f}", f"{row['mean_spliced_tokens']:.0f}",
            f"{row['pred_err_p50'] * 100:.1f}%", f"{row['pred_err_p95'] * 100:.1f}%",
        )
    Console(highlight=False).print(table)
    if result["summary"].get("halves"):
        Console(highlight=False).print(halves_table(result["summary"]["halves"]))


def halves_table(halves: list[dict]) -> Table:
    """The busy and quiet halves of a ``--busy-first-half`` run, side by side."""
    table = Table(title="neighbour for the first half, quiet for the second", title_justify="left")
    for c in ("half", "requests", "p50 meas/target", "p95 meas/target", "mean chunks", "pred err p50"):
        table.add_column(c, justify="right")
    for h in halves:
        if not h["requests"]:
            table.add_row(h["half"], "0", "", "", "", "")
            continue
        table.add_row(h["half"], str(h["requests"]), f"{h['p50_ratio']:.2f}", f"{h['p95_ratio']:.2f}",
                      f"{h['mean_chunks']:.1f}", f"{h['pred_err_p50'] * 100:.1f}%")
    return table


@bench_app.command("chat")
def bench_chat(
    turns: int = typer.Option(10, "--turns", help="Questions per conversation."),
    sessions: int = typer.Option(3, "--sessions", help="Conversations."),
    interleave: bool = typer.Option(False, "--interleave", help="Take turns between conversations (A1 B1 C1 A2 ...)."),
    corpus: Path = typer.Option(DEFAULT_CHAT_CORPUS, "--corpus", help="Folder of documents (apt-get install python3.11-doc)."),
    include: List[str] = typer.Option(["library/*"], "--include", help="Only corpus files matching this glob (repeatable)."),
    conversations: Optional[Path] = typer.Option(None, "--conversations", help="JSON of follow-up questions (default: the bundled Python-docs set)."),
    index: Optional[Path] = typer.Option(None, "--index", help="Index for the corpus (default: a cache folder per corpus)."),
    max_tokens: int = typer.Option(64, "--max-tokens", help="Answer tokens per turn."),
    target_ttft: Optional[float] = typer.Option(None, "--target-ttft", help="rag-budget's TTFT target (default: 2.0)."),
    history: str = typer.Option("prompted", "--history", help="How recent turns are replayed: prompted (with their passages) or qa."),
    back_to_back: bool = typer.Option(False, "--back-to-back", help="Ask each question as soon as the answer before it is out, without waiting for background work."),
    naive: bool = typer.Option(True, "--naive/--no-naive", help="Also answer with the naive pipeline, request after request."),
    model: Optional[Path] = MODEL_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the bench object as JSON."),
) -> None:
    """Follow-up conversations answered by rag-budget and by a naive pipeline
    (full history, k=8, chunks first) side by side: tokens and TTFT per turn."""
    from ..bench.chat import run

    with user_errors():
        if history not in ("prompted", "qa"):
            raise RagError(f"--history must be prompted or qa, not {history!r}")
        result = run(harness(), corpus, include, conversations=conversations, index=index, model=model, turns=turns,
                     sessions=sessions, interleave=interleave, max_tokens=max_tokens, target_ttft=target_ttft,
                     history=history, back_to_back=back_to_back, naive=naive)
    if as_json:
        echo_json(result)
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
    if summary["naive_cached_ratio"] is not None:
        console.print(
            f"cached/prompt from turn 2: ours {summary['ours_cached_ratio']:.2f}, naive {summary['naive_cached_ratio']:.2f}; "
            f"TTFT naive/ours: last turn {summary['ttft_ratio_last_turn']:.1f}x, overall {summary['ttft_ratio_overall']:.1f}x"
        )
    console.print(f"ours: {summary['ours_turns_over_1_1_target']} of {turns * sessions} turns over 1.1 x the target; "
                  f"p95 TTFT/target {summary['ours_p95_ttft_over_target'] or 0:.2f} (engine), "
                  f"{summary['ours_p95_seen_over_target'] or 0:.2f} (seen: from the call to the first text; "
                  f"{summary['ours_turns_seen_over_1_1_target']} turns over 1.1 x)")
    console.print(
        f"summaries: {summary['summaries']} ({', '.join(summary['summary_methods']) or 'none'}), "
        f"{summary['summary_s_total']:.1f} s writing them and {summary['background_prefill_s_total']:.1f} s prefilling "
        f"the new prefix, in the background between turns"
    )


@bench_app.command("peer")
def bench_peer(
    corpus: Path = typer.Option(DEFAULT_CHAT_CORPUS, "--corpus", help="Folder of documents (apt-get install python3.11-doc)."),
    include: List[str] = typer.Option(["library/*"], "--include", help="Only corpus files matching this glob (repeatable)."),
    questions: Optional[Path] = typer.Option(None, "--questions", help="JSON lines of {question, gold} (default: the bundled Python-docs dev set)."),
    limit: int = typer.Option(0, "--limit", help="Only the first N questions (0: all)."),
    ks: str = typer.Option("4,20", "--k", help="Comma-separated k of the LangChain runs."),
    max_tokens: int = typer.Option(32, "--max-tokens", help="Answer tokens per question."),
    target_ttft: Optional[float] = typer.Option(None, "--target-ttft", help="rag-budget's TTFT target (default: 2.0)."),
    reembed: bool = typer.Option(False, "--reembed", help="Embed the peer's documents through HuggingFaceEmbeddings (slow) instead of reading rag-budget's vectors."),
    index: Optional[Path] = typer.Option(None, "--index", help="Index for the corpus (default: a cache folder per corpus)."),
    model: Optional[Path] = MODEL_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the bench object as JSON."),
) -> None:
    """rag-budget against the classic LangChain RAG (FAISS, HuggingFaceEmbeddings, stuff prompt, ChatLlamaCpp)."""
    from ..bench.peer import run

    with user_errors():
        wanted = int_list(ks, "--k")
        if limit < 0:
            raise RagError("--limit must be 0 (all) or more")
        result = run(harness(), corpus, include, questions=questions, limit=limit, ks=wanted, max_tokens=max_tokens,
                     target_ttft=target_ttft, reembed=reembed, index=index, model=model)
    if as_json:
        echo_json(result)
        return
    summary = result["summary"]
    table = Table(title=f"rag bench peer ({result['config']['questions']} questions, {max_tokens} answer tokens)",
                  title_justify="left")
    for c in ["system", "median TTFT s", "p95 TTFT s", "median total s", "prompt tokens", "chunks", "prompt recall"]:
        table.add_column(c, justify="left" if c == "system" else "right")
    for row in summary["systems"]:
        table.add_row(row["name"], f"{row['median_ttft_s']:.2f}", f"{row['p95_ttft_s']:.2f}", f"{row['median_total_s']:.2f}",
                      str(row["prompt_tokens"]), f"{row['mean_chunks']:.1f}", f"{row['prompt_recall']:.2f}")
    console = Console(highlight=False)
    console.print(table)
    for key, value in summary.items():
        if "ttft_ratio" in key:
            console.print(f"{key.replace('_', ' ')}: {value:.2f}x")


@bench_app.command("serve")
def bench_serve(
    clients: Optional[str] = typer.Option(
        None, "--clients", help="Comma-separated numbers of concurrent clients (default 1,4,8); with --engines one "
                                "number (default 8)."),
    requests: int = typer.Option(24, "--requests", help="Requests per run (per client count and system)."),
    target_ttft: float = typer.Option(2.0, "--target-ttft", help="Every request's TTFT target in seconds."),
    max_tokens: int = typer.Option(32, "--max-tokens", help="Answer tokens per request."),
    slots: int = typer.Option(8, "--slots", help="Sequences the scheduling engine serves at once."),
    corpus: Path = typer.Option(DEFAULT_CHAT_CORPUS, "--corpus", help="Folder of documents (apt-get install python3.11-doc)."),
    include: List[str] = typer.Option(["library/*"], "--include", help="Only corpus files matching this glob (repeatable)."),
    index: Optional[Path] = typer.Option(None, "--index", help="Index for the corpus (default: a cache folder per corpus)."),
    model: Optional[Path] = MODEL_OPTION,
    only: List[str] = typer.Option([], "--system", help="Run only this set-up: scheduler or 'one at a time' (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print the bench object as JSON."),
    engines: Optional[int] = typer.Option(
        None, "--engines", help="Instead: N llama-server workers through vLLM's router, one run per router policy."),
    kill_one_at: Optional[int] = typer.Option(
        None, "--kill-one-at", help="With --engines: kill one worker (SIGKILL) just before the first client asks this turn."),
    turns: int = typer.Option(10, "--turns", help="With --engines: turns of each client's conversation."),
    policies: str = typer.Option("cache_aware,round_robin", "--policies", help="With --engines: vllm-router policies."),
    warm_store: bool = typer.Option(False, "--warm-store", help="With passage KV reuse on: answer the questions once and let each engine store their passages before the runs."),
    fresh: bool = typer.Option(False, "--fresh", help="Start each server cold (nothing prepared) and send the first run as soon as /healthz says ok."),
    upload: Optional[Path] = typer.Option(None, "--upload", help="A document to upload to each server while its first run is answered."),
    upload_at: str = typer.Option("during", "--upload-at", help="With --upload: 'during' the first run, or just 'before' it (answered, then the documents listed, as the page does)."),
    limits: str = typer.Option("off", "--limits", help="The servers' caller limits: 'off', or 'default' (as `rag serve` has them; every client comes from 127.0.0.1)."),
    collections: int = typer.Option(0, "--collections", help="A team: the corpus in 1 or 2 collections, each with a key that reads it alone, the clients taking them in turn."),
    url: Optional[str] = typer.Option(None, "--url", help="Instead: the server already running at this URL (a `rag serve` that asks no key), measured as it is: nothing indexed or started."),
) -> None:
    """Concurrent clients against real servers on 127.0.0.1: the deadline
    scheduler over several sequences, and one request at a time as before,
    side by side: TTFT percentiles, goodput, served and degraded shares,
    decode tok/s and the decode batch size. With --engines N: one service
    through vLLM's router over N llama-server workers, each router policy in
    turn, concurrent clients each in a conversation: served and lost, TTFT
    against the target, cached share, prediction error, requests per worker.
    With --url: the same clients against a server already running, as it is."""
    if engines is not None:
        from ..bench.pool import run as run_pool

        from .bench_pool import print_pool

        with user_errors():
            counts = int_list(clients or "8", "--clients")
            if len(counts) != 1:
                raise RagError("--clients: one number with --engines")
            result = run_pool(harness(), corpus, include, engines=engines,
                              policies=[x.strip() for x in policies.split(",") if x.strip()], clients=counts[0],
                              turns=turns, kill_at=kill_one_at, target_ttft=target_ttft, max_tokens=max_tokens,
                              index=index, model=model)
        echo_json(result) if as_json else print_pool(result)
        return
    from ..bench.serve import run

    with user_errors():
        levels = int_list(clients or "1,4,8", "--clients")
        result = run(harness(), corpus, include, clients=levels, requests=requests, target_ttft=target_ttft,
                     max_tokens=max_tokens, slots=slots, index=index, model=model, only=only,
                     warm_passages=warm_store, fresh=fresh, upload=upload, upload_at=upload_at, limits=limits,
                     collections=collections, url=url)
    if as_json:
        echo_json(result)
        return
    _print_serve(result, requests, target_ttft)


def _share_pair(low: float | None, high: float | None) -> str:
    """Two shares as percentages, "-" where one is missing."""
    if low is None or high is None:
        return "-"
    return f"{low * 100:.0f}/{high * 100:.0f}%"


def _print_serve(result: dict, requests: int, target_ttft: float) -> None:
    table = Table(title=f"rag bench serve ({requests} requests per run, target {target_ttft:g} s)", title_justify="left")
    for column in ("clients", "system", "p50 TTFT s", "p95 TTFT s", "p95/target", "goodput/s", "served", "degraded",
                   "429s", "errors", "decode tok/s", "decode batch", "mean chunks", "pred err p50/p95"):
        table.add_column(column, justify="right")
    for r in result["summary"]["runs"]:
        p95 = r["p95_ttft_s"] or 0
        table.add_row(str(r["clients"]), r["system"], f"{r['p50_ttft_s'] or 0:.2f}", f"{p95:.2f}",
                      f"{p95 / target_ttft:.2f}", f"{r['goodput_rps']:.2f}", f"{r['served_share'] * 100:.0f}%",
                      f"{(r['degraded_share'] or 0) * 100:.0f}%", str(r["rejected_429"]), str(r["errors"]),
                      f"{r['tok_s']:.1f}", f"{r['mean_decode_batch'] or 0:.2f}", f"{r['mean_chunks'] or 0:.1f}",
                      _share_pair(r.get("pred_err_p50"), r.get("pred_err_p95")))
    console = Console(highlight=False)
    console.print(table)
    for name, seconds in result["config"]["fresh_ready_s"].items():
        console.print(f"{name}: started cold, /healthz said ok after {seconds:.1f} s")
    when = "before" if result["config"].get("upload_at") == "before" else "during"
    for r in result["summary"]["runs"]:
        if "upload_s" in r:
            console.print(f"{r['system']}: upload of {result['config']['upload']} answered "
                          f"{r['upload_status']} in {r['upload_s']:.1f} s {when} the run")
        if r.get("refused"):
            kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(r["refused"].items()))
            console.print(f"{r['clients']} clients, {r['system']}: 429s by type: {kinds}")
    if result["config"].get("url"):
        console.print(f"caller limits: those of the server at {result['config']['url']}")
    else:
        console.print(f"caller limits: {result['config'].get('limits') or 'off'} (all clients from 127.0.0.1)")
    bound = result["summary"]["bound"]
    if bound:
        console.print(f"physical bound: {bound['prefill_tok_s']:g} prefill tok/s x {target_ttft:g} s / "
                      f"{bound['bare_new_tokens']} new tokens of a question without passages = "
                      f"{bound['requests_per_window']:g} requests per {target_ttft:g} s window")

"""The benchmarks of single parts: ``rag bench retrieval`` (search
quality), ``search`` (FAISS index types) and ``engine`` (the engine alone);
each parses its options, runs ``rag.bench.NAME.run`` and prints its
figures; likewise ``faults``.

Does not: build pipelines or engines, or measure anything itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from ..errors import RagError
from ..paths import is_database_url
from .bench_harness import harness
from .common import MODEL_OPTION, bench_app, echo_json, int_list, user_errors


@bench_app.command("retrieval")
def bench_retrieval(
    corpus: Path = typer.Option(..., "--corpus", help="Folder of documents (ingested incrementally into --index)."),
    questions: Path = typer.Option(..., "--questions", help="JSON lines of {question, gold}."),
    ks: str = typer.Option("1,3,5,10", "--k", help="Comma-separated k for recall@k."),
    rrf_ks: str = typer.Option("5,20,60", "--rrf-k", help="Comma-separated RRF constants of the hybrid rows."),
    index: Optional[Path] = typer.Option(None, "--index", help="Index for the corpus (default: a cache folder per corpus)."),
    include: List[str] = typer.Option([], "--include", help="Only corpus files matching this glob (repeatable)."),
    store: Optional[str] = typer.Option(
        None, "--store", help="Also run every system on a copy of the index in this postgresql:// database (with "
                              "pgvector; its index is replaced), side by side."),
    as_json: bool = typer.Option(False, "--json", help="Print the bench object as JSON."),
) -> None:
    """recall@k and MRR of dense, BM25 and hybrid retrieval on the same questions."""
    from ..bench.retrieval import run

    with user_errors():
        wanted, fusion = int_list(ks, "--k"), int_list(rrf_ks, "--rrf-k")
        if store is not None and not is_database_url(store):
            raise RagError(f"--store {store!r}: give a postgresql:// URL")
        result = run(harness(), corpus, questions, wanted, rrf_ks=fusion, index=index, include=include, store=store)
    if as_json:
        echo_json(result)
        return
    summary = result["summary"]
    console = Console(highlight=False)
    stores = [("FAISS + BM25 arrays, ", summary)] if "pgvector" not in summary else \
        [("FAISS + BM25 arrays, ", summary), (f"PostgreSQL + pgvector, {summary['pgvector']['vector_search']}; ",
                                              summary["pgvector"])]
    for label, figures in stores:
        table = Table(
            title=f"rag bench retrieval ({label if len(stores) > 1 else ''}{result['config']['questions']} questions, "
                  f"{result['config']['chunks']} chunks; query embedding {summary['median_embed_ms']:.0f} ms median, "
                  "not in the search columns)",
            title_justify="left",
        )
        table.add_column("system")
        metric_keys = [f"recall@{k}" for k in wanted] + ["mrr"]
        for c in metric_keys + ["search ms p50", "search ms p95"]:
            table.add_column(c, justify="right")
        for row in figures["systems"]:
            table.add_row(row["name"], *[f"{row[k]:.3f}" for k in metric_keys],
                          f"{row['median_search_ms']:.1f}", f"{row['p95_search_ms']:.1f}")
        console.print(table)
    # On its own line so a narrow terminal that wraps the table cannot hide it.
    console.print(f"default retrieval: {summary['default']}", soft_wrap=True)


@bench_app.command("engine")
def bench_engine_cmd(
    sizes: str = typer.Option("256,1024,2048", "--sizes", help="Comma-separated prompt sizes in tokens."),
    sequences: Optional[str] = typer.Option(
        None, "--sequences", help="Instead: aggregate decode tok/s with this many requests at once, e.g. 1,4,16."),
    repeats: int = typer.Option(3, "--repeats", min=1, help="Requests of each size and kind."),
    max_tokens: int = typer.Option(32, "--max-tokens", min=1, help="Answer tokens per request."),
    safe_beside: bool = typer.Option(
        True, "--safe-beside/--no-safe-beside",
        help="In process: also run without llama.cpp's extra buffer types (the self-check's fallback), side by side."),
    model: Optional[Path] = MODEL_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the bench object as JSON."),
) -> None:
    """The engine alone (in process, or the server of --engine-url): TTFT,
    prefill and decode tok/s and cached tokens, cold and with a cached prefix;
    in process, llama.cpp's default configuration and its safe one (no extra
    buffer types) side by side where both run."""
    from ..bench.engine import run

    with user_errors():
        wanted = int_list(sizes, "--sizes")
        counts = int_list(sequences, "--sequences") if sequences is not None else None
        result = run(harness(), wanted, sequences=counts, repeats=repeats, max_tokens=max_tokens,
                     safe_beside=safe_beside, model=model)
    if as_json:
        echo_json(result)
    elif sequences is not None:
        _print_sequences(result)
    else:
        _print_engine(result, repeats)


def _print_engine(result: dict, repeats: int) -> None:
    table = Table(title=f"rag bench engine ({result['config']['engine']}, {repeats} requests each, medians)",
                  title_justify="left")
    columns = ("configuration",) if "configurations" in result["summary"] else ()
    for c in (*columns, "size", "kind", "prompt tok", "cached tok", "TTFT s", "prefill tok/s", "decode tok/s",
              "total s"):
        table.add_column(c, justify="left" if c in ("kind", "configuration") else "right")

    def cell(value) -> str:
        return "-" if value is None else f"{value:g}"

    for row in result["summary"]["systems"]:
        table.add_row(*([row["configuration"]] if columns else []), str(row["prompt_size"]), row["kind"],
                      cell(row["prompt_tokens"]), cell(row["cached_tokens"]), cell(row["median_ttft_s"]),
                      cell(row["prefill_tok_s"]), cell(row["decode_tok_s"]), cell(row["median_total_s"]))
    console = Console(highlight=False)
    console.print(table)
    for name, how in result["summary"].get("configurations", {}).items():
        if not how["ran"]:
            console.print(f"{name} configuration not run: {how['why']}", soft_wrap=True, markup=False)
    for r in result["summary"].get("safe_over_default", []):
        console.print(f"safe over default, {r['prompt_size']} tokens {r['kind']}: prefill {cell(r['prefill'])}x, "
                      f"decode {cell(r['decode'])}x")


@bench_app.command("search")
def bench_search(
    vectors: str = typer.Option("10000,100000,1000000", "--vectors", help="Comma-separated index sizes."),
    dim: int = typer.Option(384, "--dim", help="Vector dimension (default: all-MiniLM-L6-v2's)."),
    types: str = typer.Option("flat,ivf,hnsw", "--types", help="Index types to measure: flat, ivf, hnsw."),
    hnsw_max: int = typer.Option(200_000, "--hnsw-max", help="Largest size to build HNSW for (slow to build on few cores)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the synthetic vectors."),
    store: Optional[str] = typer.Option(
        None, "--store", help="Also measure the PostgreSQL index store in this postgresql:// database (with "
                              "pgvector; its index is replaced): exact and HNSW."),
    as_json: bool = typer.Option(False, "--json", help="Print the bench object as JSON."),
) -> None:
    """p50/p95/p99 search latency and recall@10 against exact search, on synthetic vectors."""
    from ..bench.search import APPROXIMATE_FROM, run

    with user_errors():
        sizes = int_list(vectors, "--vectors")
        kinds = [t.strip() for t in types.split(",") if t.strip()]
        unknown = sorted(set(kinds) - {"flat", "ivf", "hnsw"})
        if unknown or not kinds:
            raise RagError(f"--types {types!r}: use flat, ivf and/or hnsw")
        if dim < 1:
            raise RagError("--dim must be at least 1")
        if store is not None and not is_database_url(store):
            raise RagError(f"--store {store!r}: give a postgresql:// URL")
        result = run(harness(), sizes, dim, kinds=kinds, hnsw_max=hnsw_max, seed=seed, store=store)
    if as_json:
        echo_json(result)
        return
    table = Table(title=f"rag bench search (dim {dim}, {result['config']['queries']} queries one at a time, "
                        f"{result['config']['threads']} threads)", title_justify="left")
    for c in ["vectors", "index", "params", "build s", "p50 ms", "p95 ms", "p99 ms", "recall@10", "MB"]:
        table.add_column(c, justify="left" if c in ("index", "params") else "right")
    for r in result["rows"]:
        if "skipped" in r:
            table.add_row(f"{r['vectors']:,}", r["index"], r["params"], "-", "-", "-", "-", "-", "-")
            continue
        table.add_row(f"{r['vectors']:,}", r["index"], r["params"], f"{r['build_s']:.1f}", f"{r['p50_ms']:.2f}",
                      f"{r['p95_ms']:.2f}", f"{r['p99_ms']:.2f}", f"{r['recall@10']:.3f}", f"{r['bytes'] / 1e6:.0f}")
    console = Console(highlight=False)
    console.print(table)
    suggested = result["summary"]["suggested_approximate_from"]
    if suggested:
        console.print(f"exact search reaches {result['summary']['fast_enough_ms']:g} ms p50 at about {suggested:,} vectors; "
                      f"the store switches to IVF from {APPROXIMATE_FROM:,}")


def _print_sequences(result: dict) -> None:
    table = Table(title=f"rag bench engine --sequences ({result['config']['engine']}, "
                        f"{result['config']['max_tokens']} tokens each)", title_justify="left")
    for c in ("sequences", "decode tokens", "wall s", "aggregate decode tok/s", "decode batch"):
        table.add_column(c, justify="right")
    for r in result["rows"]:
        table.add_row(str(r["sequences"]), str(r["decode_tokens"]), f"{r['wall_s']:.2f}",
                      f"{r['aggregate_decode_tok_s']:.1f}", f"{r['mean_decode_batch'] or 0:.2f}")
    Console(highlight=False).print(table)


@bench_app.command("faults")
def bench_faults_cmd(
    steps: int = typer.Option(2000, "--steps", min=1, help="Engine steps to soak for (at least)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the faults and of the requests."),
    bound_s: float = typer.Option(120.0, "--bound", help="Seconds within which every request must end."),
    model: Optional[Path] = MODEL_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the bench object as JSON."),
) -> None:
    """The in-process engine under injected faults (decode, state save and
    load, snapshot and passage reads and writes, cancels, disconnects): does
    every request end, told, with no sequence or KV cell leaked?"""
    from ..bench.faults import run

    with user_errors():
        result = run(harness(), steps=steps, seed=seed, bound_s=bound_s, model=model)
    if as_json:
        echo_json(result)
        return
    summary = result["summary"]
    table = Table(title=f"rag bench faults ({summary['steps']} steps, {summary['requests']} requests, seed {seed})",
                  title_justify="left")
    for c in ("op", "calls", "faults injected"):
        table.add_column(c, justify="left" if c == "op" else "right")
    for row in result["rows"]:
        table.add_row(row["op"], str(row["calls"]), str(row["injected"]))
    console = Console(highlight=False)
    console.print(table)
    console.print(f"ended: {summary['ended']}; checks held: {summary['checks']}", soft_wrap=True)
    console.print("every invariant held" if summary["held"] else "BROKEN: " + "; ".join(summary["broken"]),
                  soft_wrap=True)
    if not summary["held"]:
        raise typer.Exit(1)

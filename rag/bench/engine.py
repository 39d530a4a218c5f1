"""``rag bench engine``: the engine alone, on prompts of given sizes.

For each size: a cold prompt (a new opening, so nothing past the template's
first tokens is cached), then the same prompt with another question after it
(the long prefix cached). Every figure is the engine's own, through the
``Backend`` protocol, so the in-process llama.cpp backend and a remote
server run the same requests and can be put side by side.

:func:`run` is the whole of ``rag bench engine``: the engine opened (in
process, or the server of ``--engine-url``), measured, and the in-process
one also in llama.cpp's safe configuration where asked.

Does not: retrieve or budget; the pipeline's benches do that.
"""

from __future__ import annotations

from pathlib import Path
from statistics import median
from typing import Callable, Optional, Sequence

from engine.backend import Backend, Message, StepCounters, Timings
from prompt_budget.layout import system_message

from ..errors import RagError, engine_errors
from . import setup
from .setup import Harness


def _text_of(backend: Backend, source: str, n_tokens: int) -> str:
    """About ``n_tokens`` tokens of ``source`` (repeated if short)."""
    tokens = backend.tokenize(source)
    while len(tokens) < n_tokens:
        source += "\n\n" + source
        tokens = backend.tokenize(source)
    # Cut on a character boundary near the token count.
    return source[: int(len(source) * n_tokens / len(tokens))]


def _row(size: int, kind: str, repeat: int, t: Timings) -> dict[str, object]:
    return {
        "prompt_size": size, "kind": kind, "repeat": repeat, "prompt_tokens": t.prompt_tokens,
        "cached_tokens": t.cached_tokens, "prefill_tokens": t.prefill_tokens, "ttft_s": round(t.ttft_s, 4),
        "prefill_s": round(t.prefill_s, 4),
        "prefill_tok_s": round(t.prefill_tokens / t.prefill_s, 1) if t.prefill_s > 0 else None,
        "decode_tokens": t.decode_tokens,
        "decode_tok_s": round(t.decode_tokens / t.decode_s, 1) if t.decode_s > 0 else None,
        "total_s": round(t.total_s, 4),
    }


def bench_engine(
    backend: Backend,
    document: str,
    sizes: Sequence[int],
    *,
    repeats: int = 3,
    max_tokens: int = 32,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, object]:
    """Cold and prefix-cached requests of each size in ``sizes`` (tokens of
    ``document``), ``repeats`` times; rows per request, medians per size
    and kind."""
    rows: list[dict[str, object]] = []
    total, done = len(sizes) * repeats * 2, 0
    system = system_message()
    for size in sizes:
        body = _text_of(backend, document, size)
        for repeat in range(repeats):
            # A new opening each time: the engine cannot have this prompt cached.
            opening = f"Request {size}-{repeat}. Documents:\n\n{body}"
            cold = [system, Message("user", f"{opening}\n\nQuestion: what is this about?")]
            warm = [system, Message("user", f"{opening}\n\nQuestion: what does it say first?")]
            for kind, messages in (("cold", cold), ("cached prefix", warm)):
                prompt = backend.tokenize(backend.render(messages))
                if len(prompt) + max_tokens > backend.n_ctx:
                    raise RagError(f"--sizes: a {size}-token prompt does not fit the context of {backend.n_ctx}")
                _, timings = backend.generate(prompt, max_tokens=max_tokens).result()
                rows.append(_row(size, kind, repeat, timings))
                done += 1
                if progress:
                    progress(done, total)
    summary = []
    for size in sizes:
        for kind in ("cold", "cached prefix"):
            mine = [r for r in rows if r["prompt_size"] == size and r["kind"] == kind]

            def mid(key: str):
                values = [r[key] for r in mine if r[key] is not None]
                return round(median(values), 4) if values else None

            summary.append({"prompt_size": size, "kind": kind, "prompt_tokens": mid("prompt_tokens"),
                            "cached_tokens": mid("cached_tokens"), "median_ttft_s": mid("ttft_s"),
                            "prefill_tok_s": mid("prefill_tok_s"), "decode_tok_s": mid("decode_tok_s"),
                            "median_total_s": mid("total_s")})
    return {
        "bench": "engine",
        "config": {"engine": backend.name, "n_ctx": backend.n_ctx, "sizes": list(sizes), "repeats": repeats,
                   "max_tokens": max_tokens},
        "rows": rows,
        "summary": {"systems": summary},
    }


def bench_configurations(
    open_engine: Callable[[bool | None], Backend],
    document: str,
    sizes: Sequence[int],
    *,
    repeats: int = 3,
    max_tokens: int = 32,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, object]:
    """:func:`bench_engine` on the in-process engine as its self-check
    configured it (``open_engine(None)``), and, where that is llama.cpp's
    default (extra buffer types: weight repacking, AMX), the same without
    them (``open_engine(False)``), one engine at a time (each closed before
    the next opens: an idle second engine in the process halved the other's
    decode speed), with the safe configuration's prefill and decode speeds
    over the default's. Where the default died in the check it is not run
    (it would take this process with it) and the summary says why."""
    def measured(extra_bufts: bool | None) -> tuple[dict, dict]:
        backend = open_engine(extra_bufts)
        try:
            info = backend.describe()
            result = bench_engine(backend, document, sizes, repeats=repeats, max_tokens=max_tokens, progress=progress)
        finally:
            backend.close()
        _label(result, "default" if info["extra_buffer_types"] else "safe")
        return result, info

    result, info = measured(None)
    first = "default" if info["extra_buffer_types"] else "safe"
    configurations: dict[str, dict[str, object]] = {first: {"ran": True}}
    if first == "default":
        other, _ = measured(False)
        result["rows"].extend(other["rows"])
        result["summary"]["systems"].extend(other["summary"]["systems"])
        configurations["safe"] = {"ran": True}
    else:
        configurations["default"] = {"ran": False, "why": info["extra_buffer_types_why"]}
    result["config"]["configurations"] = list(configurations)
    result["summary"]["configurations"] = configurations
    result["summary"]["safe_over_default"] = _safe_over_default(result["summary"]["systems"])
    return result


def _label(result: dict, configuration: str) -> None:
    for row in [*result["rows"], *result["summary"]["systems"]]:
        row["configuration"] = configuration


def _safe_over_default(systems: list[dict]) -> list[dict[str, object]]:
    """Per size and kind, the safe configuration's median prefill and decode
    tok/s over the default's (where both ran)."""
    by = {(r["configuration"], r["prompt_size"], r["kind"]): r for r in systems}
    ratios = []
    for (configuration, size, kind), safe in by.items():
        default = by.get(("default", size, kind))
        if configuration != "safe" or default is None:
            continue

        def ratio(key: str):
            return round(safe[key] / default[key], 3) if safe[key] and default[key] else None

        ratios.append({"prompt_size": size, "kind": kind, "prefill": ratio("prefill_tok_s"),
                       "decode": ratio("decode_tok_s")})
    return ratios


def bench_sequences(backend: Backend, counts: Sequence[int], *, max_tokens: int = 64,
                    progress: Callable[[int, int], None] | None = None) -> dict[str, object]:
    """Aggregate decode tokens per second with 1, 4, 16... requests decoding
    at once (each its own short question, started together), and the mean
    batch size of the engine's decode steps where it reports it."""
    import threading
    import time

    stats = backend.engine_stats if isinstance(backend, StepCounters) else None
    rows: list[dict[str, object]] = []
    for done, n in enumerate(counts, start=1):
        results: list[Timings] = []
        lock = threading.Lock()

        def ask(i: int) -> None:
            prompt = backend.render([system_message(), Message("user", f"Question {i}: tell me about the number {i}.")])
            _, t = backend.generate(prompt, max_tokens=max_tokens).result()
            with lock:
                results.append(t)

        before = stats() if stats else None
        started = time.perf_counter()
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - started
        after = stats() if stats else None
        steps = after["decode_steps"] - before["decode_steps"] if before else 0
        decoded = sum(t.decode_tokens for t in results)
        rows.append({"sequences": n, "decode_tokens": decoded, "wall_s": round(wall, 3),
                     "aggregate_decode_tok_s": round(decoded / wall, 1),
                     "mean_decode_batch": round((after["decode_tokens"] - before["decode_tokens"]) / steps, 2)
                     if steps else None})
        if progress:
            progress(done, len(counts))
    return {"bench": "engine-sequences", "config": {"sequences": list(counts), "max_tokens": max_tokens,
                                                     "engine": backend.name},
            "rows": rows, "summary": {"aggregate_decode_tok_s": {r["sequences"]: r["aggregate_decode_tok_s"]
                                                                 for r in rows}}}


def run(h: Harness, sizes: Sequence[int], *, sequences: Optional[Sequence[int]] = None, repeats: int = 3,
        max_tokens: int = 32, safe_beside: bool = True, model: Optional[Path] = None) -> dict[str, object]:
    """``rag bench engine``: prompts of ``sizes`` tokens of the bundled
    sample documents, cold and cached (:func:`bench_engine`); in process and
    with ``safe_beside``, llama.cpp's default and safe configurations side
    by side (:func:`bench_configurations`); with ``sequences``, aggregate
    decode tok/s at each count instead (:func:`bench_sequences`)."""
    from .. import paths

    s = h.settings(model=model)
    document = "\n\n".join(p.read_text(encoding="utf-8") for p in sorted(paths.sample_data_dir().glob("*.md")))
    with h.counting("requests") as update, engine_errors():
        if sequences is not None:
            return bench_sequences(h.open(s).backend, sequences, max_tokens=max_tokens, progress=update)
        if safe_beside and not s.engine.engine_url:
            return bench_configurations(lambda extra: in_process(s, extra), document, sizes, repeats=repeats,
                                        max_tokens=max_tokens, progress=update)
        return bench_engine(h.open(s).backend, document, sizes, repeats=repeats, max_tokens=max_tokens,
                            progress=update)


def in_process(s, extra_bufts: bool | None) -> Backend:
    """The in-process engine of settings ``s``, with llama.cpp's extra buffer
    types as its self-check decides (None) or as given, and without on-disk
    stores (a bench must not share them)."""
    from engine.opening import open_backend

    return open_backend(s.engine.changed(snapshot_disk_bytes=0), model=s.model, snapshot_dir=None,
                        check_dir=s.engine_check_folder, extra_bufts=extra_bufts)


def main() -> None:
    """``python -m rag.bench.engine``: ``rag bench engine`` on its own."""
    setup.command_alone("engine")


if __name__ == "__main__":
    main()

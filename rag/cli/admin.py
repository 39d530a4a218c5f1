"""``rag calibrate``, ``rag serve`` and ``rag doctor``: measuring this
machine, serving over HTTP, and saying what is installed and where.

Does not: measure or serve by itself (the pipeline and the service do).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from ..errors import RagError
from .common import INDEX_OPTION, MODEL_OPTION, app, counting, echo_json, command_pipeline, settings, user_errors


@app.command()
def calibrate(
    model: Optional[Path] = MODEL_OPTION,
    quick: bool = typer.Option(False, "--quick", help="A few short prompts only (seconds)."),
    as_json: bool = typer.Option(False, "--json", help="Print the profile as JSON."),
) -> None:
    """Measure this machine's prefill rates and fit the TTFT cost model."""
    with user_errors():
        p = command_pipeline(settings(model=model))
        with counting("calibrating", transient=as_json) as update:
            profile = p.calibrate(quick=quick, progress=update)
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
    console.print(f"profile saved in {p.costs.profile_dir}")


@app.command()
def serve(
    host: Optional[str] = typer.Option(None, "--host", help="Address to bind (default: $RAG_SERVE_HOST, else 127.0.0.1)."),
    port: Optional[int] = typer.Option(None, "--port", help="Port (default: $RAG_SERVE_PORT, else 8000)."),
    index: Optional[str] = INDEX_OPTION,
    model: Optional[Path] = MODEL_OPTION,
    watch: List[str] = typer.Option(
        [], "--watch", metavar="DIR[=COLLECTION]",
        help="Keep this folder indexed while serving, in COLLECTION (default: the default collection; "
             "repeatable; default: $RAG_SERVE_WATCH)."),
) -> None:
    """Serve document QA over HTTP: the web page at /, /v1/ask, /v1/chat/completions
    (OpenAI-compatible), /v1/documents, /v1/sessions, /healthz, /metrics, /docs. Starts
    without an index (the first upload makes one). API keys from $RAG_SERVE_API_KEYS."""
    from ..service import ServiceSettings, serve as run_service

    with user_errors():
        overrides = {k: v for k, v in {"host": host, "port": port, "watch": watch or None}.items() if v is not None}
        try:
            service_settings = ServiceSettings(**overrides)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise RagError(f"serve settings: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
        service_settings.check()
        run_service(command_pipeline(settings(index=index, model=model)), service_settings)


DOCTOR_ENGINE_KEYS = ("engine", "url", "router", "workers", "build", "gpu_offload_supported", "device", "gpus", "n_gpu_layers",
                      "offloaded_layers", "flash_attn", "kv_type", "kv_cache_bytes", "model_path", "model_bytes",
                      "n_ctx", "n_threads", "n_batch", "built_cpu_features", "extra_buffer_types",
                      "extra_buffer_types_why")


@app.command()
def doctor(
    index: Optional[str] = INDEX_OPTION,
    model: Optional[Path] = MODEL_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Versions, llama.cpp build, device, model, context, threads and index statistics."""
    with user_errors():
        report = command_pipeline(settings(index=index, model=model)).doctor()
    if as_json:
        echo_json(report)
        return
    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    table.add_row("python", str(report["python"]))
    for name, version in report["versions"].items():
        table.add_row(name, version or "[red]not installed[/]")
    table.add_row("retrieval", str(report["retrieval"]))
    engine = report["engine"]
    for key in DOCTOR_ENGINE_KEYS:
        if engine.get(key) is None:  # not this engine's to report (a server's model size)
            continue
        value = engine[key]
        if key in ("model_bytes", "kv_cache_bytes") and isinstance(value, int):
            value = f"{value / 1e6:.1f} MB"
        elif key == "workers":
            value = ", ".join(value)
        elif key == "gpus":
            value = "; ".join(f"{g['name']}, {g['free_bytes'] / 2**30:.1f} of {g['total_bytes'] / 2**30:.1f} GiB free"
                              for g in value) or "none found (no nvidia-smi)"
        table.add_row(key, str(value))
    for key, value in report["passages"].items():
        table.add_row(key if key.startswith("splic") else f"passages.{key.removeprefix('passage_')}", str(value))
    for key, value in report["index"].items():
        table.add_row(f"index.{key}", str(value))
    Console(highlight=False, soft_wrap=False).print(table)

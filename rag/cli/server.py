"""``rag server status``, ``rag server start`` and ``rag server stop``: the
resident servers that ``rag ask``, ``chat`` and ``search`` reach (see
``rag.resident``), one per set-up.

Does not: serve or answer (``rag.resident.server`` does).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from .common import INDEX_OPTION, MODEL_OPTION, app, echo_json, err, note, settings, user_errors

server_app = typer.Typer(
    help="The resident server that rag ask, chat and search reach over a Unix socket (one per index, model and "
         "engine options; it stops after $RAG_SERVER_IDLE_S seconds idle, default 900).",
    no_args_is_help=True)
app.add_typer(server_app, name="server")


@server_app.command()
def status(
    index: Optional[str] = INDEX_OPTION,
    model: Optional[Path] = MODEL_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print every server's status as JSON."),
) -> None:
    """Every resident server running, the one these options reach marked."""
    from ..resident.address import Address
    from ..resident.lifecycle import servers

    with user_errors():
        s = settings(index=index, model=model)
        mine, found = Address.of(s).key, servers(s)
    if as_json:
        echo_json({"runtime_dir": str(s.runtime_folder), "key": mine, "servers": found})
        return
    console = Console(highlight=False)
    if not found:
        console.print(f"no rag server running in {s.runtime_folder}; the next rag ask starts one")
    for info in found:
        console.print(describe(info, mine), soft_wrap=True)


def describe(info: dict, mine: str) -> str:
    """One server's status in a few lines."""
    this = " (these options)" if info["key"] == mine else ""
    if not info.get("answering"):
        return f"rag server {info['key']}{this}: pid {info['pid']}, starting or not answering; socket {info['socket']}"
    where = "the sample corpus" if info["sample"] else info["index"]
    lines = [
        f"rag server {info['key']}{this}: pid {info['pid']}, up {_duration(info['uptime_s'])}, "
        f"{info['requests']} requests, {info['in_flight']} in progress, idle {_duration(info['idle_s'])} "
        f"(stops after {_duration(info['idle_timeout_s'])})",
        f"  index {where}; model {info['model'] or 'bundled SmolLM2-135M-Instruct'}; engine {info['engine']}",
        f"  socket {info['socket']}; log {info['log']}",
    ]
    lines += [f"  note: {n}" for n in info.get("notes", [])]
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    """``75 -> "1 min 15 s"``; ``3700 -> "1 h 1 min"``."""
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


@server_app.command()
def start(index: Optional[str] = INDEX_OPTION, model: Optional[Path] = MODEL_OPTION) -> None:
    """Start the server these options reach, in the background, unless it runs."""
    from ..resident.client import ResidentClient

    with user_errors():
        began = time.perf_counter()
        client = ResidentClient.connect(settings(index=index, model=model), notice=note)
    err().print(f"rag server {client.address.key} answering: pid {client.server_pid} "
                f"({time.perf_counter() - began:.1f} s); socket {client.address.socket}", soft_wrap=True)


@server_app.command()
def stop(
    index: Optional[str] = INDEX_OPTION,
    model: Optional[Path] = MODEL_OPTION,
    every: bool = typer.Option(False, "--all", help="Stop every resident server of this user."),
) -> None:
    """Stop the server these options reach (--all: every one), once its
    answers in progress are finished."""
    from ..resident.address import Address
    from ..resident.lifecycle import stop as stop_server

    with user_errors():
        s = settings(index=index, model=model)
        stopped = [(a.key, stop_server(a)) for a in (Address.every(s) if every else [Address.of(s)])]
    stopped = [(key, pid) for key, pid in stopped if pid is not None]
    for key, pid in stopped:
        err().print(f"stopped rag server {key} (pid {pid})")
    if not stopped:
        err().print("no rag server was running" + ("" if every else " for these options"))

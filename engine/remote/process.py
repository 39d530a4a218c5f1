"""Processes that serve HTTP on 127.0.0.1 for this project: a free port,
a log of their own, waiting until they answer, how one ended, and stopping
one. Shared by vLLM's router as rag starts it (``router``) and the
llama-server the tests and benches start (``llama_server``).

Does not: start anything itself.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def temporary_log(prefix: str) -> Path:
    """A new empty log file in the temporary folder, named from ``prefix``."""
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=".log")
    os.close(fd)
    return Path(name)


def log_tail(path: Path | None, lines: int = 3) -> str:
    """The last ``lines`` non-empty lines of a log file, joined by " | " ("" if none)."""
    if path is None:
        return ""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return " | ".join([line.strip() for line in text.splitlines() if line.strip()][-lines:])


def exit_message(what: str, returncode: int, log: Path | None) -> str:
    """One line: which process, how it ended (the signal by name), its log and its last lines."""
    from ..llama_cpp.selfcheck import describe_exit

    tail = log_tail(log)
    return f"{what} {describe_exit(returncode)}" + (f"; its log {log}" if log else "") + (f": {tail}" if tail else "")


def wait_until_ready(process: subprocess.Popen, health_url: str, timeout_s: float, what: str,
                     log: Path | None = None) -> None:
    """Return once ``health_url`` answers 200; RuntimeError if ``process``
    exits first (how, and the end of its ``log``) or ``timeout_s`` pass."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(exit_message(what, process.returncode, log) + " (before it was ready)")
        try:
            if httpx.get(health_url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not answer {health_url} within {timeout_s:.0f} s: {log_tail(log)}")


def stop_process(process: subprocess.Popen, timeout_s: float) -> None:
    """End ``process``: SIGTERM, then SIGKILL after ``timeout_s``; waited for either way."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

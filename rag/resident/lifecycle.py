"""A resident server's life, from the client's side: whether one answers
at an address, starting one in the background (one client starts it while
the others wait for it, a stale socket is replaced, and a server that is
stopping is waited out and replaced), listing the ones that run, and
stopping them.

Does not: ask questions (``client``) or serve (``server``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import Callable, Mapping

from ..errors import RagError
from ..settings import Settings
from .address import CODE, EXIT_ALREADY_RUNNING, SETTINGS_VARIABLE, Address, held, server_settings
from .wire import BROKEN, Unanswered, call

# The service's keys (rag.service.settings): the resident server's only client is its user's command
# line, which sends no key, so a server that took them from a shell exporting them would refuse it.
KEY_VARIABLES = frozenset({"RAG_SERVE_API_KEYS", "RAG_SERVE_KEYS_FILE", "RAG_SERVE_PUBLIC_DOCS",
                           "RAG_SERVE_AUTH_FAILURES_PER_MINUTE"})
START_WAIT_S = 900  # a first start may index the sample corpus; Ctrl-C ends the wait sooner
PROBE_S = 30.0


def probe(address: Address) -> dict | None:
    """The status of the server at ``address`` (``GET /v1/resident``), or
    None when none answers there: no socket, a stale one (refused), or a
    server going away (the connection closed before an answer)."""
    try:
        return call(str(address.socket), "GET", "/v1/resident", timeout=PROBE_S)
    except Unanswered:
        return None
    except BROKEN as exc:
        pid = address.pid()
        raise RagError(f"the rag server{f' (pid {pid})' if pid else ''} at {address.socket} does not answer "
                       f"({exc}); stop it with `rag server stop`, or use --no-server") from None


def _serving(info: dict | None) -> bool:
    return info is not None and not info.get("stopping")


def ensure_running(address: Address, settings: Settings, notice: Callable[[str], None]) -> dict:
    """The status of a server at ``address`` that is not stopping, started
    in the background first if none runs (after the one stopping there has
    gone); a RagError saying why when it cannot start. ``notice`` is told
    what a server this call started noted while starting."""
    info = probe(address)
    if _serving(info):
        return info
    with held(address.start_lock, wait_s=START_WAIT_S, what="start lock"):
        info = _wait_ready(address, settings)
    for line in _log_lines(address):
        if line.startswith("note: "):
            notice(line.removeprefix("note: "))
    return info


def server_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a resident server starts with: ``environ`` without
    the service's keys (:data:`KEY_VARIABLES`, in any case, as the settings
    read them)."""
    return {name: value for name, value in environ.items() if name.upper() not in KEY_VARIABLES}


def _spawn(address: Address, settings: Settings) -> subprocess.Popen:
    env = server_environment(os.environ)
    env[SETTINGS_VARIABLE] = server_settings(settings).model_dump_json()
    # The server runs this very code, wherever it was imported from.
    env["PYTHONPATH"] = os.pathsep.join([str(CODE.parent)] + [p for p in [env.get("PYTHONPATH")] if p])
    fd = os.open(address.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        return subprocess.Popen([sys.executable, "-m", "rag.resident.server", address.key], env=env,
                                stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, cwd=address.folder,
                                start_new_session=True)  # its own session: Ctrl-C in this shell does not reach it
    finally:
        os.close(fd)


def _wait_ready(address: Address, settings: Settings) -> dict:
    """With the start lock held: the status of the server at ``address``
    once it serves, started here when none lives (a server still holding
    its lock is starting or stopping: it is waited for, and replaced once
    it has gone)."""
    deadline = time.monotonic() + START_WAIT_S
    process = None
    while time.monotonic() < deadline:
        info = probe(address)
        if _serving(info):
            return info
        if process is not None and process.poll() is not None:
            if process.returncode != EXIT_ALREADY_RUNNING:
                raise _start_failure(address, process.returncode)
            process = None  # another one lives: wait for it to serve, or to go
        elif process is None and not address.alive():
            # Nobody holds the server's lock: whatever socket is left is stale.
            with contextlib.suppress(FileNotFoundError):
                address.socket.unlink()
            process = _spawn(address, settings)
        time.sleep(0.05)
    raise RagError(f"the rag server did not answer within {START_WAIT_S} s; its log: {address.log}")


def _log_lines(address: Address) -> list[str]:
    try:
        return address.log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []


def _start_failure(address: Address, status: int | None) -> RagError:
    errors = [line.removeprefix("error: ") for line in _log_lines(address) if line.startswith("error: ")]
    if errors:
        return RagError(errors[-1])
    from engine.llama_cpp.selfcheck import describe_exit

    how = describe_exit(status) if status is not None else "stopped"
    last = [line.strip() for line in _log_lines(address) if line.strip()][-2:]
    return RagError(f"the rag server {how} while starting; its log: {address.log}"
                    + (f" (last lines: {' | '.join(last)})" if last else ""))


def servers(settings: Settings) -> list[dict]:
    """The status of every server living in the runtime folder of
    ``settings``; one that lives but does not answer (yet) is
    ``{"key", "pid", "answering": False, "socket"}``."""
    found = []
    for address in Address.every(settings):
        if not address.alive():
            continue
        try:
            info = probe(address)
        except RagError:
            info = None
        found.append(info | {"answering": True} if info else
                     {"key": address.key, "pid": address.pid(), "answering": False, "socket": str(address.socket)})
    return found


def stop(address: Address, wait_s: float = 60) -> int | None:
    """Stop the server at ``address`` once its answers in progress are done
    (SIGTERM when it does not answer); its pid, or None if none lived."""
    if not address.alive():
        return None
    pid = address.pid()
    try:
        call(str(address.socket), "POST", "/v1/resident/stop", timeout=PROBE_S)
    except (RagError, *BROKEN):
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while address.alive():
        if time.monotonic() > deadline:
            raise RagError(f"the rag server (pid {pid}) did not stop within {wait_s:.0f} s")
        time.sleep(0.05)
    return pid

"""vLLM's router (``vllm-router``) in front of several engine servers.

Several engines are one address to this project: a router made for the job
routes each request (``cache_aware`` sends a prompt to the worker whose
prefix cache holds most of it), retries a request that could not be sent,
takes a dead worker out and takes workers added at run time. The budget is
planned on top, for the router's address, from the figures each response
carries (see ``backend``).

:class:`RouterProcess` starts ``vllm-router`` (the package on the index:
``pip install 'rag-budget[router]'``) over worker URLs on a loopback port,
and stops it; :func:`router_command` is the command line a person runs to
start it themselves, which the refusal without the package shows.

Does not: route, retry or check health itself (the router does), or patch
the router: it runs unchanged, with the flags below.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import queue
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import weakref
from pathlib import Path
from typing import Sequence

import httpx

from ..errors import EngineUnreachable
from .process import exit_message, free_port, stop_process, temporary_log, wait_until_ready

# vllm-router's own policy names (``vllm-router --help``); the first is the default.
POLICIES = ("cache_aware", "round_robin", "power_of_two", "consistent_hash", "random")
DEFAULT_POLICY = POLICIES[0]

# Flags passed to the router beside its policy, each with why. Measured with
# vllm-router 0.1.17 over llama-server workers: with the defaults (a circuit
# opened after 10 failures, health checked every 60 s), the two questions sent
# after a worker was killed were both retried on that dead worker and failed;
# with a circuit opened at the first failed send, the router's retry went to
# the other worker and no question that was not in flight on it was lost.
ROUTER_FLAGS = (
    "--cb-failure-threshold", "1",  # a worker that refused a connection is out at once
    "--health-check-interval-secs", "2",  # and it is found back (or a dead one found) within seconds:
    "--health-failure-threshold", "1",  # requests it does not retry (/tokenize) meet a dead worker 2 s at most
    # Every rag-budget prompt opens with the same system prompt, a large share of a short one, so at
    # the router's default threshold (0.3) every conversation matched the worker that saw it first:
    # measured, cache_aware put 43 of 43 requests (22 of 24, 50 of 80 in other runs) on one worker.
    # At 0.7 a prompt must match more than the system prompt to follow it; new ones go to the
    # worker holding least (33 and 31, cached share 0.834 against round_robin's 0.711).
    "--cache-threshold", "0.7",
    "--log-level", "warning",
)
START_TIMEOUT_S = 60.0  # the router waits for its workers' /health before it answers its own


def router_binary() -> str | None:
    """The ``vllm-router`` launcher: beside this Python (a virtual
    environment's scripts), else on PATH; None when it is not installed."""
    beside = Path(sys.executable).with_name("vllm-router")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("vllm-router")


def router_command(urls: Sequence[str], policy: str = DEFAULT_POLICY, port: int | str = 8090,
                   binary: str = "vllm-router", metrics_port: int | None = None) -> list[str]:
    """The command that starts vLLM's router on ``127.0.0.1:port`` over
    ``urls`` routing by ``policy``, with this project's flags
    (:data:`ROUTER_FLAGS`), its Prometheus metrics on ``metrics_port``
    (default: its own, 29000)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown router policy {policy!r}: one of {', '.join(POLICIES)}")
    # Each router serves metrics on a port of its own: a second one on the default port fails to start.
    metrics = ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)] if metrics_port else []
    return [binary, "--host", "127.0.0.1", "--port", str(port), "--policy", policy, "--worker-urls", *urls,
            *ROUTER_FLAGS, *metrics]


def how_to_start(urls: Sequence[str], policy: str = DEFAULT_POLICY) -> str:
    """What to run where ``vllm-router`` is not installed: install it, or
    start it by hand and give its one address."""
    command = shlex.join(router_command(urls, policy))
    return (f"several engine URLs are served through vLLM's router, which is not installed: "
            f"pip install 'rag-budget[router]' (or pip install vllm-router), or start it yourself "
            f"({command}) and give its address: --engine-url http://127.0.0.1:8090")


_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a child gets when the thread that started it ends


def _die_with_parent() -> None:  # runs in the child between fork and exec: one plain libc call
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class _Spawner:
    """Starts child processes from one thread that lives as long as this
    process, each told to end when that thread ends (``PR_SET_PDEATHSIG``
    is tied to the starting thread, not the process): a router started for
    a rag process ends with it, even one killed with SIGKILL."""

    def __init__(self) -> None:
        self._asks: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def popen(self, command: list[str], **kwargs) -> subprocess.Popen:
        """``subprocess.Popen(command, **kwargs)``, started from the spawner's thread."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="rag-router-spawner", daemon=True)
                self._thread.start()
        answer: queue.Queue = queue.Queue(maxsize=1)
        self._asks.put((command, kwargs, answer))
        started = answer.get()
        if isinstance(started, BaseException):
            raise started
        return started

    def _serve(self) -> None:
        while True:
            command, kwargs, answer = self._asks.get()
            try:
                answer.put(subprocess.Popen(command, preexec_fn=_die_with_parent, **kwargs))
            except BaseException as exc:  # handed to the caller, who raises it
                answer.put(exc)


_SPAWNER = _Spawner()
_RUNNING: "weakref.WeakSet[RouterProcess]" = weakref.WeakSet()


@atexit.register
def _stop_running() -> None:
    """Routers still running when Python exits are stopped in order."""
    for router in list(_RUNNING):
        router.stop()


class RouterProcess:
    """``vllm-router`` on ``127.0.0.1`` over ``urls``, routing by ``policy``,
    started now and answering at :attr:`url` (EngineUnreachable saying why, with
    the end of its log, when it does not start); :meth:`stop` ends it."""

    def __init__(self, urls: Sequence[str], *, policy: str = DEFAULT_POLICY,
                 timeout_s: float = START_TIMEOUT_S) -> None:
        binary = router_binary()
        if binary is None:
            raise EngineUnreachable(how_to_start(urls, policy))
        self.urls, self.policy = list(urls), policy
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = router_command(self.urls, policy, self.port, binary=binary, metrics_port=free_port())
        self.log_path = temporary_log(f"vllm-router-{self.port}-")
        self._log = open(self.log_path, "ab")
        # Its own session: a Ctrl-C in the terminal reaches rag, which stops the router in order
        # (at close, or at exit); a rag process killed outright takes it along (_Spawner).
        self.process = _SPAWNER.popen(self.command, stdout=self._log, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        _RUNNING.add(self)
        try:
            wait_until_ready(self.process, f"{self.url}/health", timeout_s, self._what(), self.log_path)
        except RuntimeError as exc:
            self.stop(keep_log=True)
            raise EngineUnreachable(f"{exc} (are the workers up?)") from None
        except BaseException:
            self.stop(keep_log=True)
            raise

    def _what(self) -> str:
        return f"vllm-router over {', '.join(self.urls)}"

    def died(self) -> str | None:
        """None while the router runs or after it was stopped; else one line
        saying how it ended and the end of its log."""
        if self.process.poll() is None or self not in _RUNNING:
            return None
        return exit_message(self._what(), self.process.returncode, self.log_path)

    def workers(self) -> list[str]:
        """The worker URLs the router routes to now."""
        return list(httpx.get(f"{self.url}/list_workers", timeout=5.0).json().get("urls") or [])

    def add_worker(self, url: str) -> None:
        """Have the router route to ``url`` too (its ``/add_worker``)."""
        response = httpx.post(f"{self.url}/add_worker", params={"url": url}, timeout=30.0)
        if response.status_code >= 400:
            raise EngineUnreachable(f"vllm-router did not add {url}: {response.status_code} {response.text[:200]}")

    def stop(self, keep_log: bool = False) -> None:
        """Stop the router (SIGTERM, then SIGKILL after 10 s); its log goes
        unless ``keep_log`` or it had died (the log is what explains it)."""
        keep_log = keep_log or self.died() is not None
        _RUNNING.discard(self)
        stop_process(self.process, 10)
        self._log.close()
        if not keep_log:
            self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> "RouterProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

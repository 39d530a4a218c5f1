"""What the person at the terminal sees of an answer: the clock starts when
the command starts (the process, for the ``rag`` console script: they
pressed Enter then), and stops at the first text written to them, so the
time to first token they wait for is reported beside the engine's.

A process's start time is when it was forked, and a shell runs the last
command of ``bash -c "pip install . && rag ask ..."`` in its own process:
that process started with the whole line. So the process start counts only
when the time from it to the first line of rag's code is start-up (CPU the
process used, plus a little waiting); otherwise the clock starts at that
first line, never earlier than this process began running rag.

Does not: measure the engine (its ``Timings`` do) or print anything.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..qa.answerer import Answerer


def process_age() -> float | None:
    """Seconds since this process started, from Linux's ``/proc/self/stat``
    (clock ticks after boot, 10 ms apart); None where that cannot be read."""
    try:
        with open("/proc/self/stat", "rb") as f:
            after_name = f.read().rsplit(b")", 1)[1].split()
        ticks = int(after_name[19])  # field 22, starttime (the fields after the name start at field 3)
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return age if age >= 0 else None


STARTUP_WAIT_S = 0.5  # waiting (not computing) a busy machine may add to Python's own start-up


def run_start(age: float | None, code_started: tuple[float, float], now: tuple[float, float]) -> float:
    """When this process began running the command, on :func:`time.perf_counter`'s
    clock: the process start (``age`` seconds before ``now``'s wall clock)
    when everything between it and rag's first line (``code_started``,
    wall and CPU clocks) was the interpreter starting (CPU time, give or
    take ``STARTUP_WAIT_S``), else rag's first line.

    ``run_start(1041.0, (1041.0, 0.1), (1041.5, 0.3)) -> 1041.0`` (the rest was another command)
    """
    wall_now, cpu_now = now
    first_wall, first_cpu = code_started
    if age is None:
        return first_wall
    forked = wall_now - age
    if first_wall - forked <= first_cpu + STARTUP_WAIT_S:
        return forked
    return first_wall


class CommandClock:
    """When this command started, on :func:`time.perf_counter`'s clock."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self._from_process = False

    def process_started(self) -> None:
        """The command is this process (the console script): its clock starts when the process did."""
        import rag

        now = (time.perf_counter(), time.process_time())
        self.started, self._from_process = run_start(process_age(), rag.CODE_STARTED, now), True

    def invoked(self) -> None:
        """The application was invoked: the clock starts now, unless it
        started with the process (tests invoke it many times in one process)."""
        if not self._from_process:
            self.started = time.perf_counter()


clock = CommandClock()


@dataclass
class Seen:
    """One answer as the person saw it: from ``started`` (the command's
    start, or in ``rag chat`` the question's) to the first text written
    (``first_text``) and to the end, and whether a resident server
    (``via="server"``, its pid), a ``rag serve`` elsewhere (``"service"``) or
    this process (``"process"``) answered."""

    started: float
    via: str = "process"
    server_pid: int | None = None
    first_text: float | None = None
    ended: float | None = None
    evidence_shown: float | None = None

    @classmethod
    def of(cls, pipeline: "Answerer", started: float) -> "Seen":
        """The clock of an answer by ``pipeline`` (a Pipeline or a resident client)."""
        return cls(started, pipeline.via, pipeline.server_pid)

    def text_shown(self) -> None:
        """Text was written to the person; the first time stops the TTFT clock."""
        if self.first_text is None:
            self.first_text = time.perf_counter()

    def evidence_known(self) -> None:
        """The answer's evidence reached the person (shown, or known, before the first text)."""
        if self.evidence_shown is None:
            self.evidence_shown = time.perf_counter()

    @property
    def ttft_s(self) -> float | None:
        """Seconds from the start to the first text (None: no text came)."""
        return None if self.first_text is None else self.first_text - self.started

    def to_dict(self) -> dict[str, object]:
        """The ``cli`` object of ``rag ask --json``: ``ttft_s``, ``total_s``
        and ``evidence_s`` (when the evidence was known) from the command's
        start, ``via`` and ``server_pid``."""
        total = None if self.ended is None else self.ended - self.started
        evidence = None if self.evidence_shown is None else self.evidence_shown - self.started
        return {"ttft_s": self.ttft_s, "total_s": total, "via": self.via, "server_pid": self.server_pid,
                "evidence_s": evidence}

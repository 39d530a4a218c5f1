"""Questions in progress, counted, so that background work (summaries and
their prefills) can give way to them.

Does not: schedule or stop anything; the background asks :meth:`busy`.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator


class Foreground:
    """How many questions are in progress. Thread safe."""

    def __init__(self) -> None:
        self._active = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def question(self) -> Iterator[None]:
        """Count a question as in progress while the block runs."""
        with self._lock:
            self._active += 1
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1

    def busy(self) -> bool:
        """Whether a question is in progress."""
        with self._lock:
            return self._active > 0

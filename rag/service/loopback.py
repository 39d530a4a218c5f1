"""A real server on 127.0.0.1 in a thread, for tests and benchmarks.

Does not: build the application (pass one in).
"""

from __future__ import annotations

import threading
import time

from fastapi import FastAPI


class LoopbackServer:
    """``app`` served by uvicorn on 127.0.0.1, on a free port, in a thread;
    ``url`` is where, ``stop()`` ends it. With ``ready`` (the default), the
    server is handed over once the service has warmed up, as a client
    waiting for ``/healthz`` to say "ok" would find it."""

    def __init__(self, app: FastAPI, start_timeout_s: float = 60, *, ready: bool = True) -> None:
        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name="rag-loopback-server", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + start_timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start on 127.0.0.1")
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}"
        service = getattr(app.state, "service", None)
        if ready and service is not None:
            service.warmup.wait()

    def stop(self) -> None:
        """Shut the server down and wait for it."""
        self.server.should_exit = True
        self.thread.join(timeout=60)

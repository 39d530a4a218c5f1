"""llama.cpp's own HTTP server on 127.0.0.1, for the tests of the remote
backend and the engine pool, and for ``rag bench serve --engines``.

The binary is built once from the llama.cpp sources that the installed
llama-cpp-python release ships (its sdist, from the package index), CPU only
and without the web UI, and kept in the cache folder, so it is the same
llama.cpp the in-process backend runs. ``$RAG_LLAMA_SERVER`` names a
binary to use instead.

Does not: serve anything beyond this machine (it binds 127.0.0.1 only).
"""

from __future__ import annotations

import importlib.metadata as md
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import httpx

CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF",
]


def _log(message: str) -> None:
    sys.stderr.write(f"[llama-server] {message}\n")
    sys.stderr.flush()


def server_binary() -> Path:
    """A llama-server binary: ``$RAG_LLAMA_SERVER``, else one built from the
    installed llama-cpp-python's own sources (built on first use, about
    ten minutes on two cores, then cached)."""
    given = os.environ.get("RAG_LLAMA_SERVER")
    if given:
        return Path(given)
    version = md.version("llama-cpp-python")
    # In the real home's cache, not the tests' temporary one: built once per machine.
    target = Path.home() / ".cache" / "rag-budget-build" / f"llama-server-{version}" / "llama-server"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="llama-server-build-") as tmp:
        work = Path(tmp)
        _log(f"fetching the llama-cpp-python {version} sources from the package index")
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={version}", "-d", str(work)], check=True)
        sdist = next(work.glob("llama_cpp_python-*.tar.gz"))
        prefix = f"{sdist.name[: -len('.tar.gz')]}/vendor/llama.cpp/"
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            tar.extractall(work, members=members, filter="data")
        source = work / prefix
        _log("building llama-server (CPU, once; cached under " + str(target.parent) + ")")
        started = time.perf_counter()
        subprocess.run(["cmake", "-S", str(source), "-B", str(work / "build"), *CMAKE_FLAGS], check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", str(work / "build"), "--target", "llama-server", "-j",
                        str(os.cpu_count() or 2)], check=True, stdout=subprocess.DEVNULL)
        built = work / "build" / "bin" / "llama-server"
        partial = target.with_suffix(".partial")
        shutil.copy2(built, partial)
        os.replace(partial, target)  # a build cut short never looks finished
        _log(f"built in {time.perf_counter() - started:.0f} s")
    return target


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_ready(process: subprocess.Popen, health_url: str, timeout_s: float, what: str) -> None:
    """Return once ``health_url`` answers 200; RuntimeError if ``process``
    exits first or ``timeout_s`` pass."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode} before it was ready")
        try:
            if httpx.get(health_url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not answer {health_url} within {timeout_s:.0f} s")


class LlamaServer:
    """A llama-server process on 127.0.0.1 serving one GGUF model with
    ``slots`` parallel slots sharing ``n_ctx`` tokens of context (each slot
    n_ctx / slots), on ``port`` (default: a free one). ``extra`` are more
    llama-server arguments."""

    def __init__(self, model: Path, *, n_ctx: int = 4096, threads: int = 2, log: Path | None = None,
                 slots: int = 1, port: int | None = None, extra: tuple[str, ...] = ()) -> None:
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [str(server_binary()), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port),
                        "-c", str(n_ctx), "-np", str(slots), "-t", str(threads), "-tb", str(threads), "-b", "512",
                        "--no-webui", *extra]
        self._log_path = log
        self._start()

    def _start(self) -> None:
        self._log = open(self._log_path or os.devnull, "ab")
        self.process = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT)
        self._wait_ready()

    def _wait_ready(self, timeout_s: float = 120.0) -> None:
        try:
            wait_until_ready(self.process, f"{self.url}/health", timeout_s, "llama-server")
        except RuntimeError:
            self.stop()
            raise

    def kill(self) -> None:
        """Kill the server at once (SIGKILL), as a crashed host would vanish."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._log.close()

    def restart(self) -> None:
        """Start the server again on the same port, with an empty cache."""
        self.kill()
        self._start()

    def stop(self) -> None:
        """Stop the server and wait for it."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()

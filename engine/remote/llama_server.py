"""llama.cpp's own HTTP server on 127.0.0.1: ``rag bench serve --engines``
starts its workers with it, and the tests of the remote backend and the
router start theirs. Beside ``router`` (vLLM's router, which rag starts):
the engines in other processes that this project starts itself.

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
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from engine.remote.process import exit_message, free_port, log_tail, stop_process, temporary_log, wait_until_ready

__all__ = ["LlamaServer", "server_binary", "exit_message", "log_tail", "wait_until_ready"]

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


def repack_arguments(model: Path) -> tuple[str, ...]:
    """``("--no-repack",)`` where the engine's self-check found that llama.cpp
    dies on this machine with extra buffer types (AMX), else ``()``: every
    llama.cpp the project starts follows the same verdict."""
    from engine.llama_cpp.selfcheck import engine_verdict

    return () if engine_verdict(Path(model)).extra_bufts else ("--no-repack",)


class LlamaServer:
    """A llama-server process on 127.0.0.1 serving one GGUF model with
    ``slots`` parallel slots sharing ``n_ctx`` tokens of context (each slot
    n_ctx / slots), on ``port`` (default: a free one). ``extra`` are more
    llama-server arguments. Its output goes to ``log`` (default: a
    temporary file, removed at :meth:`stop`), which a failure names."""

    def __init__(self, model: Path, *, n_ctx: int = 4096, threads: int = 2, log: Path | None = None,
                 slots: int = 1, port: int | None = None, extra: tuple[str, ...] = ()) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [str(server_binary()), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port),
                        "-c", str(n_ctx), "-np", str(slots), "-t", str(threads), "-tb", str(threads), "-b", "512",
                        "--no-webui", *repack_arguments(model), *extra]
        self._own_log = log is None
        self.log_path = log if log is not None else temporary_log(f"llama-server-{self.port}-")
        self._killed = False  # killed on purpose: not a failure
        self._start()

    def _start(self) -> None:
        self._log = open(self.log_path, "ab")
        self._killed = False
        self.process = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT)
        self._wait_ready()

    def _wait_ready(self, timeout_s: float = 120.0) -> None:
        try:
            wait_until_ready(self.process, f"{self.url}/health", timeout_s, f"llama-server at {self.url}",
                             self.log_path)
        except RuntimeError:
            self.stop(keep_log=True)
            raise

    def died(self) -> str | None:
        """None while the server runs or after it was stopped or killed on
        purpose; else one line saying which server ended, how (the signal
        by name) and the end of its log."""
        if self._killed or self.process.poll() is None:
            return None
        return exit_message(f"llama-server at {self.url}", self.process.returncode, self.log_path)

    def kill(self) -> None:
        """Kill the server at once (SIGKILL), as a crashed host would vanish."""
        self._killed = True
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._log.close()

    def restart(self) -> None:
        """Start the server again on the same port, with an empty cache."""
        self.kill()
        self._start()

    def stop(self, keep_log: bool = False) -> None:
        """Stop the server and wait for it; its temporary log goes unless
        ``keep_log`` or the server had died (the log is what explains it)."""
        keep_log = keep_log or self.died() is not None
        self._killed = True
        stop_process(self.process, 20)
        self._log.close()
        if self._own_log and not keep_log:
            self.log_path.unlink(missing_ok=True)

"""Whether this llama.cpp build runs this model on this CPU: found out once,
in a child process, before the engine serves, and remembered.

A native llama.cpp build on a virtual Xeon that advertises AMX dies by
SIGSEGV in ggml's AMX matrix multiply (the hypervisor does not grant the
tile state; llama.cpp issue 20824). That code runs only for weights held in
llama.cpp's *extra buffer types* (weight repacking, AMX), and a model loads
without them (``llama_model_params.use_extra_bufts = false``; llama-server's
``--no-repack``) at the native build's speed. So the first time a build, a
CPU and a model meet, a child process loads the model and generates a few
tokens as the engine would; if it dies by a signal or hangs, the same is
tried without extra buffer types, and that is used. A crash can only cost
the child. The verdict is kept in a small JSON file named by all three,
believed only when it parses and names the same build, CPU and model.

Does not: build llama.cpp, load the engine's model, or choose any other
engine option.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import EngineCrashed

FORMAT = 1  # the verdict file's layout; a file of another is checked again
# Seconds a check may take before it counts as hung: loading the weights (at
# 30 s a GiB, slower than any disk measured here) and a prompt of
# CHECK_PROMPT_TOKENS plus CHECK_DECODE_TOKENS tokens (about 1 s for
# SmolLM2-135M on 2 cores). Chosen, not measured: a hang is what it catches.
CHECK_BASE_S = 60.0
CHECK_S_PER_GIB = 30.0
CHECK_PROMPT_TOKENS = 96  # a prompt of several rows: the repacked matmuls run on it, as in a real prefill
CHECK_DECODE_TOKENS = 8
# Test hook: "segv:default", "segv:all", "hang:default" make the child of that
# configuration ("all": both) kill itself by SIGSEGV, or sleep, once the model
# is loaded, as a broken build would.
FAULT_VARIABLE = "RAG_ENGINE_CHECK_FAULT"

_memo: dict[str, "Verdict"] = {}
_memo_lock = threading.Lock()


@dataclass(frozen=True)
class Verdict:
    """How the engine loads models of this build on this CPU: with or without
    llama.cpp's extra buffer types, why, and the speeds the check saw."""

    extra_bufts: bool
    reason: str
    key: dict
    checked_at: float  # Unix time of the check
    speeds: dict  # per configuration tried: prefill and decode tok/s, or how it failed

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, **asdict(self)}, sort_keys=True)


def default_folder() -> Path:
    """``$XDG_CACHE_HOME/rag-budget/engine-checks``, where verdicts are kept."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "rag-budget" / "engine-checks"


def cpu_flags() -> set[str]:
    """The CPU's feature flags as the kernel lists them (empty where it does not)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return set(value.split())
    except OSError:
        pass
    return set()


def system_info() -> str:
    """What llama.cpp says it was built with (``llama_print_system_info``)."""
    import llama_cpp

    return llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()


def built_features(info: str) -> list[str]:
    """The CPU features a llama.cpp build uses, from its system info
    (``"CPU : AVX2 = 1 | AMX_INT8 = 1 | REPACK = 1 |"`` -> ``["AVX2", "AMX_INT8", "REPACK"]``)."""
    features = []
    for part in info.replace("\n", "|").split("|"):
        name, _, value = part.rpartition("=")
        name = name.split(":")[-1].strip()
        if name and value.strip() == "1" and name not in features:
            features.append(name)
    return features


def check_key(model_path: Path, n_gpu_layers: int) -> dict:
    """What a verdict holds for: the llama.cpp build, the CPU, the kernel (which
    grants AMX state) and the model."""
    import llama_cpp

    from ..models import model_identity

    flags = cpu_flags()
    return {
        "llama_cpp_python": llama_cpp.__version__,
        "system_info": system_info(),
        "cpu_flags": hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:16],
        "kernel": platform.release(),
        "model": model_identity(model_path),
        "gpu_layers": n_gpu_layers,
    }


def check_timeout(model_path: Path) -> float:
    """Seconds a check of ``model_path`` may take before it counts as hung."""
    return CHECK_BASE_S + CHECK_S_PER_GIB * model_path.stat().st_size / 2**30


def engine_verdict(model_path: Path, *, n_gpu_layers: int = 0, n_threads: int = 2, folder: Path | None = None,
                   timeout_s: float | None = None, notice=None) -> Verdict:
    """How to load ``model_path`` with this llama.cpp build on this CPU: read
    from the verdict file under ``folder`` (default :func:`default_folder`)
    when it is valid and names this build, CPU and model; otherwise found
    out in child processes (default configuration first, then without extra
    buffer types) and written there. ``notice(line)`` is told when a check
    runs and what it found. EngineCrashed, naming the signal, the CPU
    features and the rebuild command, when no configuration runs."""
    model_path = Path(model_path)
    key = check_key(model_path, n_gpu_layers)
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    folder = Path(folder) if folder else default_folder()
    path = folder / f"{name}.json"
    with _memo_lock:
        if str(path) in _memo:
            return _memo[str(path)]
        verdict = read_verdict(path, key)
        if verdict is None:
            with _file_lock(folder / ".lock"):
                verdict = read_verdict(path, key)  # another process may have checked meanwhile
                if verdict is None:
                    verdict = _check(model_path, key, n_gpu_layers, n_threads,
                                     timeout_s if timeout_s is not None else check_timeout(model_path), notice)
                    _write(path, verdict)
        _memo[str(path)] = verdict
        return verdict


def forget_memo() -> None:
    """Forget the verdicts this process read or found (tests: the file is read again)."""
    with _memo_lock:
        _memo.clear()


def read_verdict(path: Path, key: dict) -> Verdict | None:
    """The verdict in ``path`` if it is whole, of this :data:`FORMAT` and for
    ``key``; None when it is missing, damaged or stale."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.pop("format") != FORMAT or data.get("key") != key:
            return None
        verdict = Verdict(**data)
        if not (isinstance(verdict.extra_bufts, bool) and isinstance(verdict.reason, str)
                and isinstance(verdict.speeds, dict) and isinstance(verdict.checked_at, (int, float))):
            return None
        return verdict
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _write(path: Path, verdict: Verdict) -> None:
    """Write atomically; a folder that cannot be written only costs the next start a check."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=".verdict-", delete=False,
                                         encoding="utf-8") as fh:
            fh.write(verdict.to_json())
        os.replace(fh.name, path)


@contextlib.contextmanager
def _file_lock(path: Path):
    """Held while one process checks, so two starting at once check once."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield
        return
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _check(model_path: Path, key: dict, n_gpu_layers: int, n_threads: int, timeout_s: float, notice) -> Verdict:
    say = notice or (lambda line: None)
    say(f"checking that llama.cpp runs {model_path.name} on this machine (once for this build and CPU)")
    default = run_child(model_path, extra_bufts=True, n_gpu_layers=n_gpu_layers, n_threads=n_threads,
                        timeout_s=timeout_s)
    speeds = {"default": default}
    if default.get("ok"):
        return Verdict(True, "the default configuration ran in a check", key, time.time(), speeds)
    safe = run_child(model_path, extra_bufts=False, n_gpu_layers=n_gpu_layers, n_threads=n_threads,
                     timeout_s=timeout_s)
    speeds["safe"] = safe
    if not safe.get("ok"):
        raise EngineCrashed(crash_message(default, safe))
    reason = (f"the default configuration {default['failure']} in a check{_amx_note()}; without extra buffer "
              "types (no weight repacking) it ran")
    say(f"llama.cpp {default['failure']} with extra buffer types{_amx_note()}: running without them "
        "(remembered for this build, CPU and model)")
    return Verdict(False, reason, key, time.time(), speeds)


def _amx_note() -> str:
    amx = sorted(f for f in cpu_flags() if f.startswith("amx"))
    return f" (this CPU advertises {' '.join(amx)})" if amx else ""


def rebuild_command() -> str:
    """The pip command that rebuilds llama-cpp-python portable for this CPU
    (its vector features named, ``GGML_NATIVE`` off: no AMX code)."""
    import llama_cpp

    flags = cpu_flags()
    args = ["-DGGML_NATIVE=OFF"]
    for flag, option in (("avx", "GGML_AVX"), ("avx2", "GGML_AVX2"), ("fma", "GGML_FMA"), ("f16c", "GGML_F16C"),
                         ("avx512f", "GGML_AVX512")):
        if flag in flags:
            args.append(f"-D{option}=ON")
    return (f'CMAKE_ARGS="{" ".join(args)}" pip install --force-reinstall --no-cache-dir --no-deps '
            f"llama-cpp-python=={llama_cpp.__version__}")


def crash_message(default: dict, safe: dict) -> str:
    """One line: how both configurations failed, the CPU's AMX and AVX-512
    features, and the command that rebuilds llama.cpp without them."""
    features = sorted(f for f in cpu_flags() if f.startswith("amx") or f == "avx512f")
    return (f"llama.cpp {safe['failure']} on this machine even without extra buffer types "
            f"(with them it {default['failure']}; CPU features {' '.join(features) or 'none of AMX/AVX-512'}); "
            f"rebuild it portable: {rebuild_command()}")


def describe_exit(returncode: int) -> str:
    """``-11 -> "died by SIGSEGV"``, ``1 -> "exited with status 1"``."""
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"died by {signal.Signals(-returncode).name}"
        return f"died by signal {-returncode}"
    return f"exited with status {returncode}"


def run_child(model_path: Path, *, extra_bufts: bool, n_gpu_layers: int, n_threads: int,
              timeout_s: float) -> dict:
    """Load ``model_path`` and generate a few tokens in a child process;
    ``{"ok": True, "prefill_tok_s", "decode_tok_s"}``, or ``{"ok": False,
    "failure": "died by SIGSEGV" | "hung for 60 s" | ..., "log": last lines}``."""
    command = [sys.executable, "-m", "engine.llama_cpp.selfcheck", str(model_path),
               "--extra-bufts", "1" if extra_bufts else "0", "--gpu-layers", str(n_gpu_layers),
               "--threads", str(n_threads)]
    env = dict(os.environ)
    code = str(Path(__file__).resolve().parents[2])  # the child runs this very code
    env["PYTHONPATH"] = os.pathsep.join([code] + [p for p in [env.get("PYTHONPATH")] if p])
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, errors="replace",
                              timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        return {"ok": False, "failure": f"hung for {timeout_s:.0f} s", "log": _tail(exc.stderr)}
    if done.returncode == 0:
        with contextlib.suppress(ValueError, IndexError):
            return json.loads(done.stdout.strip().splitlines()[-1])
    return {"ok": False, "failure": describe_exit(done.returncode), "log": _tail(done.stderr)}


def _tail(text, lines: int = 5) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return "\n".join((text or "").strip().splitlines()[-lines:])


def _fault(configuration: str) -> None:
    kind, _, which = os.environ.get(FAULT_VARIABLE, "").partition(":")
    if which in (configuration, "all"):
        if kind == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif kind == "hang":
            time.sleep(3600)


def _child(model: str, extra_bufts: bool, n_gpu_layers: int, n_threads: int) -> dict:
    """In the child: load, evaluate a prompt, decode a few tokens; speeds."""
    from .internals import load_llama

    llm = load_llama(model, n_ctx=256, n_batch=128, n_threads=n_threads, n_gpu_layers=n_gpu_layers,
                     extra_bufts=extra_bufts, flash_attn=True)
    _fault("default" if extra_bufts else "safe")
    text = "The prefill reads every prompt token once and fills the cache for the answer. " * 8
    prompt = ([llm.token_bos()] + llm.tokenize(text.encode(), add_bos=False))[:CHECK_PROMPT_TOKENS]
    started = time.perf_counter()
    llm.eval(prompt)
    prefilled = time.perf_counter()
    for _ in range(CHECK_DECODE_TOKENS):
        llm.eval([prompt[-1]])  # one token a step, as decode runs; which token does not matter
    decoded = time.perf_counter()
    llm.close()
    return {"ok": True, "prefill_tok_s": round(len(prompt) / (prefilled - started), 1),
            "decode_tok_s": round(CHECK_DECODE_TOKENS / (decoded - prefilled), 1)}


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="A llama.cpp self-check (run by the engine in a child process).")
    parser.add_argument("model")
    parser.add_argument("--extra-bufts", type=int, choices=(0, 1), default=1)
    parser.add_argument("--gpu-layers", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    a = parser.parse_args()
    print(json.dumps(_child(a.model, bool(a.extra_bufts), a.gpu_layers, a.threads)), flush=True)

"""The engine's self-check: a child process loads the real model and
generates a few tokens before the engine serves; a child that dies by a
signal (made to, through the test hook) or hangs sends the engine to the
safe configuration (no extra buffer types), remembered in a file that is
believed only when whole and for this build, CPU and model.

Which signal a CPU sends is not the product's promise: the default
configuration dies by SIGSEGV on one AMX machine and by SIGILL on another.
The hook's fault fires once the model is loaded, and llama.cpp repacks the
weights into its extra buffer types while it loads, so where the default
configuration breaks for real it may die before the injected fault: a
default configuration's death is asserted as a named signal
(:data:`NAMED_DEATH`), never as the one this CPU sends. Only the safe
configuration, which runs on every machine these tests run on, is held to
the signal the test injected."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from engine.errors import EngineCrashed
from engine.llama_cpp import selfcheck
from engine.llama_cpp.selfcheck import FAULT_VARIABLE, engine_verdict
from engine.models import default_model_path

pytestmark = pytest.mark.model

# A death by a signal, named ("died by SIGILL", never "status -4"): what a default configuration that
# fails is reported as, whichever signal this CPU (or the test hook, if it fires first) sends.
NAMED_DEATH = r"died by SIG[A-Z]+"


@pytest.fixture
def model() -> Path:
    return default_model_path()


@pytest.fixture
def children(monkeypatch):
    """The child runs made (the real ones), by configuration."""
    made: list[bool] = []
    real = selfcheck.run_child

    def counted(model_path, *, extra_bufts, **kw):
        made.append(extra_bufts)
        return real(model_path, extra_bufts=extra_bufts, **kw)

    monkeypatch.setattr(selfcheck, "run_child", counted)
    selfcheck.forget_memo()
    yield made
    selfcheck.forget_memo()


def _only_file(folder: Path) -> Path:
    files = list(folder.glob("*.json"))
    assert len(files) == 1, files
    return files[0]


def test_a_child_killed_by_a_signal_sends_the_engine_to_the_safe_configuration_and_is_remembered(
        tmp_path, model, children, monkeypatch):
    monkeypatch.setenv(FAULT_VARIABLE, "segv:default")  # SIGSEGV, unless this CPU kills the default first
    notes: list[str] = []
    verdict = engine_verdict(model, folder=tmp_path, notice=notes.append)
    assert verdict.extra_bufts is False and children == [True, False]
    failure = verdict.speeds["default"]["failure"]
    assert re.fullmatch(NAMED_DEATH, failure) and f"default configuration {failure} in a check" in verdict.reason
    assert verdict.speeds["safe"]["ok"] and verdict.speeds["safe"]["prefill_tok_s"] > 0
    assert any("running without them" in n for n in notes)
    saved = json.loads(_only_file(tmp_path).read_text())
    assert saved["extra_bufts"] is False and saved["key"]["model"].startswith(model.name)

    # A later start (another process: nothing in memory) reads the file and runs no child.
    selfcheck.forget_memo()
    monkeypatch.delenv(FAULT_VARIABLE)
    again = engine_verdict(model, folder=tmp_path)
    assert again.extra_bufts is False and again.reason == verdict.reason and children == [True, False]


def test_a_hung_child_counts_as_a_failure(tmp_path, model, children, monkeypatch):
    # Only the child made to hang is given a short time: the safe child keeps the engine's own (a slow or
    # busy machine's safe run is no hang).
    counted = selfcheck.run_child

    def short_for_the_default(model_path, *, extra_bufts, timeout_s, **kw):
        return counted(model_path, extra_bufts=extra_bufts, timeout_s=8 if extra_bufts else timeout_s, **kw)

    monkeypatch.setattr(selfcheck, "run_child", short_for_the_default)
    monkeypatch.setenv(FAULT_VARIABLE, "hang:default")
    verdict = engine_verdict(model, folder=tmp_path)
    assert verdict.extra_bufts is False and children == [True, False] and verdict.speeds["safe"]["ok"]
    # Hung; or, where this CPU kills the default configuration before the hook hangs it, dead by a signal.
    failure = verdict.speeds["default"]["failure"]
    assert re.fullmatch(rf"hung for 8 s|{NAMED_DEATH}", failure) and failure in verdict.reason
    # The hang itself, where nothing real fails first: the safe configuration made to hang.
    monkeypatch.setenv(FAULT_VARIABLE, "hang:all")
    hung = counted(model, extra_bufts=False, n_gpu_layers=0, n_threads=2, timeout_s=8)
    assert hung["ok"] is False and hung["failure"] == "hung for 8 s"


def test_when_the_safe_configuration_crashes_too_one_line_says_why_and_how_to_rebuild(
        tmp_path, model, children, monkeypatch):
    monkeypatch.setenv(FAULT_VARIABLE, "segv:all")
    with pytest.raises(EngineCrashed) as caught:
        engine_verdict(model, folder=tmp_path)
    message = str(caught.value)
    # The safe configuration died of the injected SIGSEGV; the default of that or of this CPU's own signal.
    assert "\n" not in message and "status -" not in message
    assert re.search(rf"llama\.cpp died by SIGSEGV on this machine even without extra buffer types "
                     rf"\(with them it {NAMED_DEATH}; CPU features ", message), message
    assert 'CMAKE_ARGS="-DGGML_NATIVE=OFF' in message and "pip install --force-reinstall" in message
    assert "llama-cpp-python==" in message and "CPU features" in message
    assert not list(tmp_path.glob("*.json"))  # a crash is not remembered: a rebuild is checked afresh


def test_a_corrupt_or_stale_verdict_file_is_checked_again(tmp_path, model, children, monkeypatch):
    first = engine_verdict(model, folder=tmp_path)
    assert len(children) in (1, 2)
    path = _only_file(tmp_path)
    for damage in ("{not json", json.dumps({"format": 99}),
                   json.dumps(json.loads(path.read_text()) | {"key": {"llama_cpp_python": "0.0.1"}}),
                   json.dumps(json.loads(path.read_text()) | {"extra_bufts": "yes"})):
        path.write_text(damage)
        selfcheck.forget_memo()
        made = len(children)
        again = engine_verdict(model, folder=tmp_path)
        assert len(children) > made, damage  # checked again, not believed
        assert again.extra_bufts == first.extra_bufts
        assert json.loads(path.read_text())["format"] == selfcheck.FORMAT  # and the file mended


def test_the_real_check_on_the_real_model_matches_this_machine(tmp_path, model, children):
    verdict = engine_verdict(model, folder=tmp_path)
    if verdict.extra_bufts:
        # Nothing changes where the default runs: one child, and the default kept.
        assert children == [True] and verdict.speeds["default"]["ok"]
    else:
        assert children == [True, False] and verdict.speeds["default"]["failure"]
        assert verdict.speeds["safe"]["ok"]


def test_the_engine_loads_as_the_verdict_says_and_reports_why(tmp_path, monkeypatch, children):
    from engine.backend import Message
    from engine.llama_cpp.backend import LlamaCppBackend

    monkeypatch.setenv(FAULT_VARIABLE, "segv:default")  # as on a machine where the default dies
    backend = LlamaCppBackend(n_ctx=512, slots=1, check_dir=tmp_path)
    try:
        info = backend.describe()
        assert info["extra_buffer_types"] is False and re.search(NAMED_DEATH, info["extra_buffer_types_why"])
        assert info["built_cpu_features"].split() == selfcheck.built_features(info["system_info"]) != []
        assert backend.profile_key()["extra_bufts"] is False  # a profile measured with them is not reused
        prompt = backend.tokenize(backend.render([Message("user", "Say hello.")]))
        text, timings = backend.generate(prompt, max_tokens=4).result()
        assert timings.decode_tokens >= 1
    finally:
        backend.close()


def test_describe_exit_names_signals():
    assert selfcheck.describe_exit(-signal.SIGSEGV) == "died by SIGSEGV"
    assert selfcheck.describe_exit(-signal.SIGILL) == "died by SIGILL"  # what another AMX machine sends
    assert selfcheck.describe_exit(3) == "exited with status 3"


def test_built_features_reads_llama_cpp_system_info():
    info = "CPU : SSE3 = 1 | AVX512 = 0 | AMX_INT8 = 1 | REPACK = 1 | "
    assert selfcheck.built_features(info) == ["SSE3", "AMX_INT8", "REPACK"]


def test_a_llama_server_follows_the_verdict_and_a_crash_is_named(tmp_path, children, monkeypatch):
    """The llama-server the project starts takes --no-repack where the
    engine's check found the default dying; one killed by a signal says so."""
    from engine.remote.llama_server import LlamaServer

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv(FAULT_VARIABLE, "segv:default")
    server = LlamaServer(default_model_path(), n_ctx=512)
    try:
        assert "--no-repack" in server.command and server.died() is None
        os.kill(server.process.pid, signal.SIGSEGV)
        server.process.wait()
        how = server.died()
        assert how and "died by SIGSEGV" in how and str(server.log_path) in how
    finally:
        server.stop()
    assert server.log_path.exists()  # kept: it explains the crash
    server.log_path.unlink()


@pytest.mark.parametrize("fault", ["", "segv:default"])
def test_bench_engine_runs_the_safe_configuration_beside_the_default_where_both_run(run, tmp_path, monkeypatch,
                                                                                     fault):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # a verdict of its own
    if fault:
        monkeypatch.setenv(FAULT_VARIABLE, fault)  # as where the default dies
    selfcheck.forget_memo()
    result = run("bench", "engine", "--sizes", "64", "--repeats", "1", "--max-tokens", "2", "--json")
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    configurations = d["summary"]["configurations"]
    ran = {r["configuration"] for r in d["rows"]}
    assert configurations["safe"]["ran"] and "safe" in ran
    if configurations["default"]["ran"]:
        assert not fault and ran == {"default", "safe"}
        assert {(r["prompt_size"], r["kind"]) for r in d["summary"]["safe_over_default"]} == {
            (64, "cold"), (64, "cached prefix")}
    else:
        # Why the default did not run: the signal it died of, whichever this CPU (or the hook) sent.
        assert ran == {"safe"} and re.search(NAMED_DEATH, configurations["default"]["why"]), configurations
        assert d["summary"]["safe_over_default"] == []

"""The bench commands are a thin layer: ``rag/cli/bench*.py`` parse, call
``rag.bench.NAME.run`` and print; they build no pipeline, server or engine.
Each ``rag.bench.NAME`` also runs alone as ``python -m rag.bench.NAME``,
with the options of ``rag bench NAME``."""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / "rag" / "cli"
# What only a bench's own module may reach: the pipeline, the service, the index, the engine.
BUILDERS = ("rag.qa.pipeline", "rag.service", "rag.index", "rag.ingest", "rag.resident", "engine",
            "rag.bench.llama_server")
# Names that build or drive what a bench measures.
BUILDING = {"Pipeline", "LoopbackServer", "create_app", "ServiceSettings", "LlamaCppBackend", "open_backend",
            "LlamaServer", "RouterProcess", "bench_pipeline", "open_pipeline", "command_pipeline"}
DRIVING = {"prepare", "ingest", "ask", "search"}  # methods of a pipeline
HARNESS = "bench_harness.py"  # the one place that hands the command's pipeline opener to rag.bench


def _absolute(module: str | None, level: int) -> str:
    if not level:
        return module or ""
    base = "rag.cli".split(".")[: 3 - level]  # . is rag.cli, .. is rag
    return ".".join(base + ([module] if module else []))


def building_done_in(source: str, name: str = "rag/cli/bench_x.py") -> list[str]:
    """What in ``source`` (a rag/cli/bench module) builds or drives a bench's
    parts itself, one line each; empty when it only parses, calls and prints."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            module = _absolute(node.module, node.level) if isinstance(node, ast.ImportFrom) else None
            modules = [module] if module is not None else [a.name for a in node.names]
            for m in modules:
                if any(m == b or m.startswith(b + ".") for b in BUILDERS):
                    found.append(f"{name}:{node.lineno}: imports {m}")
            if module is not None and module.startswith("rag.bench."):
                for alias in node.names:
                    if alias.name not in ("run", "Harness") and not alias.name.isupper():
                        found.append(f"{name}:{node.lineno}: imports {alias.name} from {module} (only run)")
            if module == "rag.bench":
                found.append(f"{name}:{node.lineno}: imports a rag.bench module whole")
        elif isinstance(node, ast.Name) and node.id in BUILDING:
            if not (name.endswith(HARNESS) and node.id == "command_pipeline"):
                found.append(f"{name}:{node.lineno}: uses {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in DRIVING and isinstance(node.ctx, ast.Load):
            found.append(f"{name}:{node.lineno}: calls .{node.attr}")
    return found


def test_the_check_finds_a_pipeline_built_in_the_cli():
    built = '''
from ..bench.setup import bench_pipeline
from ..service import LoopbackServer
def bench_x(corpus):
    p = bench_pipeline(corpus)
    p.prepare()
    return LoopbackServer(p)
'''
    found = building_done_in(built)
    assert any("bench_pipeline from rag.bench.setup" in f for f in found)
    assert any("imports rag.service" in f for f in found) and any(".prepare" in f for f in found)
    assert building_done_in("from ..bench.ttft import run\nfrom ..bench.setup import BENCH_DATA\n") == []


def test_the_bench_commands_build_nothing_themselves():
    files = sorted(CLI.glob("bench*.py"))
    assert len(files) >= 6
    found = [f for path in files
             for f in building_done_in(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    assert not found, "\n".join(found)
    runs = sum(len(re.findall(r"from \.\.bench\.\w+ import (?:run|APPROXIMATE_FROM, run)\b", p.read_text()))
               for p in files)
    assert runs >= 13  # each command calls its bench's run


def _bench_commands() -> dict[str, object]:
    from rag import cli

    cli.app  # registers every command  # noqa: B018
    return {c.name: c.callback for c in cli.common.bench_app.registered_commands}


def test_every_bench_command_is_a_module_with_run_and_main():
    commands = _bench_commands()
    assert {"ttft", "chat", "peer", "serve", "answers", "page", "splice", "reuse", "retrieval", "formats", "engine",
            "search", "faults"} <= set(commands)
    for name in commands:
        module = importlib.import_module(f"rag.bench.{name}")
        assert callable(getattr(module, "run", None)), f"rag.bench.{name} has no run()"
        assert callable(getattr(module, "main", None)), f"rag.bench.{name} has no main()"


def _options(help_text: str) -> set[str]:
    return set(re.findall(r"--[a-z][a-z0-9-]*", help_text)) - {"--help"}


@pytest.mark.parametrize("name", ["ttft", "serve", "answers"])
def test_a_bench_runs_alone_with_the_commands_options(name):
    env = os.environ | {"COLUMNS": "200", "TERM": "dumb", "NO_COLOR": "1"}
    alone = subprocess.run([sys.executable, "-m", f"rag.bench.{name}", "--help"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)
    assert alone.returncode == 0, alone.stderr
    assert f"python -m rag.bench.{name}" in alone.stdout and "Traceback" not in alone.stderr
    from rag import cli

    within = CliRunner().invoke(cli.app, ["bench", name, "--help"], env={"COLUMNS": "200"}, terminal_width=200)
    assert within.exit_code == 0
    assert _options(alone.stdout) == _options(within.stdout) and "--json" in _options(alone.stdout)

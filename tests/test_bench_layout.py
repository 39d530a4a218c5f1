"""The bench commands are a thin layer: ``rag/cli/bench*.py`` parse, call
``rag.bench.NAME.run`` and print; they build no pipeline, server or engine.
Each bench module also runs alone as ``python -m rag.bench.NAME``, with the
options of ``rag bench NAME``. And the tests reach the benches only through
their commands: no module under tests/ imports the bench package (test
support lives in tests/support, issue 56). The bench modules are read here
as source, not imported."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / "rag" / "cli"
BENCH = ROOT / "rag" / "bench"
TESTS = ROOT / "tests"
PACKAGE = "rag.bench"  # what no test may import
# What only a bench's own module may reach: the pipeline, the service, the index, the engine.
BUILDERS = ("rag.qa.pipeline", "rag.service", "rag.index", "rag.ingest", "rag.resident", "engine")
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


def _top_level(path: Path) -> tuple[set[str], ast.Module]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, tree


def test_every_bench_command_is_a_module_with_run_and_main():
    commands = _bench_commands()
    assert {"ttft", "chat", "peer", "serve", "answers", "page", "splice", "reuse", "retrieval", "engine",
            "search", "faults"} <= set(commands)
    assert "formats" not in commands  # a developer's script now: python -m tests.tools.bench_formats
    for name in commands:
        path = BENCH / f"{name}.py"
        assert path.is_file(), f"rag bench {name} has no module {path.relative_to(ROOT)}"
        functions, tree = _top_level(path)
        assert {"run", "main"} <= functions, f"{path.relative_to(ROOT)} lacks run() or main()"
        # main() is ``rag bench NAME`` alone (setup.command_alone(NAME)), run under ``python -m``.
        main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
        calls = [c for c in ast.walk(main) if isinstance(c, ast.Call) and getattr(c.func, "attr", None) == "command_alone"]
        assert [c.args[0].value for c in calls] == [name], f"{path.relative_to(ROOT)}: main() runs another command"
        assert any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body), path


def _options(help_text: str) -> set[str]:
    return set(re.findall(r"--[a-z][a-z0-9-]*", help_text)) - {"--help"}


@pytest.mark.parametrize("name", ["ttft", "serve", "answers"])
def test_a_bench_command_prints_its_options_and_json(name):
    from rag import cli

    within = CliRunner().invoke(cli.app, ["bench", name, "--help"], env={"COLUMNS": "200"}, terminal_width=200)
    assert within.exit_code == 0
    assert "--json" in _options(within.stdout)
    listing = CliRunner().invoke(cli.app, ["bench", "--help"], env={"COLUMNS": "200"}, terminal_width=200)
    assert listing.exit_code == 0 and re.search(rf"\b{name}\b", listing.stdout)


def bench_imports_in(source: str, name: str = "tests/test_x.py") -> list[str]:
    """Where ``source`` (a module under tests/) reaches the bench package:
    an import of it or of a module in it, ``importlib.import_module`` of
    one, or ``python -m`` of one; one line each."""
    def bench(module: str) -> bool:
        return module == PACKAGE or module.startswith(PACKAGE + ".")

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"{name}:{node.lineno}: import {a.name}" for a in node.names if bench(a.name)]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            module = node.module or ""
            if bench(module) or (module == "rag" and any(a.name == "bench" for a in node.names)):
                found.append(f"{name}:{node.lineno}: from {module} import ...")
        elif isinstance(node, ast.Call):
            called = getattr(node.func, "attr", getattr(node.func, "id", ""))
            named = node.args[:1] if called in ("import_module", "__import__") else []
            for listed in (a for a in node.args if isinstance(a, (ast.List, ast.Tuple))):  # a command line
                after_m = [b for a, b in zip(listed.elts, listed.elts[1:])
                           if isinstance(a, ast.Constant) and a.value == "-m"]
                named += after_m
            for text in named:
                value = text.value if isinstance(text, ast.Constant) else "".join(
                    v.value for v in getattr(text, "values", ()) if isinstance(v, ast.Constant))
                if isinstance(value, str) and bench(value):
                    found.append(f"{name}:{node.lineno}: runs {value!r}")
    return found


def test_the_check_finds_each_way_a_test_reaches_the_benches():
    reaching = """
import PKG.ttft
from PKG.serve import bench_serve
from rag import LEAF
import importlib
importlib.import_module("PKG.chat")
subprocess.run([sys.executable, "-m", f"PKG.{name}", "--help"])
"""
    found = bench_imports_in(reaching.replace("PKG", PACKAGE).replace("LEAF", PACKAGE.split(".")[1]))
    assert [f.split(":")[1] for f in found] == ["2", "3", "4", "6", "7"], found
    assert bench_imports_in(f'"""See {PACKAGE}.ttft."""\nfrom rag import cli\nrun("bench", "ttft")\n') == []


def test_no_test_reaches_the_bench_package():
    modules = sorted(TESTS.rglob("*.py"))
    assert len(modules) > 80
    found = [f for path in modules
             for f in bench_imports_in(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    assert not found, "\n".join(found)

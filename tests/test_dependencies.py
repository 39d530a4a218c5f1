"""Every third-party package the code imports is declared in pyproject.toml,
so a clean install has it (httpx and langchain-core once were not)."""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("rag", "prompt_budget", "engine")


def _imported_top_levels() -> set[str]:
    names: set[str] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names.update(a.name.split(".")[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - set(PACKAGES) - {"__future__"}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_imported_package_is_a_declared_dependency():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = {_normal(re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0]) for d in project["dependencies"]}
    optional = {_normal(re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0])
                for extra in ("bench", "ocr", "postgres", "router") for d in project["optional-dependencies"][extra]}
    providers = md.packages_distributions()
    missing = {}
    for name in sorted(_imported_top_levels()):
        dists = {_normal(d) for d in providers.get(name, [name])}
        if not dists & (declared | optional):
            missing[name] = sorted(dists)
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"

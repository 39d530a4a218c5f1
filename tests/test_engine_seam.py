"""The engine seam says all it is (issue 56): every keyword the question's
path passes to ``generate`` is in the ``Backend`` protocol or in the declared
optional ability that adds it, each engine's ``generate`` takes what its
abilities declare, and no front end probes an engine with ``getattr``."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from engine.backend import Backend, ExactPassages, PassageKV, Replicated, StepCounters, TakesPassages
from engine.fake import FakeBackend
from engine.llama_cpp.backend import LlamaCppBackend
from engine.remote.backend import RemoteBackend

ROOT = Path(__file__).resolve().parent.parent


def _keywords(function) -> set[str]:
    return {name for name, p in inspect.signature(function).parameters.items() if p.kind is p.KEYWORD_ONLY}


@pytest.mark.parametrize("engine", [LlamaCppBackend, RemoteBackend, FakeBackend])
def test_every_engine_takes_what_the_protocol_declares(engine):
    assert _keywords(Backend.generate) <= _keywords(engine.generate)
    if {"stored_passages", "held_passages"} & set(dir(engine)):  # a passage engine (PassageKV, ExactPassages)
        assert _keywords(TakesPassages.generate) <= _keywords(engine.generate)


def test_the_abilities_are_declared_where_the_engines_have_them():
    assert {"passages", "collection"} == _keywords(TakesPassages.generate) - _keywords(Backend.generate)
    assert hasattr(LlamaCppBackend, "stored_passages") and hasattr(LlamaCppBackend, "held_passages")
    assert all(hasattr(RemoteBackend, name) for name in ("parallel", "router_facts"))
    assert hasattr(LlamaCppBackend, "engine_stats") and not hasattr(FakeBackend, "engine_stats")
    assert not isinstance(FakeBackend(), (Replicated, StepCounters, PassageKV, ExactPassages))


def _getattr_probes(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr") and node.args:
            target = ast.unparse(node.args[0])
            if "backend" in target or "engine" in target:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    return found


def test_no_front_end_probes_the_engine_with_getattr():
    folders = ("rag/qa", "rag/service", "rag/resident", "rag/mcp", "rag/cli", "rag/integrations")
    probes = [p for folder in folders for path in sorted((ROOT / folder).rglob("*.py")) for p in _getattr_probes(path)]
    assert probes == []

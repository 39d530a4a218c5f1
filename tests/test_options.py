"""AskOptions and Settings: one validation of a question's options and of
the set-up, with errors that name what to fix."""

from __future__ import annotations

import math

import pytest

from rag.errors import RagError
from rag.qa.options import MAX_CANDIDATES, AskOptions
from rag.settings import Settings


@pytest.mark.parametrize(
    "changes, fragment",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"candidates": 0}, "candidates"),
        ({"candidates": MAX_CANDIDATES + 1}, "candidates"),
        ({"target_ttft": math.nan}, "target_ttft"),
        ({"target_ttft": math.inf}, "target_ttft"),
        ({"target_ttft": -1.0}, "target_ttft"),
        ({"min_k": 3, "max_k": 2}, "min_k"),
        ({"session": "has spaces"}, "session id"),
        ({"retrieval": "magic"}, "retrieval"),
        ({"colour": "blue"}, "colour"),
    ],
)
def test_bad_options_are_one_error_naming_the_option(changes, fragment):
    with pytest.raises(RagError, match=fragment):
        AskOptions.of(**changes)


def test_options_are_frozen_and_resolve_the_target():
    options = AskOptions.of(max_tokens=12)
    with pytest.raises(Exception):
        options.max_tokens = 3  # type: ignore[misc]
    assert options.target(2.0) == 2.0
    assert AskOptions.of(options, target_ttft=0.5).target(2.0) == 0.5
    assert AskOptions.of(options, no_target=True).target(2.0) is None
    assert AskOptions.of(options, session="work-1").max_tokens == 12  # changes keep the rest


def test_settings_come_from_variables_and_flags_override_them(monkeypatch, tmp_path):
    monkeypatch.setenv("RAG_INDEX", str(tmp_path / "from-env"))
    monkeypatch.setenv("RAG_TARGET_TTFT", "1.5")
    monkeypatch.setenv("RAG_RETRIEVAL", "bm25")
    monkeypatch.setenv("RAG_KV_TYPE", "q8_0")
    s = Settings.load()
    assert s.index_folder == tmp_path / "from-env" and s.target_ttft == 1.5 and s.retrieval == "bm25"
    assert s.engine.kv_type == "q8_0"
    flagged = Settings.load(index=tmp_path / "flag", target_ttft=0.7, retrieval=None)
    assert flagged.index_folder == tmp_path / "flag" and flagged.target_ttft == 0.7 and flagged.retrieval == "bm25"
    monkeypatch.setenv("RAG_TARGET_TTFT", "none")
    assert Settings.load().target_ttft is None


@pytest.mark.parametrize("name, value, fragment", [
    ("RAG_TARGET_TTFT", "soon", "RAG_TARGET_TTFT"),
    ("RAG_TARGET_TTFT", "nan", "RAG_TARGET_TTFT"),
    ("RAG_RETRIEVAL", "magic", "RAG_RETRIEVAL"),
    ("RAG_GPU_LAYERS", "-5", "RAG_GPU_LAYERS"),
    ("RAG_SPLICE_FRESH", "-1", "RAG_SPLICE_FRESH"),
    ("RAG_SPLICE_FRESH", "many", "RAG_SPLICE_FRESH"),
    ("RAG_PASSAGE_RAM_BYTES", "-1", "RAG_PASSAGE_RAM_BYTES"),
])
def test_a_bad_variable_is_named(monkeypatch, name, value, fragment):
    monkeypatch.setenv(name, value)
    with pytest.raises(RagError, match=fragment):
        Settings.load()


def test_a_bad_flag_is_named_as_the_flag():
    with pytest.raises(RagError, match="--target-ttft"):
        Settings.load(target_ttft=-2.0)


def test_passage_kv_settings_reach_the_engine_settings(monkeypatch):
    assert Settings.load().engine.splice_fresh is None  # off by default (README: rag bench splice)
    monkeypatch.setenv("RAG_SPLICE_FRESH", "16")
    monkeypatch.setenv("RAG_PASSAGE_DISK_BYTES", str(1 << 20))
    s = Settings.load()
    assert (s.engine.splice_fresh, s.engine.passage_disk_bytes, s.engine.passage_ram_bytes) == (16, 1 << 20, 1 << 30)
    assert Settings.load(splice_fresh="off").engine.splice_fresh is None  # the flag overrides the variable
    assert Settings.load(splice_fresh="0").engine.splice_fresh == 0
    with pytest.raises(RagError, match="--splice-fresh"):
        Settings.load(splice_fresh="-3")

"""AskOptions and Settings: one validation of a question's options and of
the set-up, with errors that name what to fix."""

from __future__ import annotations

import inspect
import math

import pytest

from engine.opening import open_backend
from engine.settings import EngineSettings
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
    ("RAG_SLOTS", "0", "RAG_SLOTS"),
    ("RAG_KV_TYPE", "q4", "RAG_KV_TYPE"),
    ("RAG_N_CTX", "100", "RAG_N_CTX"),
    ("RAG_ENGINE_ROUTING", "nearest", "RAG_ENGINE_ROUTING"),
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


def test_resolved_options_take_the_set_ups_defaults_once():
    settings = Settings(target_ttft=1.5, retrieval="bm25", evidence_floor=0.3)
    plain = AskOptions.of().resolved(settings)
    assert (plain.target(), plain.retrieval, plain.evidence_floor) == (1.5, "bm25", 0.3)
    own = AskOptions.of(target_ttft=0.5, retrieval="dense", evidence_floor=0.0).resolved(settings)
    assert (own.target(), own.retrieval, own.evidence_floor) == (0.5, "dense", 0.0)
    assert AskOptions.of(no_target=True).resolved(settings).target() is None
    assert AskOptions.of().resolved(Settings(target_ttft="none")).no_target  # no target anywhere: none
    assert plain.resolved(Settings(target_ttft=3.0)).target() == 1.5  # resolved once: kept after


@pytest.fixture
def no_engine_variables(monkeypatch):
    for name in EngineSettings.model_fields:
        monkeypatch.delenv(f"RAG_{name.upper()}", raising=False)


def test_each_engine_default_is_declared_once(no_engine_variables):
    """The engine's options are one field of the settings, not copies of
    EngineSettings' fields; their defaults are EngineSettings', and the
    in-process backend and open_backend take the settings object, not the
    fields one by one."""
    from engine.llama_cpp.backend import LlamaCppBackend

    assert Settings().engine == EngineSettings() == Settings.load().engine
    assert not set(Settings.model_fields) & set(EngineSettings.model_fields)
    assert not set(inspect.signature(LlamaCppBackend).parameters) & set(EngineSettings.model_fields)
    assert not set(inspect.signature(open_backend).parameters) & set(EngineSettings.model_fields)


def test_flat_variables_and_flags_land_in_the_engine_settings(monkeypatch, no_engine_variables):
    monkeypatch.setenv("RAG_SLOTS", "3")
    monkeypatch.setenv("RAG_GPU_LAYERS", "0")
    monkeypatch.setenv("RAG_N_CTX", "1024")
    monkeypatch.setenv("RAG_ENGINE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("rag_exact_passages", "false")  # the names are not case-sensitive, as the others
    engine = Settings.load().engine
    assert (engine.slots, engine.gpu_layers, engine.n_ctx, engine.engine_url, engine.exact_passages) == \
        (3, 0, 1024, "http://127.0.0.1:9", False)
    flagged = Settings.load(slots=5, kv_type="q8_0", gpu_layers=None).engine  # None: the flag was not given
    assert (flagged.slots, flagged.kv_type, flagged.gpu_layers, flagged.n_ctx) == (5, "q8_0", 0, 1024)
    given = Settings.load(engine=EngineSettings(slots=2)).engine  # an engine given whole is taken as it is
    assert given == EngineSettings(slots=2)
    with pytest.raises(RagError, match="^slots: "):  # a flag without a name of its own is named as the field
        Settings.load(slots=0)


def test_a_flat_engine_attribute_still_reads_with_a_warning(no_engine_variables):
    settings = Settings.load(slots=4)
    with pytest.warns(DeprecationWarning, match="Settings.engine.slots"):
        assert settings.slots == 4
    with pytest.raises(AttributeError):
        _ = settings.no_such_setting


def test_engine_settings_change_into_a_validated_copy():
    from engine.errors import EngineSettingsError

    settings = EngineSettings(slots=3)
    assert settings.changed(n_ctx=1024, splice_fresh="off") == EngineSettings(slots=3, n_ctx=1024)
    with pytest.raises(EngineSettingsError, match="slots"):
        settings.changed(slots=0)
    with pytest.raises(TypeError, match="n_gpu_layers.*gpu_layers"):
        settings.changed(n_gpu_layers=0)


def test_an_unknown_backend_keyword_names_what_it_takes():
    from engine.llama_cpp.backend import LlamaCppBackend

    with pytest.raises(TypeError, match=r"n_gpu_layers.*gpu_layers.*snapshot_dir"):
        LlamaCppBackend(n_gpu_layers=0)  # refused before any model is read

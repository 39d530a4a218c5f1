"""A damaged index, on copies of a real one: each damage is detected, named,
and survived by answering from the last intact generation; an ingest
repairs it; doctor verifies every generation. And damaged caches: dropped
or set aside, never loaded, never a traceback."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from rag.conversations import ConversationStore
from rag.errors import RagError

from .conftest import write_corpus

EXTRA = {"extra.md": "# Zebras\n\nZebras have black and white stripes that confuse biting flies.\n"}


@pytest.fixture(scope="module")
def two_generations(tmp_path_factory, embedder):
    """An index whose live generation (2) holds one file more than the one before it (1)."""
    from rag.ingest import ingest
    from rag.ingest.chunking import Chunker

    root = tmp_path_factory.mktemp("damage")
    corpus = write_corpus(root / "corpus")
    index = root / "index"
    chunker = Chunker(embedder.count_tokens)
    ingest(index, [corpus], embedder=embedder, chunker=chunker)
    write_corpus(corpus, EXTRA)
    ingest(index, [corpus], embedder=embedder, chunker=chunker)
    assert sorted(p.name for p in index.glob("gen-*")) == ["gen-000001", "gen-000002"]
    return index, corpus


def _garbage(path: Path) -> None:
    path.write_bytes(np.random.default_rng(1).bytes(max(path.stat().st_size, 64)))


def _truncate(path: Path) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size // 2)


def _zero(path: Path) -> None:
    path.write_bytes(bytes(path.stat().st_size))


DAMAGES = {
    "vectors truncated": ("gen-000002/vectors.faiss", _truncate),
    "vectors zeroed": ("gen-000002/vectors.faiss", _zero),
    "vectors garbage": ("gen-000002/vectors.faiss", _garbage),
    "chunks truncated": ("gen-000002/chunks.sqlite", _truncate),
    "chunks zeroed": ("gen-000002/chunks.sqlite", _zero),
    "chunks garbage": ("gen-000002/chunks.sqlite", _garbage),
    "manifest garbage": ("gen-000002/manifest.json", _garbage),
    "CURRENT empty": ("CURRENT", lambda p: p.write_text("")),
    "CURRENT names a missing generation": ("CURRENT", lambda p: p.write_text("gen-000099\n")),
}


@pytest.mark.parametrize("case", sorted(DAMAGES))
def test_a_damaged_generation_falls_back_to_the_last_intact_one(case, two_generations, tmp_path, run):
    index, corpus = two_generations
    copy = tmp_path / "index"
    shutil.copytree(index, copy)
    name, damage = DAMAGES[case]
    damage(copy / name)
    result = run("search", "bread dough rise", "--index", copy, "--json")
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    sources = {r["source"] for r in json.loads(result.stdout)["results"]}
    if name == "CURRENT":  # the newest intact generation answers
        assert "extra.md" in sources and "answering from gen-000002" in result.stderr
    else:  # the generation before the damaged one
        assert "guide/cooking.rst" in sources and "extra.md" not in sources
        assert "answering from gen-000001" in result.stderr
        assert name.split("/")[1].split(".")[0] in result.stderr  # the damaged file is named
    assert "rag ingest --rebuild" in result.stderr
    doctor = json.loads(run("doctor", "--index", copy, "--json").stdout)
    assert doctor["index"]["integrity"]["gen-000001"] == "ok"
    if name.startswith("gen-000002/"):
        assert doctor["index"]["integrity"]["gen-000002"] != "ok"
    repaired = run("ingest", corpus, "--index", copy)
    assert repaired.exit_code == 0, repaired.output
    healed = run("search", "zebra stripes", "--index", copy, "--json")
    assert healed.exit_code == 0 and "gen-0000" not in healed.stderr
    assert json.loads(healed.stdout)["results"][0]["source"] == "extra.md"


def test_a_stale_bm25_folder_is_detected_and_not_used(two_generations, tmp_path, run):
    index, _ = two_generations
    copy = tmp_path / "index"
    shutil.copytree(index, copy)
    shutil.rmtree(copy / "gen-000002" / "bm25")
    shutil.copytree(copy / "gen-000001" / "bm25", copy / "gen-000002" / "bm25")
    result = run("search", "zebra stripes", "--index", copy, "--retrieval", "bm25", "--json")
    assert result.exit_code == 0, result.output
    assert "bm25" in result.stderr and "rebuilt" in result.stderr
    assert json.loads(result.stdout)["results"][0]["source"] == "extra.md"


def test_no_intact_generation_is_a_clear_error_and_rebuild_repairs_it(two_generations, tmp_path, run):
    index, corpus = two_generations
    copy = tmp_path / "index"
    shutil.copytree(index, copy)
    for generation in ("gen-000001", "gen-000002"):
        _garbage(copy / generation / "vectors.faiss")
    from .conftest import assert_clean_error

    assert_clean_error(run("search", "bread", "--index", copy), "no intact index generation", "--rebuild")
    assert_clean_error(run("ingest", corpus, "--index", copy), "--rebuild")
    rebuilt = run("ingest", corpus, "--index", copy, "--rebuild")
    assert rebuilt.exit_code == 0, rebuilt.output
    assert run("search", "bread", "--index", copy).exit_code == 0


def test_damaged_kv_snapshots_are_dropped_with_a_line_in_the_log(tmp_path, caplog):
    import struct

    from engine.llama_cpp.snapshots import MAGIC, Snapshot, SnapshotCache

    good = SnapshotCache(1 << 20, tmp_path, 1 << 20)
    good.put("fine", Snapshot(np.arange(4, dtype=np.int32), b"state"))
    assert good.flush()

    def write(name: str, header: object, tail: bytes = b"") -> Path:
        raw = json.dumps(header).encode()
        path = tmp_path / name
        path.write_bytes(MAGIC + struct.pack("<I", len(raw)) + raw + tail)
        return path

    bad = [write("list.kv", [1, 2, 3]), write("huge.kv", {"format": 1, "key": "x", "n_tokens": 10**30,
                                                           "data_bytes": 0}),
           write("short.kv", {"format": 1, "key": "y", "n_tokens": 5, "data_bytes": 9}, b"\x00" * 4)]
    (tmp_path / "junk.kv").write_bytes(b"\xff" * 3)
    with caplog.at_level(logging.WARNING, logger="rag_budget.cache"):
        cache = SnapshotCache(1 << 20, tmp_path, 1 << 20)
    assert cache.disk_keys() == ["fine"] and cache.get("fine").data == b"state"
    assert all(not p.exists() for p in bad)
    assert sum("dropped a damaged KV snapshot" in r.message for r in caplog.records) == 4


def test_a_damaged_profile_is_set_aside_and_measured_again(tmp_path, caplog):
    from prompt_budget.profile import load_profile, profile_path

    key = {"engine": "test"}
    for content in ("[1, 2]", "{not json", '{"format": "rag-budget-prefill-profile", "version": 1, "key": {}, '
                                           '"fit": {"form": "linear", "coef": [NaN, 1], "samples": 3}}'):
        path = profile_path(tmp_path, key)
        path.write_text(content)
        with caplog.at_level(logging.WARNING, logger="rag_budget.cache"):
            assert load_profile(tmp_path, key) is None
        assert not path.exists() and path.with_name(path.name + ".damaged").read_text() == content
    assert sum("set aside an unusable prefill profile" in r.message for r in caplog.records) == 3


def test_a_damaged_conversation_store_is_refused_and_left_in_place(tmp_path):
    path = tmp_path / "conversations.sqlite"
    store = ConversationStore(path)
    store.append_next("s1", "q?", "q?", "a.", 3)
    store.close()
    _garbage(path)
    before = path.read_bytes()
    with pytest.raises(RagError, match="left as it is"):
        ConversationStore(path)
    assert path.read_bytes() == before

"""The service's key file: holders, rights per collection, keys kept hashed."""

from __future__ import annotations

import json

import pytest

from rag.errors import RagError
from rag.service.keys import EVERY_COLLECTION, KeyRing, key_hash, new_key


def _ring(tmp_path, keys: dict, suffix: str = ".json") -> KeyRing:
    path = tmp_path / f"keys{suffix}"
    path.write_text(json.dumps({"keys": keys}), encoding="utf-8")
    return KeyRing.read(path)


def test_a_key_file_gives_each_holder_its_rights_per_collection(tmp_path):
    alice, bob = new_key()[0], new_key()[0]
    ring = _ring(tmp_path, {
        "alice": {"sha256": key_hash(alice), "collections": {"handbook": "write", "board": "read"}},
        "bob": {"sha256": key_hash(bob), "collections": {EVERY_COLLECTION: "read"}},
    })
    a, b = ring.caller(alice), ring.caller(bob)
    assert a.holder == "alice" and a.may_write("handbook") and a.may_read("board") and not a.may_write("board")
    assert not a.may_read("payroll")
    assert b.holder == "bob" and b.may_read("payroll") and not b.may_write("handbook")
    assert ring.caller("rag_" + "x" * 43) is None and ring.caller("") is None


def test_a_toml_key_file_reads_as_its_json_twin(tmp_path):
    key, digest = new_key()
    path = tmp_path / "keys.toml"
    path.write_text(f'[keys.carol]\nsha256 = "{digest}"\ncollections = {{ docs = "write" }}\n', encoding="utf-8")
    assert KeyRing.read(path).caller(key).may_write("docs")


def test_the_file_holds_no_key_itself_only_its_hash(tmp_path):
    key, digest = new_key()
    assert key not in digest and len(digest) == 64 and key_hash(key) == digest
    assert new_key()[0] != key  # random, not derived


def test_plain_api_keys_may_do_everything():
    ring = KeyRing.plain(["k1", "k2"])
    assert ring.caller("k2").may_write("anything") and ring.caller("k3") is None


@pytest.mark.parametrize("entry, words", [
    ({"sha256": "abc"}, "64 hex digits"),
    ({"sha256": "0" * 64, "collections": {"docs": "admin"}}, '"read" or "write"'),
    ({"sha256": "0" * 64, "collections": {"Bad Name": "read"}}, "cannot name a collection"),
    ("not a table", "not a table"),
])
def test_a_wrong_key_file_is_refused_naming_the_holder_and_the_fault(tmp_path, entry, words):
    with pytest.raises(RagError, match="keys.dave") as caught:
        _ring(tmp_path, {"dave": entry})
    assert words in str(caught.value)


def test_a_missing_or_empty_key_file_is_refused(tmp_path):
    with pytest.raises(RagError, match="cannot read"):
        KeyRing.read(tmp_path / "absent.json")
    with pytest.raises(RagError, match="names no keys"):
        _ring(tmp_path, {})


def test_rag_keys_new_prints_a_key_and_the_entry_that_accepts_it(tmp_path):
    from typer.testing import CliRunner

    from rag.cli import _app

    result = CliRunner().invoke(_app(), ["keys", "new", "erin", "--collection", "docs:write", "--collection", "*:read"])
    assert result.exit_code == 0, result.output
    key, *entry = result.stdout.strip().splitlines()
    path = tmp_path / "keys.toml"
    path.write_text("\n".join(entry) + "\n", encoding="utf-8")
    erin = KeyRing.read(path).caller(key)
    assert erin.holder == "erin" and erin.may_write("docs") and erin.may_read("other") and not erin.may_write("other")
    assert key not in path.read_text(encoding="utf-8")


def test_the_serve_benchs_team_asks_each_collection_with_its_own_key(run, corpus, tmp_path):
    # `rag bench serve --collections 2`: a key file gives each client's key the right to read one
    # collection; a key without it would be refused (403), an error row.
    result = run("bench", "serve", "--corpus", corpus, "--include", "*", "--index", tmp_path / "index",
                 "--collections", "2", "--clients", "2", "--requests", "2", "--max-tokens", "1", "--slots", "2",
                 "--system", "scheduler", "--target-ttft", "60", "--json")
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    (only,) = d["summary"]["runs"]
    assert d["config"]["collections"] == ["default", "second"] and only["errors"] == 0 and only["served"] == 2
    assert sorted(r["collection"] for r in d["rows"]) == ["default", "second"]

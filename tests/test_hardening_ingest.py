"""Ingest under bad input, on real files: names that are not UTF-8, named
pipes, symlinks to devices, unreadable folders, files over the size limit,
and globs as a user writes them. No hang, no traceback, nothing lost."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rag.errors import RagError
from rag.ingest import find_files, ingest

from .conftest import indexed_sources, write_corpus


def _records(index_location: Path, embedder) -> list:
    from rag.index.store import FolderIndex

    index = FolderIndex.open(index_location, embedder=embedder.name, dim=embedder.dim)
    try:
        return list(index.files().values())
    finally:
        index.close()


def test_special_files_and_bad_names_are_reported_not_read(tmp_path, embedder, chunker):
    corpus = write_corpus(tmp_path / "corpus")
    os.mkfifo(corpus / "pipe.md")  # reading it would wait forever
    (corpus / "zero.txt").symlink_to("/dev/zero")  # reading it would never end
    (corpus / os.fsdecode(b"caf\xe9 \xff\xfe.md")).write_text("Espresso is brewed under pressure.\n")
    (corpus / "huge.txt").open("wb").truncate(50 << 20)  # 50 MB, sparse
    report = ingest(tmp_path / "index", [corpus], embedder=embedder, chunker=chunker, max_file_bytes=16 << 20)
    ignored = dict(report.ignored)
    assert "named pipe" in ignored["pipe.md"] and "character device" in ignored["zero.txt"]
    assert "--max-file-mb" in ignored["huge.txt"]
    assert "caf\\xe9 \\xff\\xfe.md" in report.added  # indexed under a printable name
    json.dumps(report.to_dict())  # every name can be written out
    again = ingest(tmp_path / "index", [corpus], embedder=embedder, chunker=chunker, max_file_bytes=16 << 20)
    assert again.added == [] and again.removed == [] and "caf\\xe9 \\xff\\xfe.md" in again.skipped


def test_names_that_differ_only_in_bytes_that_are_not_utf8_do_not_collide_silently(tmp_path, embedder, chunker):
    """A file named ``b"caf\\xe9.md"`` (Latin-1, not UTF-8) and one really
    named with the four characters ``\\xe9`` get the same printable name: one is indexed,
    the other reported with its reason, in a folder and named directly;
    nothing is merged or dropped unsaid (issue 27)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    raw, spelled = corpus / os.fsdecode(b"caf\xe9.md"), corpus / "caf\\xe9.md"
    raw.write_text("Espresso is brewed under pressure.\n")
    spelled.write_text("Filter coffee drips through paper.\n")
    for n, given in enumerate(([corpus], [raw, spelled], [spelled, raw])):
        index = tmp_path / f"index-{n}"
        report = ingest(index, given, embedder=embedder, chunker=chunker)
        assert report.added == ["caf\\xe9.md"]
        (why,) = [reason for source, reason in report.ignored if source == "caf\\xe9.md"]
        assert "rename one" in why and "\n" not in why
        # The file indexed is the one its name leads back to, whichever was given first.
        (record,) = _records(index, embedder)
        assert record.sha256 == hashlib.sha256(spelled.read_bytes()).hexdigest()
        again = ingest(index, given, embedder=embedder, chunker=chunker)
        assert again.added == again.removed == [] and [s for s, _ in again.ignored] == ["caf\\xe9.md"]


def _ingest_without_root_powers(corpus: Path, index: Path, *extra: str) -> subprocess.CompletedProcess:
    """`rag ingest` in a new process that folder permissions apply to: as
    root, with the capabilities that override them dropped (setpriv)."""
    env = os.environ | {"HF_HUB_OFFLINE": "1", "XDG_CACHE_HOME": str(index.parent / "cache"),
                        "XDG_DATA_HOME": str(index.parent / "data")}
    code = "import sys; sys.argv[0] = 'rag'; from rag.cli import main; main()"
    command = [sys.executable, "-c", code, "ingest", str(corpus), "--index", str(index), *extra]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: folder permissions cannot apply")
        command = [setpriv, "--bounding-set=-dac_override,-dac_read_search", *command]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600,
                          cwd=Path(__file__).resolve().parent.parent)


@pytest.mark.model  # starts rag in processes of its own, which load the models
def test_an_unreadable_folder_is_reported_and_its_indexed_files_are_kept(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    index = tmp_path / "index"
    first = _ingest_without_root_powers(corpus, index)
    assert first.returncode == 0, first.stderr
    (corpus / "guide").chmod(0)
    try:
        second = _ingest_without_root_powers(corpus, index, "--json")
        fresh = _ingest_without_root_powers(corpus, tmp_path / "index2")  # a first ingest says so too
    finally:
        (corpus / "guide").chmod(0o755)
    assert "Traceback" not in second.stderr and second.returncode == 1
    report = json.loads(second.stdout)
    assert report["removed"] == 0 and any("cannot list" in f["error"] for f in report["failures"])
    assert fresh.returncode == 1 and "cannot list this folder" in fresh.stderr and "Traceback" not in fresh.stderr


def test_globs_as_people_write_them(tmp_path, embedder, chunker):
    corpus = write_corpus(tmp_path / "corpus", {"A.md": "# A\n\nAlpha.\n", "B.MD": "# B\n\nBeta.\n",
                                               "sub/c.md": "# C\n\nGamma.\n", "sub/d.txt": "Delta.\n"})
    assert {f.source for f in find_files([corpus], include=["*.md"]).files} == {"A.md", "B.MD", "sub/c.md"}
    assert {f.source for f in find_files([corpus], include=["**/*.md"]).files} == {"A.md", "B.MD", "sub/c.md"}
    assert {f.source for f in find_files([corpus], include=["sub/**"]).files} == {"sub/c.md", "sub/d.txt"}
    named = find_files([corpus / "A.md", corpus / "sub" / "d.txt"], exclude=["*.txt"])
    assert [f.source for f in named.files] == ["A.md"]
    assert find_files([corpus], include=["*.rst"]).unmatched == ["*.rst"]
    with pytest.raises(RagError, match="more than 4"):
        find_files([corpus], exclude=["**/" * 12 + "x"])  # would take exponential time to match
    with pytest.raises(RagError, match="not a usable glob"):
        find_files([corpus], include=["[z-a]"])
    index = tmp_path / "index"
    ingest(index, [corpus], embedder=embedder, chunker=chunker)
    narrowed = ingest(index, [corpus], embedder=embedder, chunker=chunker, include=["*.md"])
    assert narrowed.removed == ["sub/d.txt"]
    assert indexed_sources(index, embedder) == {"A.md", "B.MD", "sub/c.md"}


def test_the_command_line_reports_every_file_it_passed_over(run, tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    os.mkfifo(corpus / "pipe.md")
    (corpus / "big.md").write_text("word " * 5000)
    result = run("ingest", corpus, "--index", tmp_path / "index", "--max-file-mb", "0.01", "--include", "*.md",
                 "--include", "*.nothing")
    assert result.exit_code == 0, result.output
    assert "skipped: pipe.md: a named pipe" in result.stderr
    assert "skipped: big.md:" in result.stderr and "--max-file-mb" in result.stderr
    assert "'*.nothing' matched no file" in result.stderr
    bad = run("ingest", corpus, "--index", tmp_path / "index", "--max-file-mb", "-1")
    assert bad.exit_code == 1 and "--max-file-mb" in bad.stderr and "Traceback" not in bad.output


def test_a_file_whose_name_is_not_utf8_is_found_again_by_its_printable_name(tmp_path, embedder, chunker):
    """The index spells ``b"caf\\xe9.md"`` as ``caf\\xe9.md``; reading the
    document back (``/v1/documents/{id}/file``, ``/text``) finds the file
    that name stands for, and a file really named so still comes first."""
    from rag.ingest.content import DocumentFile, file_in

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    raw = corpus / os.fsdecode(b"caf\xe9.md")
    raw.write_text("Espresso is brewed under pressure.\n")
    index = tmp_path / "index"
    assert ingest(index, [corpus], embedder=embedder, chunker=chunker).added == ["caf\\xe9.md"]
    (record,) = _records(index, embedder)
    found = DocumentFile("id", record.source, file_in(record.root, record.source), record.sha256)
    assert found.read() == raw.read_bytes() and found.text().current
    spelled = corpus / "caf\\xe9.md"
    spelled.write_text("Filter coffee drips through paper.\n")
    assert file_in(record.root, record.source) == spelled

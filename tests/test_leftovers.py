"""What careless hands and killed processes leave (issue 37): a lock file
that is a link or a folder, a damaged BM25 folder, a half-built generation,
a killed server's socket, lock and start files. On a real index and the
real service over HTTP; every check counts files, calls or answers."""

from __future__ import annotations

import fcntl
import os
import socket

import httpx
import pytest

from rag.index import lexical as lexical_module
from rag.index.store import FolderIndex
from rag.service import LoopbackServer, ServiceSettings, create_app

from .conftest import prepared_pipeline, write_corpus


@pytest.fixture(scope="module")
def served(tmp_path_factory, embedder, backend):
    p = prepared_pipeline(tmp_path_factory.mktemp("leftovers"), embedder, backend)
    s = LoopbackServer(create_app(p, ServiceSettings(rate_limit_per_minute=0)))
    yield p, s
    s.stop()
    p.close()


def _upload(server, name: str, text: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/documents", files={"file": (name, text.encode("utf-8"))}, timeout=300)


def test_an_uploads_lock_that_is_a_link_is_replaced_and_the_upload_served(served, tmp_path):
    pipeline, server = served
    target = tmp_path / "elsewhere"
    target.write_text("not a lock\n")
    folder = pipeline.library.uploads_dir
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ".lock").unlink(missing_ok=True)
    (folder / ".lock").symlink_to(target)
    answer = _upload(server, "kiln.md", "The kiln fires at 1200 degrees.\n")
    assert answer.status_code == 200, answer.text
    assert not (folder / ".lock").is_symlink() and (folder / ".lock").is_file()
    assert target.read_text() == "not a lock\n"


def test_an_index_lock_that_is_a_folder_is_a_one_line_error_naming_it_then_served_once_mended(served):
    pipeline, server = served
    lock = pipeline.index_location / ".lock"
    lock.unlink()
    lock.mkdir()
    (lock / "something").write_text("x")
    answer = _upload(server, "glaze.md", "The glaze is mixed from ash.\n")
    assert answer.status_code == 503, answer.text
    message = answer.json()["error"]["message"]
    assert str(lock) in message and "remove it" in message and "\n" not in message, message
    assert "internal error" not in message
    (lock / "something").unlink()  # an empty folder is replaced by the service itself
    answer = _upload(server, "glaze.md", "The glaze is mixed from ash.\n")
    assert answer.status_code == 200, answer.text
    assert lock.is_file()


def test_a_damaged_bm25_folder_is_rebuilt_once_and_saved(tmp_path, embedder, monkeypatch):
    from rag.ingest import ingest
    from rag.ingest.chunking import Chunker

    index_location = tmp_path / "index"
    ingest(index_location, [write_corpus(tmp_path / "corpus")], embedder=embedder, chunker=Chunker(embedder.count_tokens))
    live = index_location / (index_location / "CURRENT").read_text().strip()
    (live / "bm25" / "vocab.json").write_text("{damaged")
    builds = []
    real = lexical_module.LexicalIndex.build.__func__
    monkeypatch.setattr(lexical_module.LexicalIndex, "build",
                        classmethod(lambda cls, ids, texts, langs=None: builds.append(len(ids)) or real(cls, ids, texts, langs)))
    notes = []
    for _ in range(2):  # two starts
        index = FolderIndex.open(index_location, embedder=embedder.name, dim=embedder.dim)
        assert index.lexical_search("prefill", 3)
        notes.append(list(index.notes))
        index.close()
    assert len(builds) == 1, builds
    assert notes[0] and not notes[1], notes


def test_a_half_built_generation_is_swept_by_the_next_writer_never_by_a_reader(tmp_path, embedder, monkeypatch):
    """A reader's open takes no write lock (an upload starting at that
    moment in the same process would be refused IndexBusy); the writer,
    which holds the lock anyway, sweeps what a killed ingest left."""
    from rag.index import generations, store
    from rag.index.manifest import Manifest
    from rag.ingest import ingest
    from rag.ingest.chunking import Chunker

    index_location = tmp_path / "index"
    chunker = Chunker(embedder.count_tokens)
    ingest(index_location, [write_corpus(tmp_path / "corpus")], embedder=embedder, chunker=chunker)
    half = index_location / "gen-000042"  # what an ingest killed before its manifest leaves
    half.mkdir()
    (half / "chunks.sqlite").write_bytes(b"partial")
    locks: list[str] = []
    real_open = generations.open_lock_file
    monkeypatch.setattr(generations, "open_lock_file", lambda path: locks.append(str(path)) or real_open(path))
    index = FolderIndex.open(index_location, embedder=embedder.name, dim=embedder.dim)
    try:
        assert locks == [] and half.is_dir() and len(index) > 0  # the reader neither locked nor swept
    finally:
        index.close()
    manifest = Manifest(embedder=embedder.name, dim=embedder.dim, chunker=chunker.settings.to_dict())
    with store.open_writer(index_location, manifest):
        assert len(locks) == 1 and not half.exists()  # the writer's open, under its lock, swept it


def test_an_unwritable_index_folder_is_a_permission_error_not_a_bad_lock_file(tmp_path, monkeypatch):
    from rag.index import generations

    folder = tmp_path / "index"
    folder.mkdir()
    if os.geteuid() == 0:  # chmod does not stop root: the refusal the kernel would give, simulated
        real_open = os.open

        def refusing(path, flags, *args):
            if str(path).endswith(".lock"):
                raise PermissionError(13, "Permission denied", str(path))
            return real_open(path, flags, *args)

        monkeypatch.setattr(generations.os, "open", refusing)
    else:
        folder.chmod(0o500)
    try:
        with pytest.raises(PermissionError) as refused:
            with generations.write_lock(folder):
                pass
    finally:
        folder.chmod(0o700)
    message = str(refused.value)
    assert "permission" in message.lower() and str(folder) in message, message
    assert "not a lock file" not in message and "remove it" not in message, message


def test_a_killed_servers_socket_lock_and_start_files_are_swept_a_live_ones_kept(tmp_path):
    from rag.resident.address import Address, held, sweep_stale

    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    dead, live = Address(folder, "dead" * 4), Address(folder, "live" * 4)
    for address in (dead, live):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(address.socket))
        sock.close()  # the socket file stays, as a killed server's does
        address.lock.write_text("999999")
        address.start_lock.write_text("")
    with held(live.lock) as fd:
        assert fd is not None
        assert sweep_stale(folder, keep=None) == [dead.key]
        assert not dead.socket.exists() and not dead.lock.exists() and not dead.start_lock.exists()
        assert live.socket.exists() and live.lock.exists()
    # A lock file swept while a server was about to lock it is locked again, afresh.
    with held(dead.lock) as fd:
        assert fd is not None and os.fstat(fd).st_ino == os.stat(dead.lock).st_ino


def test_an_upload_whose_client_leaves_stops_within_one_batch_and_keeps_nothing(served, embedder, monkeypatch):
    import threading
    import time

    from rag.ingest.run import EMBED_GROUP_CHUNKS

    from .test_ingest_cost import Counted, _big_note

    pipeline, server = served
    left = threading.Event()

    def after(n: int) -> None:
        if "valve" in counted.embedded[-1]:  # hold big.md's batch until the client has gone and the route saw it
            left.wait(120)
            for _ in range(2400):
                if any(cancel.is_set() for cancel in list(pipeline.library._running)):
                    break
                time.sleep(0.05)

    counted = Counted(embedder, on_call=after)
    monkeypatch.setattr(pipeline.library, "_embedder", lambda: counted)
    request = httpx.Request("POST", f"{server.url}/v1/documents",
                            files={"file": ("big.md", _big_note().encode("utf-8"))})
    body = request.read()
    head = "".join(f"{k}: {v}\r\n" for k, v in request.headers.items())
    with socket.create_connection((request.url.host, request.url.port)) as client:
        client.sendall(f"POST /v1/documents HTTP/1.1\r\n{head}\r\n".encode("latin-1") + body)
    left.set()  # the client is gone before any answer
    answer = _upload(server, "small.md", "The small note is about clay.\n")  # waits for the first to end
    assert answer.status_code == 200, answer.text
    big = [t for t in counted.embedded if "valve" in t]
    assert len(big) <= EMBED_GROUP_CHUNKS  # at most one batch of about six
    sources = {d["source"] for d in pipeline.documents()}
    assert "small.md" in sources and "big.md" not in sources
    assert not (pipeline.library.uploads_dir / "big.md").exists()

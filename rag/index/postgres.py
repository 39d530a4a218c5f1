"""The index in PostgreSQL with pgvector: one index that several front-ends
share, selected by ``--index postgresql://...`` (or ``RAG_INDEX``).

It presents the folder store's interface (:class:`PostgresIndex` reads as
``store.FolderIndex`` does, :class:`PostgresWriter` writes as ``store.FolderWriter``
does), so retrieval, ingest and the service work on either unchanged.

Tables, in the schema ``rag_index`` (a database may hold conversations too):

    meta      key/value: format, format_version, store_format, embedder,
              dim, chunker (JSON), generation, chunks, lengths, vector_search,
              statistics (JSON: each collection's chunks, lengths, languages)
    files     as in SQLite: root, source, path, sha256, size, n_chunks
    chunks    as in SQLite, plus embedding vector(dim) and length (BM25 terms)
    postings  term, chunk, tf, length: BM25, scored in SQL at query time

BM25 is ``lexical.LexicalIndex``'s Lucene formula over the same terms
(``lexical.tokenize``); each collection's size, total length and languages
live in ``meta``, written by each commit, and a term's document frequency is
counted from the collection's postings when a query comes: a question is
ranked by its collection's statistics alone, and every search keeps to its
collection in the SQL itself (the rows are live: a filter dropped on what a
reader once read of its collections could reach one committed since).
Vectors are searched by inner product on unit vectors (``<#>``), exactly
below ``APPROXIMATE_FROM`` chunks and through an HNSW index from there (`rag
bench search --store` chose both).

One ingest is one transaction: a crash or an exception anywhere leaves the
previous state, which readers keep seeing by MVCC until the commit. Writers
are serialised by a transaction-level advisory lock; a writer that cannot
take it within ``WRITE_WAIT_S`` gets IndexBusy, as with the folder store.
Each commit bumps ``meta.generation``: readers compare it (as the folder
store's ``CURRENT``) and reopen at their next question.

Needs psycopg 3 and pgvector (``pip install 'rag-budget[postgres]'``) and the
pgvector extension on the server. Nothing is pickled.

Does not: create the database or its role, keep older generations to fall
back to (the database's own durability and backups stand in for that),
check file checksums (there are no files), or move an index between stores.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter, OrderedDict
from typing import Callable, Iterator, Sequence

import numpy as np

from ..errors import IndexBusy, IndexMismatch, IndexNotFound, RagError, redacted
from ..text import language
from .interface import (COLLECTIONS_TABLE, HIT_COLUMNS, create_collection, hit_of, keep_listed, remove_collection,
                        stats_of)
from .lexical import B, K1, tokenize
from .manifest import FORMAT_NAME, FORMAT_VERSION, Manifest, check_manifest
from .collection_names import DEFAULT_COLLECTION
from .records import FileRecord, Hit, NewChunk, embedded_text, location_json, stored_location, stored_units, units_json

S = "rag_index"  # the schema every table lives in
STORE_FORMAT = 1  # of these tables (the chunk format is the manifest's FORMAT_VERSION)
LOCK_CLASS = 0x72616749  # "ragI": the first key of the writers' advisory lock (conversations use "rag\0")
WRITE_LOCK = 0
WRITE_WAIT_S = 5.0  # a writer waits this long for another to finish, then IndexBusy
# Exact search up to here, HNSW from here (and back below half of it): exact p95 was 28 ms at 50,000
# vectors, 53 ms at 100,000 (`rag bench search --store`, README "The index in PostgreSQL").
APPROXIMATE_FROM = 50_000
HNSW_M, HNSW_EF_CONSTRUCTION = 16, 64  # pgvector's defaults
# Candidates an HNSW search keeps: at 100,000 vectors recall@10 0.77 / 0.91 / 0.96 at 40 (pgvector's
# default) / 100 / 200, p95 4.2 / 5.6 / 7.2 ms (`rag bench search --store`, README).
HNSW_EF_SEARCH = 200
HNSW_INDEX = "chunks_embedding_hnsw"
INSTALL = "pip install 'rag-budget[postgres]'"

_SCHEMA = f"""
CREATE SCHEMA IF NOT EXISTS {S};
CREATE TABLE {S}.meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE {S}.files (
    id BIGSERIAL PRIMARY KEY,
    collection TEXT NOT NULL DEFAULT 'default',  -- rag.index.collection_names
    root TEXT NOT NULL,           -- absolute path that was ingested
    source TEXT NOT NULL,         -- path relative to root, '/'-separated
    path TEXT NOT NULL,           -- absolute path of the file when read
    sha256 TEXT NOT NULL,
    size BIGINT NOT NULL,
    n_chunks INTEGER NOT NULL,
    UNIQUE (collection, root, source)
);
CREATE TABLE {S}.chunks (
    id BIGSERIAL PRIMARY KEY,               -- never reused: a reader's ids stay valid or vanish
    chunk_id TEXT NOT NULL UNIQUE,
    file_id BIGINT NOT NULL REFERENCES {S}.files(id) ON DELETE CASCADE,
    source TEXT NOT NULL,
    position INTEGER NOT NULL,
    char_start INTEGER NOT NULL,
    char_end INTEGER NOT NULL,
    page INTEGER,
    n_tokens INTEGER NOT NULL,
    text TEXT NOT NULL,
    context TEXT NOT NULL DEFAULT '',
    location TEXT,                          -- JSON, as in SQLite; NULL for none
    embedding vector(%(dim)s) NOT NULL,     -- unit vector of embedded_text(context, text)
    length INTEGER NOT NULL,                -- BM25 terms of lexical_text(context, text)
    lang TEXT NOT NULL DEFAULT 'en',        -- ISO 639-1, detected at ingest: the language of its terms
    units TEXT NOT NULL DEFAULT '[]'        -- JSON, as in SQLite: its document's units
);
CREATE INDEX chunks_file ON {S}.chunks (file_id);
CREATE TABLE {S}.postings (
    term TEXT NOT NULL,
    chunk BIGINT NOT NULL REFERENCES {S}.chunks(id) ON DELETE CASCADE,
    tf INTEGER NOT NULL,
    length INTEGER NOT NULL,                -- the chunk's, here so scoring reads no chunk row
    PRIMARY KEY (term, chunk)
);
CREATE INDEX postings_chunk ON {S}.postings (chunk);
{COLLECTIONS_TABLE.format(name=f"{S}.collections")};
"""
# A chunk's vector stays in its row (in a wide row it would be moved out of line first, and an exact
# search would read every vector back from the TOAST table); its text is what is compressed or moved.
# With this and the ANALYZE after a large commit, dense search over the 12,215 Python docs chunks
# went from 32.5 to 6.5 ms p50 (`rag bench retrieval --store`). Up to this many dimensions (4 KB of 8).
INLINE_DIM = 1000

# BM25 of the chunks sharing a term with the query: ``{within}`` keeps the postings to one collection's chunks
# (document frequencies included), ``{where}`` to a scope's. Each term's share of a score is rounded to a multiple
# of GRAIN (under 5e-13 off), so that the sum is exact (below 2**13) and the same in whatever order the plan adds a
# chunk's terms: plans change with the tables' sizes, which other collections make, and a score must not.
GRAIN = 2.0 ** 40
_LEXICAL = f"""
WITH q AS (SELECT * FROM unnest(%(terms)s::text[], %(times)s::int[]) AS q(term, times)),
hits AS (SELECT p.term, p.chunk, p.tf, p.length FROM {S}.postings p JOIN q USING (term){{within}}),
df AS (SELECT term, count(*)::float8 AS df FROM hits GROUP BY term)
SELECT h.chunk, sum(round(q.times * ln(1 + (%(n)s - df.df + 0.5) / (df.df + 0.5))
                          * h.tf / (h.tf + %(k1)s * ((1 - %(b)s) + %(b)s * h.length / %(avg)s)) * %(grain)s)
                    / %(grain)s) AS score
FROM hits h JOIN q USING (term) JOIN df USING (term)
{{where}}
GROUP BY h.chunk ORDER BY score DESC, h.chunk LIMIT %(k)s
"""
# A search's filter to one collection, in the statement itself: the rows are live, and the filter is never
# dropped on what a reader once read of its collections. Whether the index holds no other collection is asked
# once per statement (by the files' unique index), so of the rows it reads: then nothing is looked up, and a
# vector search keeps its HNSW scan (an OR is never made a join); else each row's file is.
_ALONE = (f"(SELECT NOT EXISTS (SELECT 1 FROM {S}.files WHERE {{column}} < %(collection)s) "
          f"AND NOT EXISTS (SELECT 1 FROM {S}.files WHERE {{column}} > %(collection)s))")
_OF_COLLECTION = f"({_ALONE} OR file_id IN (SELECT id FROM {S}.files WHERE {{column}} = %(collection)s))"
_POSTING_IN = f"""{_ALONE}
   OR EXISTS (SELECT 1 FROM {S}.chunks c JOIN {S}.files f ON f.id = c.file_id
              WHERE c.id = p.chunk AND {{column}} = %(collection)s)"""  # of a posting p
_WITHIN = f"""
WHERE {_POSTING_IN}"""


def _modules():
    """psycopg and pgvector's registration, or a RagError saying how to install them."""
    try:
        import psycopg
        from pgvector.psycopg import register_vector
    except ImportError:
        raise RagError(f"the index is a PostgreSQL database, but psycopg or pgvector is not installed: {INSTALL}") \
            from None
    return psycopg, register_vector


def _one_line(url: str, exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300].replace(url, redacted(url))


def _unreachable(url: str, exc: BaseException) -> RagError:
    return RagError(f"{redacted(url)}: the index database cannot be reached ({_one_line(url, exc)}); check that "
                    "the server is running and --index/RAG_INDEX names it")


def _failed(url: str, exc: BaseException) -> RagError:
    return RagError(f"{redacted(url)}: the index database refused a query ({_one_line(url, exc)})")


def connect(url: str, *, autocommit: bool = True):
    """A psycopg connection to ``url``; RagError (one line, password left out)
    when psycopg is missing or the server cannot be reached."""
    psycopg, _ = _modules()
    try:
        return psycopg.connect(url, autocommit=autocommit, connect_timeout=10)
    except psycopg.Error as exc:
        raise _unreachable(url, exc) from None


def _no_pgvector(url: str, why: str) -> RagError:
    return RagError(f"{redacted(url)}: {why}; the index needs pgvector: install it on the server "
                    "(e.g. apt-get install postgresql-NN-pgvector) and run CREATE EXTENSION vector in that database")


def _use_vectors(db, url: str) -> None:
    """Let ``db`` send and read pgvector's type; RagError if the database lacks the extension."""
    _, register_vector = _modules()
    if db.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone() is None:
        raise _no_pgvector(url, "the extension vector is not created in this database")
    register_vector(db)


def _has_index(db) -> bool:
    return db.execute(f"SELECT to_regclass('{S}.meta') IS NOT NULL").fetchone()[0]


def _meta(db) -> dict[str, str]:
    return dict(db.execute(f"SELECT key, value FROM {S}.meta").fetchall())


def _manifest(meta: dict[str, str], url: str) -> Manifest:
    """The manifest ``meta`` describes; IndexMismatch when it is not an index of this store's format."""
    try:
        if meta.get("format") != FORMAT_NAME or int(meta.get("store_format", -1)) != STORE_FORMAT:
            raise ValueError(f"store format {meta.get('store_format')!r}, this rag-budget reads {STORE_FORMAT}")
        return Manifest(embedder=meta["embedder"], dim=int(meta["dim"]),
                        chunker={str(k): int(v) for k, v in json.loads(meta["chunker"]).items()},
                        format_version=int(meta["format_version"]), chunks=int(meta.get("chunks", 0)))
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise IndexMismatch(f"{redacted(url)}: the {S} tables are not an index this rag-budget reads ({exc}); "
                            f"rebuild it with `rag ingest --rebuild PATH --index URL`") from None


def _statistics(meta: dict[str, str]) -> dict[str, tuple[int, int, list[str]]] | None:
    """Each collection's ``(chunks, lengths, languages)`` as the last commit
    wrote them in ``meta`` (None: that commit did not, or not for this
    generation: an older rag-budget's)."""
    try:
        written = json.loads(meta.get("statistics") or "null")
        if not isinstance(written, dict) or str(written.get("generation")) != meta.get("generation"):
            return None
        return {str(name): (int(n), int(lengths), [str(x) for x in langs])
                for name, (n, lengths, langs) in written["collections"].items()}
    except (KeyError, ValueError, TypeError, AttributeError):
        return None


def generation_name(number: int) -> str:
    """A generation's name, shaped as the folder store's (``gen-000007``)."""
    return f"gen-{number:06d}"


def describe(meta: dict[str, str]) -> str:
    """What ``rag doctor`` says of the vector search."""
    return meta.get("vector_search") or "exact: sequential inner product"


# -- what the location functions ask without an index open --------------------

_probes: dict[str, object] = {}
_probe_lock = threading.Lock()


@contextlib.contextmanager
def _probe(url: str):
    """A connection to ``url`` kept for quick questions (is there an index,
    which generation is live), asked at every question: one per URL, in
    turn, reconnected when lost."""
    psycopg, _ = _modules()
    with _probe_lock:
        db = _probes.get(url)
        if db is None or db.closed or db.broken:
            db = _probes[url] = connect(url)
        try:
            yield db
        except psycopg.OperationalError as exc:
            db.close()
            raise _unreachable(url, exc) from None
        except psycopg.Error as exc:
            raise _failed(url, exc) from None


def exists(url: str) -> bool:
    """Whether the database at ``url`` holds a committed index."""
    with _probe(url) as db:
        return _has_index(db) and db.execute(f"SELECT 1 FROM {S}.meta WHERE key = 'generation'").fetchone() is not None


def live_name(url: str) -> str | None:
    """The name of the generation last committed to ``url`` (None: no index)."""
    with _probe(url) as db:
        if not _has_index(db):
            return None
        row = db.execute(f"SELECT value FROM {S}.meta WHERE key = 'generation'").fetchone()
        return generation_name(int(row[0])) if row else None


def live_manifest(url: str) -> Manifest:
    """The manifest of the index at ``url``; IndexNotFound if there is none."""
    with _probe(url) as db:
        if not _has_index(db):
            raise IndexNotFound(f"no index in {redacted(url)}; build one with `rag ingest PATH --index URL`")
        return _manifest(_meta(db), url)


# -- reading --------------------------------------------------------------------


class PostgresIndex:
    """A read-only view of the index in a PostgreSQL database, as
    ``store.FolderIndex``; ``name`` is the generation it was opened at."""

    def __init__(self, url: str, db, manifest: Manifest, meta: dict[str, str]) -> None:
        self.url = url
        self.directory = redacted(url)  # what messages name, as the folder store's folder
        self.manifest = manifest
        self.name = generation_name(int(meta["generation"]))
        self._meta = meta
        self._db = db
        self._lock = threading.Lock()  # one connection: queries in turn (SQLite's is shared so too)
        self._count = int(meta.get("chunks", 0))
        self._avg = (int(meta.get("lengths", 0)) / self._count) if self._count else 1.0
        self._approximate = meta.get("vector_search", "").startswith("approximate")
        self.languages = tuple(x for x in meta.get("languages", "").split(",") if x)  # a query is read in each
        self._statistics = _statistics(meta)  # each collection's, as the commit it was opened at wrote them
        self._domains: dict[str, tuple[float, float, tuple[str, ...]]] = {}  # by collection: see _domain
        self._scopes: OrderedDict[object, np.ndarray] = OrderedDict()
        self._collections: dict[str, int] | None = None  # files per collection, read on first use
        self.notes: list[str] = []
        self.on_note: Callable[[str], None] = lambda note: None

    @classmethod
    def open(cls, url: str, *, embedder: str, dim: int) -> "PostgresIndex":
        """The index in the database at ``url``. IndexNotFound if it holds
        none, IndexMismatch if it was written by another format version or
        embedding model, RagError if it cannot be reached or lacks pgvector."""
        psycopg, _ = _modules()
        db = connect(url)
        try:
            if not _has_index(db):
                raise IndexNotFound(f"no index in {redacted(url)}; build one with `rag ingest PATH --index URL`")
            meta = _meta(db)
            if "generation" not in meta:
                raise IndexNotFound(f"no index in {redacted(url)}; build one with `rag ingest PATH --index URL`")
            manifest = _manifest(meta, url)
            check_manifest(manifest, redacted(url), embedder=embedder, dim=dim)
            _use_vectors(db, url)
            db.execute(f"SET hnsw.ef_search = {HNSW_EF_SEARCH}")
        except psycopg.Error as exc:
            db.close()
            raise _failed(url, exc) from None
        except BaseException:
            db.close()
            raise
        return cls(url, db, manifest, meta)

    @contextlib.contextmanager
    def _access(self):
        """The connection, in turn, reconnected once if it was lost."""
        psycopg, _ = _modules()
        with self._lock:
            if self._db.closed or self._db.broken:
                self._db = connect(self.url)
                _use_vectors(self._db, self.url)
                self._db.execute(f"SET hnsw.ef_search = {HNSW_EF_SEARCH}")
            try:
                yield self._db
            except psycopg.OperationalError as exc:
                raise _unreachable(self.url, exc) from None
            except psycopg.Error as exc:
                raise _failed(self.url, exc) from None

    def close(self) -> None:
        """Release the database connection."""
        self._db.close()

    def __len__(self) -> int:
        return self._count

    def lexical(self) -> "PostgresIndex":
        """Nothing to load: BM25 is scored in the database (the folder store loads its arrays here)."""
        return self

    def search(self, query: np.ndarray, k: int, allowed: np.ndarray | None = None, *,
               collection: str | None = None) -> list[Hit]:
        """The ``k`` chunks nearest the unit vector ``query`` by inner
        product (cosine), best first, among the chunk ids ``allowed`` (None:
        all) of ``collection`` (None: of any)."""
        found = self.search_ids(query, k, allowed, collection=collection)
        return self.hits([i for i, _ in found], query, known=dict(found))

    def search_ids(self, query: np.ndarray, k: int, allowed: np.ndarray | None = None, *,
                   collection: str | None = None) -> list[tuple[int, float]]:
        """``(chunk id, cosine)`` of the ``k`` nearest vectors, best first,
        among the chunk ids ``allowed`` (None: all) of ``collection`` (None:
        of any), the collection filtered in the SQL itself. Through HNSW when
        the index has one and no scope is given: for a collection, where it
        was the only one when this reader read its collections, and exactly
        again where the filtered scan returned fewer than ``k`` (another
        collection's chunks committed since crowded it). A scope, or a
        collection among others, is searched exactly (an HNSW scan filtered
        afterwards could return fewer than ``k``)."""
        if k <= 0 or len(self) == 0 or (allowed is not None and len(allowed) == 0):
            return []
        q = np.asarray(query, dtype=np.float32).reshape(-1)
        # Whether an HNSW scan may answer: what the reader read of its collections only chooses the plan, the
        # collection's filter stays in the SQL whatever it says.
        graph = self._approximate and allowed is None and (
            collection is None or set(self.collections()) <= {collection})
        where, params = [], {"q": q, "k": k, "collection": collection}
        with self._access() as db:
            if collection is not None:
                where.append(_OF_COLLECTION.format(column=_collection_column(db)))
            if allowed is not None:
                where.append("id = ANY(%(allowed)s::bigint[])")
                params["allowed"] = np.asarray(allowed, dtype=np.int64).tolist()
            sql = (f"SELECT id, -(embedding <#> %(q)s) FROM {S}.chunks{' WHERE ' if where else ''}"
                   f"{' AND '.join(where)} ORDER BY embedding <#> %(q)s LIMIT %(k)s")
            rows = None
            if graph or not self._approximate:
                rows = db.execute(sql, params, binary=True).fetchall()
                if graph and collection is not None and len(rows) < k:
                    rows = None
            if rows is None:
                with db.transaction():
                    db.execute("SET LOCAL enable_indexscan = off")  # the HNSW scan is an index scan
                    rows = db.execute(sql, params, binary=True).fetchall()
        return [(int(i), float(s)) for i, s in rows]

    def lexical_search(self, query: str, k: int, allowed: np.ndarray | None = None, *,
                       collection: str | None = None) -> list[tuple[int, float]]:
        """``(chunk id, BM25 score)`` of up to ``k`` chunks sharing terms
        with ``query``, best first (ties by chunk id), among the chunk ids
        ``allowed`` (None: all) of ``collection`` (None: of any): the scores
        of ``LexicalIndex.search`` over the same chunks (each term's share to
        within 5e-13: ``GRAIN``). Every statistic is ``collection``'s alone
        (the whole index's for None): document frequencies counted over its
        postings, in the same statement as the scores; its size, mean length
        and languages as :meth:`_domain` reads them."""
        n, avg, languages = self._domain(collection)
        counted = Counter(language.terms_in(query, languages))
        if k <= 0 or not counted or n == 0:
            return []
        params = {"terms": list(counted), "times": list(counted.values()), "n": n, "avg": avg, "k1": K1, "b": B,
                  "k": k, "grain": GRAIN, "collection": collection}
        where = ""
        if allowed is not None:
            where, params["allowed"] = "WHERE h.chunk = ANY(%(allowed)s::bigint[])", \
                np.asarray(allowed, dtype=np.int64).tolist()
        with self._access() as db:
            within = _WITHIN.format(column=_collection_column(db)) if collection is not None else ""
            rows = db.execute(_LEXICAL.format(within=within, where=where), params).fetchall()
        return [(int(i), float(s)) for i, s in rows if s > 0]

    def unheard(self, words: Sequence[str], *, collection: str | None = None) -> list[str]:
        """Those of ``words`` that no chunk of ``collection`` (None: of any)
        holds, as ``LexicalIndex.unheard`` reads them: no posting of the
        collection holds a term of the word, read in its languages."""
        languages = self._domain(collection)[2]
        read = {word: language.terms_in(word, languages) for word in words}
        terms = sorted({t for found in read.values() for t in found})
        if not terms:
            return []
        with self._access() as db:
            within = f" AND ({_POSTING_IN.format(column=_collection_column(db))})" if collection is not None else ""
            held = {r[0] for r in db.execute(
                f"SELECT DISTINCT p.term FROM {S}.postings p WHERE p.term = ANY(%(terms)s::text[]){within}",
                {"terms": terms, "collection": collection}).fetchall()}
        return [word for word, found in read.items() if found and not held & set(found)]

    def _domain(self, collection: str | None) -> tuple[float, float, tuple[str, ...]]:
        """The number of chunks of ``collection`` (None: of the whole index),
        their mean BM25 length and their languages, as the commit this reader
        was opened at wrote them in ``meta`` (read once per collection where
        an older commit did not): kept while the reader is open, as its
        collections are, they are that collection's alone whatever commits
        follow (a new generation is a new reader)."""
        if collection is None:
            return float(self._count), float(self._avg or 1.0), self.languages
        found = self._domains.get(collection)
        if found is None:
            if self._statistics is not None:
                chunks, lengths, langs = self._statistics.get(collection, (0, 0, []))
            else:
                with self._access() as db:
                    chunks, lengths, langs = db.execute(
                        f"SELECT COUNT(*), COALESCE(SUM(c.length), 0), array_agg(DISTINCT c.lang) FROM {S}.chunks c "
                        f"JOIN {S}.files f ON f.id = c.file_id WHERE {_collection_column(db)} = %s", (collection,)
                    ).fetchone()
            avg = (int(lengths) / chunks) if chunks else 1.0
            found = self._domains[collection] = (float(chunks), float(avg or 1.0), tuple(sorted(langs or ())))
        return found

    def collections(self) -> dict[str, int]:
        """The files of each collection, by its name (0: created, or emptied,
        and not deleted; read once: a question asks it, and the view is of
        one generation, as its scopes are)."""
        if self._collections is None:
            with self._access() as db:
                self._collections = dict.fromkeys(_created(db), 0) | dict(
                    db.execute(f"SELECT {_collection_column(db)}, COUNT(*) FROM {S}.files GROUP BY 1").fetchall())
        return dict(self._collections)

    def chunk_ids_of(self, sources: Callable[[str], bool], key: object, collection: str | None = None) -> np.ndarray:
        """The ids of the chunks of every file (of ``collection``; None: of
        any) whose source ``sources`` accepts, sorted; remembered under
        ``key`` (the last 64 scopes)."""
        key = (key, collection)
        found = self._scopes.get(key)
        if found is None:
            with self._access() as db:
                rows = db.execute(f"SELECT id, source FROM {S}.files WHERE {_collection_column(db)} = %s",
                                  (collection,)) if collection is not None else \
                    db.execute(f"SELECT id, source FROM {S}.files")
                files = [i for i, source in rows if sources(source)]
                ids = [r[0] for r in db.execute(f"SELECT id FROM {S}.chunks WHERE file_id = ANY(%s::bigint[])",
                                                (files,))]
            found = np.sort(np.asarray(ids, dtype=np.int64))
            self._scopes[key] = found
            while len(self._scopes) > 64:
                self._scopes.popitem(last=False)
        else:
            self._scopes.move_to_end(key)
        return found

    def hits(self, ids: Sequence[int], query: np.ndarray, known: dict[int, float] | None = None) -> list[Hit]:
        """The chunks ``ids`` in that order (those still indexed), each
        scored by its cosine similarity to ``query`` (taken from ``known`` where given)."""
        if not len(ids):
            return []
        known = known or {}
        q = np.asarray(query, dtype=np.float32).reshape(-1)
        with self._access() as db:
            rows = {r[0]: r for r in db.execute(
                f"SELECT c.id, -(c.embedding <#> %s), {HIT_COLUMNS} FROM {S}.chunks c JOIN {S}.files f ON f.id = c.file_id "
                "WHERE c.id = ANY(%s::bigint[])", (q, [int(i) for i in ids]), binary=True)}
        result = []
        for i in ids:
            r = rows.get(int(i))
            if r is None:
                continue
            score = known.get(int(i))
            result.append(hit_of(r[2:], float(r[1]) if score is None else score))
        return result

    def files(self, root: str | None = None, collection: str = DEFAULT_COLLECTION) -> dict[tuple[str, str], FileRecord]:
        """The ingested files of ``collection``, keyed by ``(root, source)``,
        optionally only those ingested from ``root``."""
        with self._access() as db:
            return _files(db, root, collection)

    def passages(self) -> list[tuple[str, str, int | None, str]]:
        """Every chunk as a prompt shows it: ``(source, text, page, collection)``, in id order."""
        with self._access() as db:
            return [tuple(r) for r in db.execute(
                f"SELECT c.source, c.text, c.page, {_collection_column(db)} FROM {S}.chunks c "
                f"JOIN {S}.files f ON f.id = c.file_id ORDER BY c.id")]

    def chunks(self) -> list[tuple[int, str, str, np.ndarray, str]]:
        """Every chunk as ``(chunk id, source, text, unit vector, context)``, in id order."""
        with self._access() as db:
            rows = db.execute(f"SELECT id, source, text, embedding, context FROM {S}.chunks ORDER BY id",
                              binary=True).fetchall()
        return [(r[0], r[1], r[2], r[3].to_numpy().astype(np.float32), r[4]) for r in rows]

    def _languages(self) -> list[tuple[str, int]]:
        with self._access() as db:
            return db.execute(f"SELECT lang, COUNT(*) FROM {S}.chunks GROUP BY lang ORDER BY lang").fetchall()

    def stats(self) -> dict[str, object]:
        """Counts and sizes for ``rag doctor``."""
        with self._access() as db:
            n_files, n_chunks, n_tokens = db.execute(
                f"SELECT (SELECT COUNT(*) FROM {S}.files), COUNT(*), COALESCE(SUM(n_tokens), 0) FROM {S}.chunks"
            ).fetchone()
            size = db.execute(
                "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'r'", (S,)
            ).fetchone()[0]
        return stats_of(self, store="postgresql", generation=self.name, files=n_files, chunks=n_chunks,
                        tokens=n_tokens, vectors=n_chunks, vector_search=describe(self._meta), lexical=True,
                        size=size, languages=dict(self._languages()), collections=self.collections())


# -- writing --------------------------------------------------------------------


class PostgresWriter:
    """Changes to the index in one transaction until :meth:`commit`, as
    ``store.FolderWriter``; use :func:`open_writer`."""

    def __init__(self, url: str, db, manifest: Manifest, *, approximate_from: int | None = None,
                 collection: str = DEFAULT_COLLECTION) -> None:
        self.url = url
        self.collection = collection  # the one collection it reads and changes
        self.manifest = manifest
        self._db = db
        self.approximate_from = APPROXIMATE_FROM if approximate_from is None else approximate_from
        self.notes: list[str] = []
        self.committed = False
        self._changed = 0  # chunks added and removed

    def files(self, root: str | None = None) -> dict[tuple[str, str], FileRecord]:
        """The files of its collection as this transaction sees them, as ``IndexReader.files``."""
        return _files(self._db, root, self.collection)

    def exists(self) -> bool:
        """Whether its collection is there: recorded, or holding files."""
        return bool(self._db.execute(f"SELECT EXISTS (SELECT 1 FROM {S}.collections WHERE name = %s) OR EXISTS "
                                     f"(SELECT 1 FROM {S}.files WHERE collection = %s)", (self.collection,) * 2
                                     ).fetchone()[0])

    def record(self, kept: bool) -> None:
        """Record its collection (``kept``), or forget the record."""
        self._db.execute(f"INSERT INTO {S}.collections (name) VALUES (%s) ON CONFLICT DO NOTHING" if kept else
                         f"DELETE FROM {S}.collections WHERE name = %s", (self.collection,))

    def create_collection(self) -> bool:
        """See :func:`interface.create_collection`."""
        return create_collection(self)

    def remove_collection(self) -> int | None:
        """See :func:`interface.remove_collection`."""
        return remove_collection(self)

    def remove_file(self, file_id: int) -> None:
        """Remove a file and all of its chunks, vectors and postings."""
        self._changed += self._db.execute(f"DELETE FROM {S}.chunks WHERE file_id = %s", (file_id,)).rowcount
        self._db.execute(f"DELETE FROM {S}.files WHERE id = %s", (file_id,))

    def vectors_by_text(self, file_id: int) -> dict[str, np.ndarray]:
        """The stored vector of each chunk of a file, by what it was embedded as."""
        rows = self._db.execute(f"SELECT context, text, embedding FROM {S}.chunks WHERE file_id = %s", (file_id,),
                                binary=True).fetchall()
        return {embedded_text(c, t): v.to_numpy().astype(np.float32) for c, t, v in rows}

    def add_file(self, *, root: str, source: str, path: str, sha256: str, size: int,
                 chunks: Sequence[NewChunk], vectors: np.ndarray) -> None:
        """Add a file with its chunks and their unit vectors (one row each)."""
        if len(chunks) != len(vectors):
            raise ValueError(f"{len(chunks)} chunks but {len(vectors)} vectors")
        db = self._db
        file_id = db.execute(
            f"INSERT INTO {S}.files (collection, root, source, path, sha256, size, n_chunks) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id",
            (self.collection, root, source, path, sha256, size, len(chunks))).fetchone()[0]
        keep_listed(self)
        if not chunks:
            return
        self._changed += len(chunks)
        ids = [r[0] for r in db.execute(f"SELECT nextval('{S}.chunks_id_seq') FROM generate_series(1, %s)",
                                        (len(chunks),))]
        terms = [Counter(tokenize(c.lexical, c.lang)) for c in chunks]
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        with db.cursor().copy(
                f"COPY {S}.chunks (id, chunk_id, file_id, source, position, char_start, char_end, page, n_tokens, "
                "text, context, location, embedding, length, lang, units) FROM STDIN WITH (FORMAT BINARY)") as copy:
            copy.set_types(["int8", "text", "int8", "text", "int4", "int4", "int4", "int4", "int4", "text", "text",
                            "text", "vector", "int4", "text", "text"])
            for i, c, v, t in zip(ids, chunks, vectors, terms):
                copy.write_row((i, c.chunk_id, file_id, source, c.position, c.char_start, c.char_end, c.page,
                                c.n_tokens, c.text, c.context, location_json(c.location), v, sum(t.values()), c.lang,
                                units_json(c.units)))
        with db.cursor().copy(f"COPY {S}.postings (term, chunk, tf, length) FROM STDIN WITH (FORMAT BINARY)") as copy:
            copy.set_types(["text", "int8", "int4", "int4"])
            for i, t in zip(ids, terms):
                length = sum(t.values())
                for term, tf in t.items():
                    copy.write_row((term, i, tf, length))

    def commit(self) -> None:
        """Make this transaction's changes the live index at once, under
        the next generation number, with the BM25 statistics and the vector
        search that suit its size."""
        db = self._db
        # Each collection's BM25 statistics, which its questions are ranked by; the index's are their sums.
        statistics = {name: [n, int(lengths), langs] for name, n, lengths, langs in db.execute(
            f"SELECT f.collection, COUNT(*), COALESCE(SUM(c.length), 0), array_agg(DISTINCT c.lang ORDER BY c.lang) "
            f"FROM {S}.chunks c JOIN {S}.files f ON f.id = c.file_id GROUP BY 1")}
        n = sum(s[0] for s in statistics.values())
        lengths = sum(s[1] for s in statistics.values())
        row = db.execute(f"SELECT value FROM {S}.meta WHERE key = 'generation'").fetchone()
        generation = (int(row[0]) if row else 0) + 1
        search = fit_vector_search(db, n, approximate_from=self.approximate_from)
        languages = ",".join(sorted({lang for s in statistics.values() for lang in s[2]}))
        if self._changed * 10 >= max(n, 1):
            # The planner's statistics, at once after a large change (autovacuum would come later):
            # without them a first BM25 query after a bulk ingest scans every posting.
            db.execute(f"ANALYZE {S}.files, {S}.chunks, {S}.postings")
        _put_meta(db, {"generation": str(generation), "chunks": str(n), "lengths": str(int(lengths)),
                       "vector_search": search, "languages": languages,
                       "statistics": json.dumps({"generation": generation, "collections": statistics},
                                                sort_keys=True)})
        db.commit()
        self.committed = True


def fit_vector_search(db, n: int, *, approximate_from: int = APPROXIMATE_FROM) -> str:
    """Give the chunks the vector search their number ``n`` suits: exact
    below ``approximate_from``, an HNSW index from there, dropped again
    below half of it (no flapping around the threshold); what it is, for ``meta``."""
    has = db.execute(f"SELECT to_regclass('{S}.{HNSW_INDEX}') IS NOT NULL").fetchone()[0]
    if not has and n >= approximate_from:
        # The graph is built far faster when it fits in memory (pgvector's notice otherwise).
        db.execute("SET LOCAL maintenance_work_mem = '1GB'")
        db.execute(f"CREATE INDEX {HNSW_INDEX} ON {S}.chunks USING hnsw (embedding vector_ip_ops) "
                   f"WITH (m = {HNSW_M}, ef_construction = {HNSW_EF_CONSTRUCTION})")
        has = True
    elif has and n < approximate_from // 2:
        db.execute(f"DROP INDEX {S}.{HNSW_INDEX}")
        has = False
    if has:
        return (f"approximate: HNSW (m={HNSW_M}, ef_construction={HNSW_EF_CONSTRUCTION}, "
                f"ef_search={HNSW_EF_SEARCH}) from {approximate_from:,} vectors")
    return f"exact: sequential inner product (approximate HNSW from {approximate_from:,} vectors)"


def _put_meta(db, values: dict[str, str]) -> None:
    for key, value in values.items():
        db.execute(f"INSERT INTO {S}.meta (key, value) VALUES (%s, %s) "
                   "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (key, value))


def _take_write_lock(db, url: str, wait_s: float) -> None:
    """Hold the writers' advisory lock until this transaction ends; IndexBusy
    after ``wait_s`` seconds of another writer holding it."""
    deadline = time.monotonic() + wait_s
    while not db.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", (LOCK_CLASS, WRITE_LOCK)).fetchone()[0]:
        if time.monotonic() >= deadline:
            raise IndexBusy(f"{redacted(url)}: another front-end is writing this index; wait for it to finish")
        time.sleep(0.05)


def _create_extension(db, url: str) -> None:
    """The vector extension, created in the database when it is missing
    and the server has it; a RagError saying what to do otherwise."""
    psycopg, _ = _modules()
    if db.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone() is not None:
        return
    if db.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone() is None:
        raise _no_pgvector(url, "pgvector is not installed on this PostgreSQL server")
    try:
        with db.transaction():  # a savepoint: a refusal leaves the writer's transaction usable for the message
            db.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except psycopg.Error as exc:
        raise _no_pgvector(url, f"CREATE EXTENSION vector was refused ({_one_line(url, exc)})") from None


@contextlib.contextmanager
def open_writer(url: str, manifest: Manifest, *, fresh: bool = False, wait_s: float | None = None,
                approximate_from: int | None = None, collection: str = DEFAULT_COLLECTION) -> Iterator[PostgresWriter]:
    """Stage changes to ``collection`` of the index at ``url`` in one
    transaction (the tables created on first use; ``fresh``: replaced by
    empty ones, in the same transaction, refused with a RagError while they
    hold other collections). The caller calls ``commit()``; anything else (an
    exception, a crash, a return without commit) rolls back, and readers
    never see a part of it. Raises IndexBusy if another writer holds the
    index past ``wait_s`` seconds, IndexMismatch if it was built with other
    settings than ``manifest``, RagError if the database cannot be reached
    or lacks pgvector. ``wait_s`` and ``approximate_from`` default to
    ``WRITE_WAIT_S`` and ``APPROXIMATE_FROM``."""
    psycopg, _ = _modules()
    db = connect(url, autocommit=False)
    writer: PostgresWriter | None = None
    try:
        try:
            _take_write_lock(db, url, WRITE_WAIT_S if wait_s is None else wait_s)
            _create_extension(db, url)
            _, register_vector = _modules()
            register_vector(db)
            if _has_index(db) and fresh:
                _refuse_dropping_others(db, collection)
            if _has_index(db) and not fresh:
                meta = _meta(db)
                check_manifest(_manifest(meta, url), redacted(url), embedder=manifest.embedder, dim=manifest.dim,
                               chunker=manifest.chunker)
                _with_collections(db)
            else:
                db.execute(f"DROP SCHEMA IF EXISTS {S} CASCADE")
                db.execute(_SCHEMA % {"dim": int(manifest.dim)})
                if manifest.dim <= INLINE_DIM:
                    db.execute(f"ALTER TABLE {S}.chunks ALTER COLUMN embedding SET STORAGE PLAIN")
                _put_meta(db, {"format": FORMAT_NAME, "format_version": str(FORMAT_VERSION),
                               "store_format": str(STORE_FORMAT), "embedder": manifest.embedder,
                               "dim": str(manifest.dim), "chunker": json.dumps(manifest.chunker, sort_keys=True)})
        except psycopg.OperationalError as exc:
            raise _unreachable(url, exc) from None
        except psycopg.Error as exc:
            raise _failed(url, exc) from None
        writer = PostgresWriter(url, db, manifest, approximate_from=approximate_from, collection=collection)
        try:
            yield writer
        except psycopg.OperationalError as exc:
            raise _unreachable(url, exc) from None
        except psycopg.Error as exc:
            raise _failed(url, exc) from None
    finally:
        if writer is None or not writer.committed:
            with contextlib.suppress(Exception):
                db.rollback()
        with contextlib.suppress(Exception):
            db.close()


def _files(db, root: str | None, collection: str) -> dict[tuple[str, str], FileRecord]:
    query = f"SELECT id, root, source, sha256, n_chunks FROM {S}.files WHERE {_collection_column(db)} = %s"
    rows = db.execute(query + " AND root = %s", (collection, root)) if root is not None else \
        db.execute(query, (collection,))
    return {(r[1], r[2]): FileRecord(*r) for r in rows}


def _collection_column(db) -> str:
    """What names a file's collection in queries: its column, or for an
    index written before collections (until its next writer adds the
    column), the default collection. Asked each time: a writer may add it
    while a reader is open."""
    found = db.execute("SELECT 1 FROM information_schema.columns WHERE table_schema = %s AND table_name = 'files' "
                       "AND column_name = 'collection'", (S,)).fetchone()
    return "collection" if found else f"'{DEFAULT_COLLECTION}'"


def _has_collections_table(db) -> bool:
    return db.execute("SELECT to_regclass(%s)", (f"{S}.collections",)).fetchone()[0] is not None


def _created(db) -> list[str]:
    """The collections recorded in the index (none in one written before they were)."""
    if not _has_collections_table(db):
        return []
    return [name for (name,) in db.execute(f"SELECT name FROM {S}.collections")]


def _with_collections(db) -> None:
    """Give an index written before collections their table and its files
    their column, every file in the default collection, unique per
    collection (in the writer's transaction)."""
    new_table = not _has_collections_table(db)
    db.execute(COLLECTIONS_TABLE.format(name=f"{S}.collections"))
    if _collection_column(db) == "collection":
        if new_table:  # the named collections its files hold, kept once emptied as any other
            db.execute(f"INSERT INTO {S}.collections (name) SELECT DISTINCT collection FROM {S}.files "
                       "WHERE collection != %s ON CONFLICT DO NOTHING", (DEFAULT_COLLECTION,))
        return
    db.execute(f"ALTER TABLE {S}.files ADD COLUMN collection TEXT NOT NULL DEFAULT '{DEFAULT_COLLECTION}'")
    db.execute(f"ALTER TABLE {S}.files DROP CONSTRAINT IF EXISTS files_root_source_key")
    db.execute(f"ALTER TABLE {S}.files ADD CONSTRAINT files_collection_root_source_key UNIQUE (collection, root, source)")


def _refuse_dropping_others(db, collection: str) -> None:
    """A RagError when the index holds files of collections other than ``collection``."""
    named = {name for (name,) in db.execute(f"SELECT DISTINCT {_collection_column(db)} FROM {S}.files")}
    others = sorted((named | set(_created(db))) - {collection})
    if others:
        raise RagError(f"rebuilding starts from an empty index and would drop the collections {', '.join(others)}; "
                       "delete them first (rag collections delete NAME), or rebuild into another database")


def copy_index(source, url: str, *, approximate_from: int | None = None) -> int:
    """Fill the index at ``url`` (replaced) from an open index ``source`` (a
    folder store's ``FolderIndex``): its files, chunks and vectors as they are, no
    embedding again; the BM25 postings are made from the texts. For the
    benches. The number of chunks copied."""
    rows = source._db.execute(
        "SELECT c.id, c.chunk_id, c.position, c.char_start, c.char_end, c.page, c.n_tokens, c.text, c.context, "
        "c.location, f.root, f.source, f.path, f.sha256, f.size, c.lang, c.units FROM chunks c JOIN files f ON f.id = c.file_id "
        "ORDER BY f.id, c.position").fetchall()
    by_file: dict[tuple, list] = {}
    for r in rows:
        by_file.setdefault((r[10], r[11], r[12], r[13], r[14]), []).append(r)
    with open_writer(url, source.manifest, fresh=True, approximate_from=approximate_from) as writer:
        for (root, src, path, sha, size), items in by_file.items():
            chunks = [NewChunk(r[1], r[2], r[3], r[4], r[5], r[6], r[7], context=r[8], location=stored_location(r[9]),
                               lang=r[15], units=stored_units(r[16]))
                      for r in items]
            vectors = np.vstack([source._vectors.reconstruct(int(r[0])) for r in items])
            writer.add_file(root=root, source=src, path=path, sha256=sha, size=size, chunks=chunks, vectors=vectors)
        writer.commit()
    return len(rows)


__all__ = ["PostgresIndex", "PostgresWriter", "open_writer", "exists", "live_name", "live_manifest", "copy_index",
           "fit_vector_search"]

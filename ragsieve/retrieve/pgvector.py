"""A dense index kept in PostgreSQL with pgvector: passages, MiniLM vectors and an HNSW index in one table.

The index is named by a URL instead of a folder::

    postgresql://USER@HOST:PORT/DB?table=NAME      (table defaults to ragsieve_passages)

Every other part of the URL goes to libpq unchanged (``sslmode=...``, ``host=/socket/dir``);
keep passwords out of it with ``PGPASSWORD`` or ``~/.pgpass``, which libpq reads itself.

Layout (one table per index, plus one row per index in ``ragsieve_indexes``)::

    NAME(pos integer primary key, id text unique, title text, text text, meta jsonb, embedding vector(dim))
    NAME_hnsw: USING hnsw (embedding vector_cosine_ops) WITH (m, ef_construction)
    ragsieve_indexes(name text primary key, manifest jsonb)   {format_version, kind, encoder, dim, n_passages, ...}

What it supports: dense retrieval only (cosine similarity, the same encoder and HNSW settings
as a folder's ``dense/`` part), ``--add`` (new rows go into the live HNSW graph, nothing is
rebuilt), and an exact search (``exact=True``: the same table scanned in full) to measure the
HNSW recall. BM25 and hybrid indexes stay folders: their lexical side lives in bm25s, not in
the database.

A build runs in one transaction (table, rows, HNSW index, manifest row), so a killed build
leaves the database as it was; the database is checked before the (long) encoding starts.

Example::

    from ragsieve.retrieve import build_index, load_index

    build_index(passages, "postgresql://me@localhost/rag?table=docs", kind="dense", show_progress=False)
    load_index("postgresql://me@localhost/rag?table=docs").search("who discovered penicillin", k=5)
"""

from __future__ import annotations

import datetime as dt
import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence
from urllib.parse import parse_qsl, urlencode

import numpy as np

from ragsieve.data.records import Passage, with_stored_vector
from ragsieve.errors import RagsieveError
from ragsieve.specs import DEFAULT_ENCODER, is_index_url
from ragsieve.retrieve.base import Hit, Retriever, _check_k, check_passages
from ragsieve.retrieve.dense import (
    DEFAULT_BATCH_SIZE, DEFAULT_EF_CONSTRUCTION, DEFAULT_EF_SEARCH, DEFAULT_M, build_backend, encode_queries,
    load_index_encoder, normalise_rows, passage_vectors, query_backend,
)
from ragsieve.retrieve.scale import drop_ray_work, new_vectors, ray_vectors

if TYPE_CHECKING:
    import psycopg
    from sentence_transformers import SentenceTransformer

DEFAULT_TABLE = "ragsieve_passages"
MANIFESTS_TABLE = "ragsieve_indexes"
FORMAT_VERSION = 1
#: pgvector's HNSW scan returns at most hnsw.ef_search rows, and the setting stops at 1000
_MAX_EF_SEARCH = 1000
_TABLE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,57}")  # room for the "_hnsw" suffix in 63 bytes
_NEEDS_PGVECTOR = "install the pgvector extension on that server (or have an admin run CREATE EXTENSION vector there)"


def is_store_url(spec: object) -> bool:
    """Whether an index spec names a PostgreSQL table rather than a folder.

    Example::

        is_store_url("postgresql://me@localhost/rag")  # True
    """
    return is_index_url(spec)


@dataclass(frozen=True)
class StoreURL:
    """A parsed index URL: what libpq gets, the table, and password-free names for messages."""

    conninfo: str
    table: str
    server: str  # host:port/db

    @property
    def where(self) -> str:
        return f"{self.server} table {self.table}"

    @classmethod
    def parse(cls, url: str) -> "StoreURL":
        """Split off ``?table=``; a URL libpq cannot read is a one-line error.

        Example::

            StoreURL.parse("postgresql://me@db:5433/rag?table=docs").where  # 'db:5433/rag table docs'
        """
        from psycopg.conninfo import conninfo_to_dict

        # split by hand: urllib would turn postgresql:///db (no host: the local socket) into postgresql:/db
        base, _, query_text = url.strip().partition("?")
        query = parse_qsl(query_text, keep_blank_values=True)
        tables = [v for k, v in query if k == "table"]
        table = tables[-1] if tables else DEFAULT_TABLE
        if not _TABLE_NAME.fullmatch(table):
            raise RagsieveError(f"table name {table!r} in the index URL: use lowercase letters, digits and _ "
                                "(at most 58, not starting with a digit)")
        rest = urlencode([(k, v) for k, v in query if k != "table"])
        conninfo = f"{base}?{rest}" if rest else base
        try:
            params = conninfo_to_dict(conninfo)
        except Exception as exc:  # psycopg.ProgrammingError: libpq's own parse message
            raise RagsieveError(f"bad PostgreSQL URL: {_first_line(exc)}") from None
        host = str(params.get("host") or "local socket")  # libpq's default when the URL names no host
        server = f"{host}:{params.get('port') or 5432}/{params.get('dbname') or params.get('user') or ''}"
        return cls(conninfo=conninfo, table=table, server=server)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


@contextmanager
def _database_errors(store: StoreURL, doing: str) -> Iterator[None]:
    """A failure inside PostgreSQL (a dropped connection, a full disk, a lock timeout) as one line."""
    import psycopg

    try:
        yield
    except psycopg.Error as exc:
        raise RagsieveError(f"PostgreSQL at {store.where} failed while {doing}: {_first_line(exc)}") from None


def connect(url: StoreURL, *, create_extension: bool = False) -> "psycopg.Connection":
    """An autocommit connection with pgvector's types registered; the ``vector`` extension must be there.

    ``create_extension`` runs ``CREATE EXTENSION IF NOT EXISTS vector`` first (an index build does).

    Example::

        conn = connect(StoreURL.parse("postgresql://me@localhost/rag"))
    """
    import psycopg
    from pgvector.psycopg import register_vector

    try:
        conn = psycopg.connect(url.conninfo, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        raise RagsieveError(f"cannot connect to PostgreSQL at {url.server}: {_first_line(exc)}") from None
    try:
        if create_extension:
            try:
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            except psycopg.Error as exc:
                raise RagsieveError(f"PostgreSQL at {url.server} cannot create the vector extension "
                                    f"({_first_line(exc)}); {_NEEDS_PGVECTOR}") from None
        elif conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone() is None:
            raise RagsieveError(f"PostgreSQL at {url.server} has no vector extension (pgvector); {_NEEDS_PGVECTOR}")
        register_vector(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def _sql(template: str, **parts: str | int) -> Any:
    """A statement with names quoted as identifiers and ints as literals (DDL takes no parameters)."""
    from psycopg import sql

    return sql.SQL(template).format(
        **{k: sql.Literal(v) if isinstance(v, int) else sql.Identifier(v) for k, v in parts.items()}
    )


def read_store_manifest(conn: "psycopg.Connection", url: StoreURL) -> dict[str, Any]:
    """The manifest row of the index in ``url.table``; a one-line error if there is none.

    Example::

        read_store_manifest(conn, url)["n_passages"]
    """
    exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (MANIFESTS_TABLE,)).fetchone()[0]
    row = None
    if exists:
        row = conn.execute(_sql("SELECT manifest FROM {m} WHERE name = %s", m=MANIFESTS_TABLE), (url.table,)).fetchone()
    if row is None:
        raise RagsieveError(f"PostgreSQL at {url.where}: no ragsieve index there; build one with "
                            f"`ragsieve index --passages FILE --store URL`")
    manifest = row[0]
    version = manifest.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise RagsieveError(f"{url.where}: index format_version {version!r} is not supported "
                            f"(this ragsieve reads <= {FORMAT_VERSION})")
    return manifest


def _table_state(conn: "psycopg.Connection", url: StoreURL) -> str:
    """``"free"``, ``"index"`` (a ragsieve index) or ``"other"`` (someone else's table of that name)."""
    if conn.execute("SELECT to_regclass(%s) IS NULL", (url.table,)).fetchone()[0]:
        return "free"
    try:
        read_store_manifest(conn, url)
    except RagsieveError:
        return "other"
    return "index"


def _copy_rows(conn: "psycopg.Connection", table: str, passages: Sequence[Passage], vecs: np.ndarray, start: int) -> None:
    """Bulk-load rows with binary COPY (far faster than INSERTs, and the HNSW index is built after)."""
    from psycopg.types.json import Jsonb

    copy_sql = _sql("COPY {t} (pos, id, title, text, meta, embedding) FROM STDIN WITH (FORMAT BINARY)", t=table)
    with conn.cursor().copy(copy_sql) as copy:
        copy.set_types(["integer", "text", "text", "text", "jsonb", "vector"])
        for i, (p, v) in enumerate(zip(passages, vecs)):
            copy.write_row((start + i, p.id, p.title, p.text, Jsonb(p.meta) if p.meta else None, v))


def check_store_target(url: str, *, overwrite: bool = False, adding: Sequence[Passage] | None = None) -> None:
    """Refuse, in one line and before anything is encoded, what a build (or an append of ``adding``) would refuse.

    A build needs the server, the ``vector`` extension (created if missing and allowed) and a
    table that is free or holds a ragsieve index to ``overwrite``; an append needs the index and
    no passage id already in it.

    Example::

        check_store_target("postgresql://me@localhost/rag?table=docs", overwrite=True)
    """
    store = StoreURL.parse(url)
    if adding is not None:
        with connect(store) as conn, _database_errors(store, "reading the index"):
            read_store_manifest(conn, store)
            clash = conn.execute(_sql("SELECT id FROM {t} WHERE id = ANY(%s) ORDER BY id LIMIT 1", t=store.table),
                                 ([p.id for p in adding],)).fetchone()
        if clash:
            raise RagsieveError(f"{store.where}: passage id '{clash[0]}' is already in the index")
        return
    with connect(store, create_extension=True) as conn, _database_errors(store, "reading the index"):
        state = _table_state(conn, store)
    if state == "other":
        raise RagsieveError(f"{store.where}: that table exists and is not a ragsieve index; "
                            "name another with ?table=NAME in the URL")
    if state == "index" and not overwrite:
        raise RagsieveError(f"{store.where} already holds an index; use --overwrite (overwrite=True in Python) "
                            "or name another table with ?table=NAME")


def build_store_index(
    passages: Iterable[Passage],
    url: str,
    kind: str = "dense",
    encoder_spec: str = DEFAULT_ENCODER,
    *,
    overwrite: bool = False,
    encoder: "SentenceTransformer | None" = None,
    embeddings: np.ndarray | None = None,
    m: int = DEFAULT_M,
    ef_construction: int = DEFAULT_EF_CONSTRUCTION,
    ef_search: int = DEFAULT_EF_SEARCH,
    batch_size: int = DEFAULT_BATCH_SIZE,
    show_progress: bool = True,
    encoder_backend: str | None = None,
    ray: str | None = None,
    ray_workers: int | None = None,
    ray_shard_size: int | None = None,
) -> "PgVectorRetriever":
    """Embed ``passages`` and write them, with an HNSW index (cosine), into the table ``url`` names.

    Inputs as :meth:`DenseRetriever.build` (``embeddings`` skips encoding; ``encoder_backend`` and ``ray``
    choose where encoding runs; ``m`` / ``ef_construction`` / ``ef_search`` tune HNSW); ``kind`` must be ``"dense"``;
    ``overwrite`` replaces an existing ragsieve index in that table (never another table).

    Example::

        build_store_index(passages, "postgresql://me@localhost/rag?table=docs", show_progress=False)
    """
    if kind != "dense":
        raise RagsieveError(f"a PostgreSQL index is dense only (got kind '{kind}'); "
                            "BM25 and hybrid indexes are folders (--out DIR)")
    store = StoreURL.parse(url)
    passages = check_passages(passages)
    if m < 2 or ef_construction < 2 * m or not 1 <= ef_search <= _MAX_EF_SEARCH:
        raise RagsieveError(f"HNSW settings: need m >= 2, ef_construction >= 2*m and 1 <= ef_search <= "
                            f"{_MAX_EF_SEARCH}, got m={m}, ef_construction={ef_construction}, ef_search={ef_search}")
    check_store_target(url, overwrite=overwrite)  # before the (long) encoding, not after it
    backend = build_backend(encoder_backend, encoder, embeddings, encoder_spec)
    work = None
    if ray and embeddings is None:
        vecs, truncated, work = ray_vectors(passages, encoder_spec=encoder_spec, backend=backend, address=ray,
                                            workers=ray_workers, shard_size=ray_shard_size, batch_size=batch_size,
                                            show_progress=show_progress)
    else:
        vecs, truncated, encoder = passage_vectors(passages, embeddings, encoder=encoder, encoder_spec=encoder_spec,
                                                   backend=backend, batch_size=batch_size,
                                                   show_progress=show_progress)
    dim = int(vecs.shape[1])
    manifest = {
        "format_version": FORMAT_VERSION,
        "kind": "dense",
        "backend": "pgvector",
        "encoder": encoder_spec,
        "encoder_backend": backend,
        "dim": dim,
        "n_passages": len(passages),
        "truncated_count": truncated,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "options": {"m": m, "ef_construction": ef_construction, "ef_search": ef_search, "batch_size": batch_size},
    }
    from psycopg.types.json import Jsonb

    with connect(store) as conn, _database_errors(store, "building the index"), conn.transaction():
        conn.execute(_sql("CREATE TABLE IF NOT EXISTS {m} (name text PRIMARY KEY, manifest jsonb NOT NULL)",
                          m=MANIFESTS_TABLE))
        # the table lock serialises two builds; the second then finds what the first made
        conn.execute(_sql("LOCK TABLE {m} IN SHARE ROW EXCLUSIVE MODE", m=MANIFESTS_TABLE))
        state = _table_state(conn, store)
        if state == "other" or (state == "index" and not overwrite):
            raise RagsieveError(f"{store.where}: that table appeared during the build; build again")
        if state == "index":
            conn.execute(_sql("DROP TABLE {t}", t=store.table))
            conn.execute(_sql("DELETE FROM {m} WHERE name = %s", m=MANIFESTS_TABLE), (store.table,))
        conn.execute(_sql("CREATE TABLE {t} (pos integer PRIMARY KEY, id text NOT NULL UNIQUE, title text NOT NULL, "
                          "text text NOT NULL, meta jsonb, embedding vector({dim}) NOT NULL)", t=store.table, dim=dim))
        _copy_rows(conn, store.table, passages, vecs, start=0)
        # built after the rows are in: one pass, much faster than growing the graph row by row
        conn.execute(_sql("CREATE INDEX {i} ON {t} USING hnsw (embedding vector_cosine_ops) "
                          "WITH (m = {hnsw_m}, ef_construction = {efc})",
                          i=f"{store.table}_hnsw", t=store.table, hnsw_m=m, efc=ef_construction))
        conn.execute(_sql("INSERT INTO {m} (name, manifest) VALUES (%s, %s)", m=MANIFESTS_TABLE),
                     (store.table, Jsonb(manifest)))
    drop_ray_work(work)
    return PgVectorRetriever(url, manifest, encoder=encoder)


def add_to_store_index(url: str, passages: Iterable[Passage], *, show_progress: bool = False, ray: str | None = None,
                       ray_workers: int | None = None, ray_shard_size: int | None = None) -> "PgVectorRetriever":
    """Append ``passages`` to a PostgreSQL index: only they are encoded (on the index's backend; on Ray actors
    with ``ray``), and they join the live HNSW graph.

    Example::

        add_to_store_index("postgresql://me@localhost/rag?table=docs", read_corpus(["new_docs/"]))
    """
    from psycopg.types.json import Jsonb

    store = StoreURL.parse(url)
    new = check_passages(passages)
    check_store_target(url, adding=new)
    index = load_store_index(url)
    vecs, truncated, work = new_vectors(new, index.encoder_spec, index.query_backend, show_progress, ray,
                                        ray_workers, ray_shard_size)
    with connect(store) as conn, _database_errors(store, "adding passages"), conn.transaction():
        # the manifest row lock keeps two appends from taking the same positions
        row = conn.execute(_sql("SELECT manifest FROM {m} WHERE name = %s FOR UPDATE", m=MANIFESTS_TABLE),
                           (store.table,)).fetchone()
        start = conn.execute(_sql("SELECT coalesce(max(pos) + 1, 0) FROM {t}", t=store.table)).fetchone()[0]
        _copy_rows(conn, store.table, new, vecs, start=start)
        before = row[0].get("truncated_count")  # None: built from injected vectors, so unknown it stays
        manifest = {**row[0], "n_passages": start + len(new),
                    "truncated_count": None if before is None else before + truncated}
        conn.execute(_sql("UPDATE {m} SET manifest = %s WHERE name = %s", m=MANIFESTS_TABLE),
                     (Jsonb(manifest), store.table))
    drop_ray_work(work)
    return PgVectorRetriever(url, manifest)


def load_store_index(url: str) -> "PgVectorRetriever":
    """Open the index in the table ``url`` names (checks the server, pgvector and the manifest).

    Example::

        load_store_index("postgresql://me@localhost/rag?table=docs").search("penicillin", k=3)
    """
    store = StoreURL.parse(url)
    with connect(store) as conn, _database_errors(store, "reading the index"):
        manifest = read_store_manifest(conn, store)
    return PgVectorRetriever(url, manifest)


def _stored_array(value: Any) -> np.ndarray:
    """A ``vector`` column as float32: pgvector's adapter yields a ``Vector``, which numpy cannot read directly."""
    to_numpy = getattr(value, "to_numpy", None)
    return np.asarray(to_numpy() if to_numpy is not None else value, dtype=np.float32)


class PgVectorRetriever(Retriever):
    """Dense retrieval over a pgvector table (cosine similarity; see the module doc).

    Passages stay in the database: a search fetches only its hits, and :attr:`passages`
    reads the whole table only when asked. One connection per retriever, opened on first use
    and shared by threads under a lock; a retriever pickles without it (Ray workers reconnect).

    Example::

        retriever = load_index("postgresql://me@localhost/rag?table=docs")
        retriever.search("who wrote Hamlet", k=5)
        retriever.search_vectors(query_vecs, k=10, exact=True)  # the same table scanned in full
    """

    kind = "pgvector"
    uses_encoder = True

    def __init__(self, url: str, manifest: dict[str, Any], *, encoder: "SentenceTransformer | None" = None) -> None:
        super().__init__([])
        self.url = url
        self.store = StoreURL.parse(url)
        self.manifest = manifest
        self.encoder_spec = str(manifest["encoder"])
        self.encoder_backend = str(manifest.get("encoder_backend", "torch"))  # indexes before #74: torch built them
        self.dim = int(manifest["dim"])
        options = manifest.get("options") or {}
        self.ef_search = int(options.get("ef_search", DEFAULT_EF_SEARCH))
        self.batch_size = int(options.get("batch_size", DEFAULT_BATCH_SIZE))
        self.truncated_count = manifest.get("truncated_count")
        self._encoder = encoder
        self._conn: "psycopg.Connection | None" = None
        self._settings: dict[str, str] = {}  # what this session was SET to, so a search sends only its query
        self._lock = threading.Lock()
        self._all_passages: list[Passage] | None = None

    def __repr__(self) -> str:
        return f"PgVectorRetriever({self.store.where}, n_passages={len(self)})"

    def __len__(self) -> int:
        return int(self.manifest["n_passages"])

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_conn=None, _settings={}, _lock=None, _encoder=None)  # a connection and a lock stay here
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the connection (the next search opens another)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @property
    def passages(self) -> list[Passage]:
        """Every passage in index order, read from the table on first access (the whole table!)."""
        if self._all_passages is None:
            with self._connection() as conn, _database_errors(self.store, "reading the passages"):
                rows = conn.execute(_sql("SELECT id, title, text, meta FROM {t} ORDER BY pos", t=self.store.table))
                self._all_passages = [Passage(id=r[0], text=r[2], title=r[1], meta=r[3] or {}) for r in rows]
        return self._all_passages

    @property
    def encoder(self) -> "SentenceTransformer":
        """The bi-encoder the index was built with, loaded on first use."""
        if self._encoder is None:
            self._encoder = load_index_encoder(self.encoder_spec, self.dim, self.query_backend)
        return self._encoder

    @property
    def query_backend(self) -> str:
        """The backend queries encode on: the index's own (:func:`ragsieve.retrieve.dense.query_backend`)."""
        return query_backend(self.encoder_backend)

    @contextmanager
    def _connection(self) -> Iterator["psycopg.Connection"]:
        with self._lock:
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._conn = connect(self.store)
                self._settings = {}
            yield self._conn

    def _set(self, conn: "psycopg.Connection", name: str, value: str) -> None:
        """``SET name = value`` for this session, only when it changes (each SET is a round trip)."""
        if self._settings.get(name) != value:
            conn.execute("SELECT set_config(%s, %s, false)", (name, value))
            self._settings[name] = value

    # -- search -----------------------------------------------------------------------------
    def search_vectors(self, vectors: np.ndarray, k: int = 10, *, exact: bool = False) -> list[list[Hit]]:
        """Search with precomputed query vectors ``(n, dim)``; ``exact`` scans the table instead of the HNSW graph.

        Example::

            retriever.search_vectors(retriever.encode_queries(["who wrote Hamlet"]), k=3)
        """
        vectors = normalise_rows(np.atleast_2d(np.asarray(vectors)))
        if vectors.shape[1] != self.dim:
            raise RagsieveError(f"query vectors are {vectors.shape[1]}-d; the index is {self.dim}-d")
        k = _check_k(k)
        query = _sql("SELECT id, title, text, meta, embedding <=> %(q)s AS distance, embedding FROM {t} "
                     "ORDER BY embedding <=> %(q)s LIMIT %(k)s", t=self.store.table)
        exact = exact or k > _MAX_EF_SEARCH  # the HNSW scan cannot return more than ef_search rows
        import psycopg

        with _database_errors(self.store, "searching"):
            try:
                return self._run_searches(query, vectors, k, exact)
            except psycopg.OperationalError:
                if self._conn is not None and not self._conn.broken:
                    raise
                # a restarted server or a dropped connection: once more, on a new connection
                return self._run_searches(query, vectors, k, exact)

    def _run_searches(self, query: Any, vectors: np.ndarray, k: int, exact: bool) -> list[list[Hit]]:
        out: list[list[Hit]] = []
        with self._connection() as conn:
            # exact: no index scan, so PostgreSQL sorts every row by distance; otherwise the graph, always
            # (on a small table the planner would often pick the exact scan, and ef_search would mean nothing)
            self._set(conn, "enable_indexscan", "off" if exact else "on")
            self._set(conn, "enable_seqscan", "on" if exact else "off")
            if not exact:
                self._set(conn, "hnsw.ef_search", str(max(self.ef_search, min(k, _MAX_EF_SEARCH))))
            with conn.pipeline():  # every query of a batch sent before the first answer is awaited
                cursors = [conn.execute(query, {"q": vec, "k": k}) for vec in vectors]
                for cursor in cursors:
                    out.append([  # each passage carries its stored vector: a reranker's cosine need not encode it
                        Hit(with_stored_vector(Passage(id=r[0], text=r[2], title=r[1], meta=r[3] or {}),
                                               _stored_array(r[5]), self.encoder_spec),
                            score=1.0 - float(r[4]), rank=i)
                        for i, r in enumerate(cursor.fetchall())
                    ])
        return out

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        """Normalised query vectors from the index's encoder.

        Example::

            retriever.encode_queries(["who wrote Hamlet"]).shape  # (1, 384)
        """
        return encode_queries(self.encoder, queries, batch_size=self.batch_size, backend=self.query_backend)

    def _search(self, query: str, k: int) -> list[Hit]:
        return self._search_batch([query], k)[0]

    def _search_batch(self, queries: list[str], k: int) -> list[list[Hit]]:
        return self.search_vectors(self.encode_queries(queries), k)

    # -- the Retriever contract: an index in a database is built and opened by URL -----------
    @classmethod
    def build(cls, passages: Iterable[Passage], **options: Any) -> "PgVectorRetriever":
        """``build_store_index(passages, url=..., **options)``.

        Example::

            PgVectorRetriever.build(passages, url="postgresql://me@localhost/rag", show_progress=False)
        """
        url = options.pop("url", None)
        if not is_store_url(url):
            raise RagsieveError("PgVectorRetriever.build needs url='postgresql://...'")
        return build_store_index(passages, url, **options)

    def save(self, path: Any, *, with_passages: bool = True) -> None:
        """Nothing to save: the index lives in its database (every build commits it there)."""
        raise RagsieveError(f"a PostgreSQL index is not saved to a folder: it lives at {self.store.where}")

    @classmethod
    def load(cls, path: Any, *, passages: Sequence[Passage] | None = None) -> "PgVectorRetriever":
        """``load_store_index(url)``; ``passages`` are refused (they are in the table).

        Example::

            PgVectorRetriever.load("postgresql://me@localhost/rag?table=docs")
        """
        if passages is not None:
            raise RagsieveError("a PostgreSQL index reads its passages from its own table")
        return load_store_index(str(path))

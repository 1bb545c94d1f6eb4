"""The rows of an evolve store in one database: an SQLite file in the store folder (the embedded
default) or PostgreSQL (one store every serve replica writes to).

One schema (the SQLAlchemy Core tables below) and one code path serve both. A store is named by
:func:`locate_store`:

- ``state/mine``: rows in ``state/mine/evolve.sqlite``, LoRA deltas in ``state/mine/adapters``;
- ``state/mine`` + ``database="postgresql://rs@db/feedback"`` (``--db``, ``RAGSIEVE_FEEDBACK_DB``):
  rows in PostgreSQL, deltas in the folder, which remembers the database in ``evolve.database``
  (without its password: that comes from ``PGPASSWORD`` or ``~/.pgpass``), so later commands need
  only the folder;
- ``postgresql://rs@db/feedback`` alone: the rows only, all that ``/v1/feedback`` and traffic
  logging need (``ragsieve serve --feedback-store postgresql://...``).

Writes run in transactions that take the store's writer lock (SQLite ``BEGIN IMMEDIATE`` in WAL
mode with a busy timeout; a PostgreSQL transaction-level advisory lock), so both backends see the
same one-writer-at-a-time order, and a writer killed mid-transaction leaves nothing behind. Pure
appends (feedback rows) skip the lock on PostgreSQL.

The schema is versioned (``schema_version``); :data:`MIGRATIONS` are ordered steps run in one
write transaction when an older store opens. Version 1 is the SQLite layout of the code before
this module (no ``schema_version`` table): version 2 gives ``examples`` and ``test_examples`` an
explicit insertion order (``seq``), which SQLite kept in its hidden ``rowid`` and PostgreSQL lacks.

Example::

    location = locate_store("state/mine")             # or locate_store("state/mine", "postgresql://...")
    engine = open_database(location)
    with engine.connect() as conn:
        config = store_config_json(conn, location.label)
    with write_transaction(engine) as conn:
        conn.execute(meta.insert(), [{"key": "note", "value": "hi"}])
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import (
    BigInteger, Column, Float, Index, Integer, MetaData, PrimaryKeyConstraint, Table, Text, create_engine, event,
    func, inspect, select,
)
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError
from sqlalchemy.pool import NullPool

from ragsieve.artifacts import STORE_REBUILD, sqlite_error
from ragsieve.errors import RagsieveError
from ragsieve.specs import is_database_url, is_postgres_backend, sqlite_url

__all__ = [
    "DB_FILE", "DB_POINTER", "SCHEMA_VERSION", "StoreLocation", "close_engines", "database_error", "finished_adapters",
    "insert_rows", "is_database_url", "locate_store", "missing_store", "open_database", "store_config_json",
    "store_exists", "upsert", "write_transaction",
]

DB_FILE = "evolve.sqlite"
DB_POINTER = "evolve.database"  # a folder whose rows live in PostgreSQL: the database URL, without password
SCHEMA_VERSION = 2
#: the PostgreSQL advisory lock every write transaction of a store takes (one writer at a time, as on SQLite)
WRITER_LOCK = 0x72616773  # "rags"
#: held by a running `evolve step` on PostgreSQL, so steps from two machines do not train the same round
STEP_LOCK = WRITER_LOCK + 1

# SQLite's INTEGER PRIMARY KEY is its rowid (autoincrementing); PostgreSQL gets a BIGSERIAL
_ID = BigInteger().with_variant(Integer, "sqlite")

metadata = MetaData()
schema_version = Table("schema_version", metadata, Column("version", Integer, nullable=False))
meta = Table("meta", metadata, Column("key", Text, primary_key=True), Column("value", Text, nullable=False))
examples = Table(
    "examples", metadata,
    Column("seq", _ID, primary_key=True, autoincrement=True),  # insertion order
    Column("id", Text, nullable=False, unique=True),
    Column("round", Integer, nullable=False),
    Column("data", Text, nullable=False),
    Index("examples_round", "round"),
)
feedback = Table(
    "feedback", metadata,
    Column("example_id", Text, primary_key=True), Column("label", Integer, nullable=False),
    Column("added_at", Text, nullable=False),
)
pairs = Table(
    "pairs", metadata,
    Column("example_id", Text, nullable=False), Column("round", Integer, nullable=False),
    Column("label", Integer, nullable=False), Column("source", Text, nullable=False),
    PrimaryKeyConstraint("example_id", "round"),
)
rounds = Table(
    "rounds", metadata,
    Column("round", Integer, primary_key=True, autoincrement=False), Column("mode", Text, nullable=False),
    Column("adapter", Text), Column("record", Text, nullable=False), Column("finished_at", Text, nullable=False),
)
test_examples = Table(
    "test_examples", metadata,
    Column("seq", _ID, primary_key=True, autoincrement=True),
    Column("id", Text, nullable=False, unique=True),
    Column("data", Text, nullable=False),
)
verdicts = Table(
    "verdicts", metadata,
    Column("example_id", Text, nullable=False), Column("round", Integer, nullable=False),
    Column("logp_true", Float, nullable=False), Column("logp_false", Float, nullable=False),
    PrimaryKeyConstraint("example_id", "round"),
)
live_feedback = Table(
    "live_feedback", metadata,
    Column("id", _ID, primary_key=True, autoincrement=True),
    Column("query", Text, nullable=False), Column("document", Text, nullable=False),
    Column("label", Integer, nullable=False), Column("source", Text, nullable=False),
    Column("pair_id", Text), Column("fields", Text), Column("added_at", Text, nullable=False), Column("round", Integer),
    Index("live_feedback_round", "round"),
    sqlite_autoincrement=True,  # ids name promoted examples (live-<id>): never reused
)
live_traffic = Table(
    "live_traffic", metadata,
    Column("id", _ID, primary_key=True, autoincrement=True),
    Column("query", Text, nullable=False), Column("document", Text, nullable=False),
    Column("key", Text, nullable=False, unique=True), Column("added_at", Text, nullable=False),
    Column("round", Integer),
    Index("live_traffic_round", "round"),
    sqlite_autoincrement=True,
)


# --------------------------------------------------------------------------- naming a store

def _postgres_url(url: str) -> str:
    """``postgresql://`` / ``postgres://`` / ``postgresql+psycopg://`` → the psycopg 3 driver; others refused."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise RagsieveError(f"{url!r}: not a database URL (postgresql://user@host:port/database)") from None
    if not is_postgres_backend(parsed.get_backend_name()):
        raise RagsieveError(f"{_without_password(url)}: the feedback store's database is PostgreSQL "
                            "(postgresql://user@host:port/database); SQLite is the store folder's evolve.sqlite")
    driver = parsed.drivername.split("+")[-1]  # postgresql+psycopg → psycopg; no +driver → the backend itself
    if driver != "psycopg" and not is_postgres_backend(driver):
        raise RagsieveError(f"{_without_password(url)}: the PostgreSQL driver is psycopg (postgresql+psycopg://...)")
    return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def _without_password(url: str) -> str:
    """The URL as messages and the folder's ``evolve.database`` show it: no password, no driver name."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return url
    if is_postgres_backend(parsed.get_backend_name()):
        parsed = parsed.set(drivername="postgresql")
    # URL.set(password=None) keeps the password ("None: unchanged"): build the URL without one
    return URL.create(parsed.drivername, parsed.username, None, parsed.host, parsed.port, parsed.database,
                      parsed.query).render_as_string(hide_password=False)


@dataclass(frozen=True)
class StoreLocation:
    """Where a store's rows and adapters are: ``dir`` (None: rows only) and ``url`` (None: ``dir/evolve.sqlite``)."""

    dir: Path | None
    url: str | None = field(default=None, repr=False)  # may hold a password: never printed

    @property
    def postgres(self) -> bool:
        return self.url is not None

    @property
    def label(self) -> str:
        """What messages name: the SQLite file, or the database URL without its password."""
        return _without_password(self.url) if self.url else str(self.dir / DB_FILE)

    def engine_url(self) -> str:
        return self.url if self.url else sqlite_url(self.dir / DB_FILE)

    def need_dir(self, why: str) -> Path:
        if self.dir is None:
            raise RagsieveError(f"{self.label}: {why} needs the store folder (give the folder, not the database URL)")
        return self.dir


def locate_store(store: "str | os.PathLike[str] | StoreLocation", database: str | None = None) -> StoreLocation:
    """A store folder (SQLite, or PostgreSQL as its ``evolve.database`` says), a folder + ``database``
    URL, or a ``postgresql://`` URL alone (see the module doc)."""
    if isinstance(store, StoreLocation):
        if database is not None:
            raise RagsieveError("give the database once: the store already names one")
        return store
    if is_database_url(store):
        if database is not None:
            raise RagsieveError(f"{_without_password(str(store))}: give either a database URL or a store folder + --db")
        return StoreLocation(None, _postgres_url(str(store)))
    folder = Path(store)
    pointer = folder / DB_POINTER
    recorded = _postgres_url(pointer.read_text(encoding="utf-8").strip()) if pointer.is_file() else None
    if database is None:
        return StoreLocation(folder, recorded)
    url = _postgres_url(database)
    if (folder / DB_FILE).is_file():
        raise RagsieveError(f"{folder} keeps its rows in {DB_FILE}, not in {_without_password(url)}; "
                            "drop --db (or RAGSIEVE_FEEDBACK_DB)")
    if recorded is not None and _without_password(recorded) != _without_password(url):
        raise RagsieveError(f"{folder} keeps its rows in {_without_password(recorded)}, not in "
                            f"{_without_password(url)}")
    return StoreLocation(folder, url)


def write_pointer(location: StoreLocation) -> None:
    """A PostgreSQL-backed folder remembers its database (never the password)."""
    if location.postgres and location.dir is not None:
        (location.dir / DB_POINTER).write_text(_without_password(location.url) + "\n", encoding="utf-8")


def missing_store(store: "str | os.PathLike[str] | StoreLocation") -> RagsieveError:
    if isinstance(store, StoreLocation) and store.postgres:
        return RagsieveError(f"no evolve store in {store.label} (run `ragsieve evolve init --db ...` first)")
    name = store.dir if isinstance(store, StoreLocation) else store
    return RagsieveError(f"no evolve store at {name} (run `ragsieve evolve init` first)")


# --------------------------------------------------------------------------- engines and transactions

_engines: dict[tuple[int, str], Engine] = {}
_engines_lock = threading.Lock()


def _engine(location: StoreLocation) -> Engine:
    """One engine per database and process (a forked child builds its own: pooled connections do not cross a fork)."""
    key = (os.getpid(), location.engine_url())
    with _engines_lock:
        if key not in _engines:
            _engines[key] = _postgres_engine(key[1]) if location.postgres else _sqlite_engine(key[1])
        return _engines[key]


def close_engines() -> None:
    """Close every pooled connection of this process (a server's shutdown; a test's database dropped)."""
    with _engines_lock:
        engines = [e for (pid, _), e in _engines.items() if pid == os.getpid()]
        _engines.clear()
    for engine in engines:
        engine.dispose()


def _sqlite_engine(url: str) -> Engine:
    # a connection per use (NullPool): SQLite connects in microseconds, and no pooled handle outlives
    # the file it was opened on (a store replaced or restored under a running server)
    engine = create_engine(url, poolclass=NullPool, connect_args={"timeout": 60})

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn, _record) -> None:
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves (below): pysqlite's own is deferred and skips DDL
        dbapi_conn.execute("PRAGMA journal_mode=WAL")  # many readers beside one writer; the first read of the file
        dbapi_conn.execute("PRAGMA synchronous=FULL")

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        # a writer takes the write lock up front, so two writers queue (busy timeout) instead of deadlocking
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("store_write") else "BEGIN")

    return engine


def _postgres_engine(url: str) -> Engine:
    try:
        import psycopg  # noqa: F401  (a missing driver is one line, not SQLAlchemy's NoSuchModuleError)
    except ImportError:
        raise RagsieveError("a PostgreSQL feedback store needs psycopg 3: pip install 'psycopg[binary]>=3.1'") from None
    return create_engine(url, pool_pre_ping=True, pool_size=4, max_overflow=8, connect_args={"connect_timeout": 10})


@contextmanager
def write_transaction(engine: Engine, *, lock: bool = True) -> Iterator[Connection]:
    """One write transaction holding the store's writer lock (``lock=False``: a pure append, which
    on PostgreSQL needs none; SQLite always takes its one write lock); rolled back on any error, a
    kill included."""
    with engine.connect() as conn:
        conn.execution_options(store_write=True)
        with conn.begin():
            if lock and conn.dialect.name == "postgresql":
                conn.execute(select(func.pg_advisory_xact_lock(WRITER_LOCK)))
            yield conn


@contextmanager
def step_lock(location: StoreLocation, engine: Engine) -> Iterator[None]:
    """On PostgreSQL, a session lock that one ``evolve step`` at a time holds (a folder's file lock
    covers only its machine); released when the step ends or its process dies. Nothing on SQLite."""
    if not location.postgres:
        yield
        return
    with engine.connect() as conn:
        if not conn.execute(select(func.pg_try_advisory_lock(STEP_LOCK))).scalar():
            raise RagsieveError(f"another `evolve step` is running on {location.label}")
        conn.commit()  # the lock is the session's; no transaction stays open through the step
        try:
            yield
        finally:
            conn.execute(select(func.pg_advisory_unlock(STEP_LOCK)))
            conn.commit()


def database_error(location: StoreLocation, exc: BaseException) -> RagsieveError:
    """One line for a database failure: SQLite's as :func:`~ragsieve.artifacts.sqlite_error` (busy is not
    damage), PostgreSQL's with what the server said."""
    orig = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    if isinstance(orig, sqlite3.Error):
        return sqlite_error(location.label, orig, STORE_REBUILD)
    lines = [line.strip() for line in str(orig).splitlines() if line.strip()]
    reason = lines[0] if lines else type(orig).__name__
    if (isinstance(exc, DBAPIError) and exc.connection_invalidated) or "connect" in reason.lower():
        return RagsieveError(f"{location.label}: cannot connect ({reason}); check the server is up, the URL, "
                             "and the password (PGPASSWORD or ~/.pgpass)")
    return RagsieveError(f"{location.label}: {reason}")


# --------------------------------------------------------------------------- schema versions

def _v2_ordered_examples(conn: Connection) -> None:
    """``examples`` and ``test_examples`` get ``seq``, their insertion order (SQLite's hidden rowid until now;
    version 1 stores exist only as SQLite files)."""
    names = set(inspect(conn).get_table_names())
    for table in (examples, test_examples):
        if table.name not in names:
            continue  # created fresh below
        old = f"{table.name}_v1"
        conn.exec_driver_sql(f"ALTER TABLE {table.name} RENAME TO {old}")
        for index in table.indexes:  # SQLite index names are per database: free them for the new table's
            conn.exec_driver_sql(f"DROP INDEX IF EXISTS {index.name}")
        table.create(conn)
        cols = ", ".join(c.name for c in table.columns if c.name != "seq")
        conn.exec_driver_sql(f"INSERT INTO {table.name} (seq, {cols}) SELECT rowid, {cols} FROM {old} ORDER BY rowid")
        conn.exec_driver_sql(f"DROP TABLE {old}")


#: (version it brings the store to, step); run in order, all in one transaction
MIGRATIONS = [(2, _v2_ordered_examples)]
assert MIGRATIONS[-1][0] == SCHEMA_VERSION


def _stored_version(conn: Connection) -> int | None:
    """The store's schema version; 1 for a store of the code before versions; None for an empty database."""
    names = set(inspect(conn).get_table_names())
    if "schema_version" in names:
        return conn.execute(select(schema_version.c.version)).scalar_one()
    return 1 if "meta" in names else None


def _migrate(conn: Connection, location: StoreLocation) -> None:
    version = _stored_version(conn)
    if version is not None and version > SCHEMA_VERSION:
        raise RagsieveError(f"{location.label}: schema version {version} is newer than this ragsieve's "
                            f"({SCHEMA_VERSION}); upgrade ragsieve")
    if version is not None:
        for target, step in MIGRATIONS:
            if target > version:
                step(conn)
    metadata.create_all(conn, checkfirst=True)  # a fresh store, or a table an older store never made
    conn.execute(schema_version.delete())
    conn.execute(schema_version.insert(), [{"version": SCHEMA_VERSION}])


def open_database(location: StoreLocation, *, create: bool = False) -> Engine:
    """The store's engine, its schema at :data:`SCHEMA_VERSION` (an older store is migrated once, under
    the writer lock). A missing store is an error unless ``create``."""
    if not location.postgres:
        folder = location.need_dir("SQLite")
        if folder.is_file():
            raise RagsieveError(f"{folder}: is a file; give the evolve store folder (the one holding {DB_FILE})")
        if not (folder / DB_FILE).is_file():
            if not create:
                raise missing_store(location)
            folder.mkdir(parents=True, exist_ok=True)
    engine = _engine(location)
    if _schema_key(location) in _verified:  # a server opens its store per request: checked on the first
        return engine
    try:
        with engine.connect() as conn:
            current = _stored_version(conn)
        if current is None and not create:
            raise missing_store(location)
        if current != SCHEMA_VERSION:
            with write_transaction(engine) as conn:
                _migrate(conn, location)
    except SQLAlchemyError as exc:
        raise database_error(location, exc) from None
    _verified.add(_schema_key(location))
    return engine


#: stores whose schema this process has checked, by :func:`_schema_key`
_verified: set[tuple] = set()


def _schema_key(location: StoreLocation) -> tuple:
    """A store's identity for :data:`_verified`: an SQLite file by inode, so a file replaced under a
    running server (restored, re-created) is checked again."""
    if location.postgres:
        return os.getpid(), location.url
    try:
        stat = (location.dir / DB_FILE).stat()
    except FileNotFoundError:
        return ()  # not made yet (create): never in the set
    return os.getpid(), location.engine_url(), stat.st_dev, stat.st_ino


def store_exists(location: StoreLocation) -> bool:
    """Whether a store was initialised there (its configuration is saved)."""
    if not location.postgres:
        return location.dir is not None and (location.dir / DB_FILE).is_file()
    engine = _engine(location)
    try:
        with engine.connect() as conn:
            if "meta" not in inspect(conn).get_table_names():
                return False
            return conn.execute(select(meta.c.value).where(meta.c.key == "config")).first() is not None
    except SQLAlchemyError as exc:
        raise database_error(location, exc) from None


# --------------------------------------------------------------------------- rows both backends write alike

def insert_rows(conn: Connection, table: Table, rows: Sequence[dict]) -> None:
    """``INSERT`` many rows in one statement batch (nothing for none)."""
    if rows:
        conn.execute(table.insert(), list(rows))


def _dialect_insert(conn: Connection, table: Table):
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert(table)


def upsert(conn: Connection, table: Table, rows: Sequence[dict], keys: Sequence[str]) -> None:
    """Insert, or replace the row with the same ``keys`` (SQLite's ``INSERT OR REPLACE``)."""
    if not rows:
        return
    stmt = _dialect_insert(conn, table)
    others = {c.name: stmt.excluded[c.name] for c in table.columns if c.name not in keys}
    conn.execute(stmt.on_conflict_do_update(index_elements=list(keys), set_=others), list(rows))


def insert_new(conn: Connection, table: Table, row: dict, key: str) -> int:
    """Insert unless a row with the same ``key`` exists (``INSERT OR IGNORE``); 1 if written, else 0."""
    stmt = _dialect_insert(conn, table).values(**row).on_conflict_do_nothing(index_elements=[key])
    # RETURNING counts what was written on both backends (rowcount is -1 here on psycopg)
    return len(conn.execute(stmt.returning(table.c[key])).all())


# --------------------------------------------------------------------------- what serving reads

def store_config_json(conn: Connection, label: str) -> dict:
    """The store's saved configuration (``EvolveStoreConfig`` as JSON: every field, defaults included)."""
    import json

    value = conn.execute(select(meta.c.value).where(meta.c.key == "config")).scalar()
    if value is None:
        raise RagsieveError(f"evolve store {label} has no configuration (run `ragsieve evolve init`)")
    return json.loads(value)


def finished_adapters(conn: Connection, store_dir: Path) -> list[Path]:
    """The deltas of the finished rounds, in order (rounds that trained nothing have none)."""
    rows = conn.execute(select(rounds.c.adapter).where(rounds.c.adapter.is_not(None)).order_by(rounds.c.round))
    return [Path(store_dir) / r[0] for r in rows]

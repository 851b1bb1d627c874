"""PostgreSQL as the daemon's store (`store = "postgres"`): the Store seam's second implementation.

Rules kept here:
- One commit = one transaction: the batch's mutations go into `mutations` (a sequence-numbered
  feed, for several daemons on one database) and their row operations (daemon/postgres/rows.py)
  into the tiers' tables, and `commit` returns only after COMMIT returned (synchronous_commit on).
- The driver is psycopg 3's sync pool, called from trio through `trio.to_thread.run_sync` with a
  CapacityLimiter of the pool's size (psycopg's async API needs asyncio). Nothing else touches the
  pool; each call borrows a connection for its transaction and gives it back.
- What a failure means (daemon/storage/store.py): a connection that broke (a restarted server's,
  or one lost during the transaction, COMMIT included) gets the batch once more on a fresh one; a
  connection that cannot be had, or a second break, is `unavailable` (retryable). Both retries are
  safe because every row operation is an upsert or a delete by key of whole records: a batch
  committed twice leaves the same rows (and appears twice in the feed, whose mutations are
  state-based: applying one twice changes nothing). A server that refuses the write (a full disk, a read-only server, a missing
  permission, any other error it raises) is `read_only`, with the server's message.
- The schema is created or migrated at start (`schema_version`); a database of a newer version is
  refused, saying so.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import trio

from ..storage.store import StoreUnavailable
from .rows import TABLES, RowOp, row_ops

log = logging.getLogger("eurekamem.postgres")

SCHEMA_VERSION = 3  # 2: an HNSW index per embedding model on memories.vec (vector_indexes); 3: index_snapshots

_BODY = "seq bigint NOT NULL, pos integer NOT NULL, body bytea NOT NULL"


def _schema() -> list[str]:
    statements = [
        "CREATE EXTENSION IF NOT EXISTS vector",
        "CREATE TABLE IF NOT EXISTS schema_version (version integer NOT NULL)",
        "CREATE SEQUENCE IF NOT EXISTS mutation_seq",
        "CREATE TABLE IF NOT EXISTS mutations (seq bigint PRIMARY KEY, at timestamptz NOT NULL DEFAULT now(),"
        " body bytea NOT NULL)",
        # the models whose vectors have their HNSW index (index_name: vector_index_name)
        "CREATE TABLE IF NOT EXISTS vector_indexes (model text PRIMARY KEY, dim integer NOT NULL)",
    ]
    for table, keys in TABLES.items():
        columns = [
            f"{key} {'integer' if key == 'version' else 'bigint' if key == 'mseq' else 'bytea'} NOT NULL"
            for key in keys
        ]
        extra = ""
        if table == "memories":
            extra = ", model text NOT NULL DEFAULT '', vec vector"
        elif table == "memory_versions":
            extra = ", tail_seq bigint, tail_pos integer, tail bytea"
        statements.append(
            f"CREATE TABLE IF NOT EXISTS {table} ({', '.join(columns)}, {_BODY}{extra}, PRIMARY KEY ({', '.join(keys)}))"
        )
    from .snapshots import schema as snapshot_schema  # version 3: tier 4's index snapshots

    return statements + snapshot_schema()


def vector_index_name(model: str, dim: int) -> str:
    """The HNSW index of one model's vectors (a name PostgreSQL takes whatever the model's name)."""
    return f"memories_vec_{hashlib.sha256(model.encode()).hexdigest()[:16]}_{dim}"


def _create_vector_index(conn: Any, model: str, dim: int) -> None:
    """An HNSW index (cosine) over the vectors of one model: the column holds every model's, of
    several dimensions, so the index is on the cast to this model's dimension, for its rows alone;
    pgvector's own search (`PostgresStore.nearest`) uses it. Recorded in vector_indexes."""
    from psycopg import sql

    conn.execute(
        sql.SQL("CREATE INDEX IF NOT EXISTS {} ON memories USING hnsw ((vec::vector({})) vector_cosine_ops) WHERE model = {}").format(
            sql.Identifier(vector_index_name(model, dim)), sql.Literal(dim), sql.Literal(model)
        )
    )
    conn.execute("INSERT INTO vector_indexes VALUES (%s, %s) ON CONFLICT (model) DO NOTHING", (model, dim))


class SchemaTooNew(Exception):
    """The database was made by a newer eurekamem."""


def _classify(exc: BaseException) -> StoreUnavailable:
    """What a failed transaction's writes answer (the module's rule)."""
    import psycopg
    import psycopg_pool

    sqlstate = getattr(exc, "sqlstate", None) or ""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    # class 53: insufficient resources (disk full, out of memory); 25006: read-only transaction
    # (a standby, default_transaction_read_only); 42501: insufficient privilege
    if sqlstate[:2] == "53" or sqlstate in ("25006", "42501"):
        return StoreUnavailable(f"PostgreSQL refused the write: {message}", "read_only", store="postgres")
    if isinstance(exc, (psycopg.OperationalError, psycopg_pool.PoolTimeout, psycopg.InterfaceError)):
        return StoreUnavailable(f"PostgreSQL is not reachable: {message}", "unavailable", store="postgres")
    return StoreUnavailable(f"PostgreSQL refused the write: {message}", "read_only", store="postgres")


class PostgresStore:
    """The Store seam (daemon/storage/store.py) over one PostgreSQL database (the module's rule)."""

    store_name = "postgres"

    def __init__(self, dsn: str, *, pool_size: int, timeout: float = 5.0) -> None:
        self.dsn = dsn
        self.pool_size = pool_size
        self.timeout = timeout
        self.limiter = trio.CapacityLimiter(pool_size)
        self.pool: Any = None
        self.commits = 0
        self.failures = 0
        self.last_error: str | None = None
        self.attempts = 0  # connect_once's, this daemon's life
        # the models that have their HNSW index: read at open, grown by the commit that brings a
        # model's first vector (worker threads: under the lock)
        self.indexed: set[str] = set()
        self._index_lock = threading.Lock()
        self.next_attempt_in: float | None = None  # connect(): the back-off before the next attempt

    # --- life -------------------------------------------------------------------------------------

    def open(self) -> None:
        """Connect, create or check the schema, and open the pool (in a thread: it blocks).
        Raises SchemaTooNew, or psycopg's errors when the server cannot be reached."""
        import psycopg
        from pgvector.psycopg import register_vector
        from psycopg_pool import ConnectionPool

        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=max(1, int(self.timeout))) as conn:
            self._migrate(conn)

        def configure(conn: Any) -> None:
            register_vector(conn)
            conn.autocommit = False

        self.pool = ConnectionPool(
            self.dsn,
            min_size=1,
            max_size=self.pool_size,
            timeout=self.timeout,
            kwargs={"connect_timeout": max(1, int(self.timeout))},
            configure=configure,
            open=False,
        )
        self.pool.open(wait=True, timeout=self.timeout)

    async def connect_once(self) -> bool:
        """One attempt at open(), in a thread: True once connected; False when the server cannot be
        reached (the reason in last_error). A database of a newer schema stops the daemon (StartupError)."""
        from ..errors import StartupError

        self.attempts += 1
        try:
            await trio.to_thread.run_sync(self.open)
        except SchemaTooNew as exc:
            raise StartupError(str(exc)) from None
        except Exception as exc:
            self.close()
            self.last_error = str(_classify(exc))
            return False
        self.last_error = None
        self.next_attempt_in = None
        log.info("store: PostgreSQL (%s), schema version %d, pool of %d", shown_dsn(self.dsn), SCHEMA_VERSION, self.pool_size)
        return True

    async def connect(self) -> None:
        """connect_once until it connects, with back-off (0.5 s doubling to 30 s, each failure logged)."""
        delay = 0.5
        while not await self.connect_once():
            log.warning(
                "PostgreSQL (%s) cannot be reached: %s; trying again in %.1f s", shown_dsn(self.dsn), self.last_error, delay
            )
            self.next_attempt_in = delay
            await trio.sleep(delay)
            delay = min(delay * 2, 30.0)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def _migrate(self, conn: Any) -> None:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(727001)")  # two daemons starting at once: one migrates
            exists = conn.execute("SELECT to_regclass('schema_version') IS NOT NULL").fetchone()[0]
            version = 0
            if exists:
                row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
                version = row[0] or 0
            if version > SCHEMA_VERSION:
                raise SchemaTooNew(
                    f"the database's schema is version {version}, made by a newer eurekamem; this one knows "
                    f"version {SCHEMA_VERSION}: upgrade eurekamem, or point postgres_dsn at another database"
                )
            if version < SCHEMA_VERSION:
                for statement in _schema():
                    conn.execute(statement)
                # version 1 had no vector index: one per model already stored (a fresh database has none)
                for model, dim in conn.execute(
                    "SELECT model, vector_dims(vec) FROM memories WHERE vec IS NOT NULL GROUP BY 1, 2"
                ).fetchall():
                    _create_vector_index(conn, model, dim)
                conn.execute("DELETE FROM schema_version")
                conn.execute("INSERT INTO schema_version VALUES (%s)", (SCHEMA_VERSION,))
            indexed = {model for (model,) in conn.execute("SELECT model FROM vector_indexes").fetchall()}
        with self._index_lock:
            self.indexed = indexed

    # --- the seam -----------------------------------------------------------------------------------

    async def commit(self, mutations: Sequence[Any]) -> None:
        if not mutations:
            return
        batch = list(mutations)
        try:
            await trio.to_thread.run_sync(self._commit_sync, batch, limiter=self.limiter)
        except StoreUnavailable as exc:
            self.failures += 1
            self.last_error = str(exc)
            raise
        self.commits += 1

    def _commit_sync(self, mutations: list[Any]) -> None:
        import psycopg
        import psycopg_pool

        if self.pool is None:
            raise StoreUnavailable("PostgreSQL is not connected", "unavailable", store="postgres")
        for attempt in (1, 2):
            try:
                self._transaction(mutations)
                self._index_new_models(mutations)
                return
            except Exception as exc:
                if attempt == 1 and isinstance(exc, psycopg.OperationalError) and not isinstance(exc, psycopg_pool.PoolTimeout):
                    # a pooled connection that had broken (the server restarted), or one lost during
                    # the transaction: once more on a fresh one. Safe whatever the first attempt did:
                    # every row operation is an upsert or a delete by key of whole records (rows.py),
                    # so a batch committed twice leaves the same rows (the feed holds it twice)
                    log.info("PostgreSQL: a connection broke during a commit (%s); trying it once on another", exc)
                    continue
                raise _classify(exc) from exc

    def _index_new_models(self, mutations: list[Any]) -> None:
        """After a commit that stored the first vector of a model: that model's HNSW index (the
        index helps pgvector's own queries only; failing to make it fails no write: logged, tried
        again at the next such commit)."""
        models = _vector_models(mutations)
        if not models:
            return
        with self._index_lock:
            for model, dim in models:
                if model in self.indexed:
                    continue
                try:
                    with self.pool.connection() as conn, conn.transaction():
                        _create_vector_index(conn, model, dim)
                except Exception as exc:
                    log.warning("PostgreSQL: the HNSW index of %s's vectors could not be made: %s", model, exc)
                    continue
                self.indexed.add(model)
                log.info("PostgreSQL: HNSW index %s made for %s's vectors", vector_index_name(model, dim), model)

    def nearest(self, model: str, vector: Any, k: int, ef_search: int = 100) -> list[str]:
        """pgvector's own nearest memories of one model's vectors (cosine, through its HNSW index):
        the ids, nearest first. Not what the daemon searches with (its caches); what a reader of the
        database alone would run, and the benchmark's anchor. Blocking."""
        from psycopg import sql

        dim = int(np.asarray(vector).shape[0])
        # the model inlined, not a parameter: a generic plan could not match the partial index's WHERE
        query = sql.SQL(
            "SELECT id FROM memories WHERE model = {} ORDER BY vec::vector({}) <=> %s::vector({}) LIMIT %s"
        ).format(sql.Literal(model), sql.Literal(dim), sql.Literal(dim))
        with self.pool.connection() as conn, conn.transaction():
            conn.execute(sql.SQL("SET LOCAL hnsw.ef_search = {}").format(sql.Literal(int(ef_search))))
            rows = conn.execute(query, (np.asarray(vector, dtype=np.float32), k)).fetchall()
        return [bytes(row[0]).decode("utf-8", "surrogatepass") for row in rows]

    def _transaction(self, mutations: list[Any]) -> None:
        """One batch's transaction (the module's rule), sent at once in psycopg's pipeline mode
        (BEGIN, every statement in order, COMMIT: one round trip and the commit's flush, where a
        statement at a time would wait on the server for each): each mutation takes its seq in the
        feed (nextval) and its row operations take it from currval, in the same session."""
        from ..storage.store import mutation_encoder

        with self.pool.connection() as conn, conn.pipeline(), conn.transaction(), conn.cursor() as cur:
            for mutation in mutations:
                cur.execute(_INSERT_MUTATION, (mutation_encoder.encode(mutation),))
                for pos, op in enumerate(row_ops(mutation)):
                    sql, args = _statement(op, pos)
                    cur.execute(sql, args)

    # --- start-up -----------------------------------------------------------------------------------

    def rows_in_order(self) -> Iterator[tuple[bytes, bytes]]:
        """Every stored body in commit order, with the memory's vector where it has one (b""):
        what start-up applies (the rows module's rule). Blocking: call it from a thread."""
        parts = [f"SELECT seq, pos, body, NULL::vector AS vec FROM {t}" for t in TABLES if t != "memories"]
        parts.append("SELECT seq, pos, body, vec FROM memories")
        parts.append("SELECT tail_seq, tail_pos, tail, NULL::vector FROM memory_versions WHERE tail IS NOT NULL")
        query = " UNION ALL ".join(parts) + " ORDER BY 1, 2"
        with self.pool.connection() as conn:
            with conn.transaction(), conn.cursor(name="load", binary=True) as cur:  # binary: vectors not parsed from text
                cur.itersize = 2000
                cur.execute(query)
                for _seq, _pos, body, vec in cur:
                    yield bytes(body), _vector_bytes(vec)

    def is_empty(self) -> bool:
        """Whether no mutation was ever committed here (a first start imports EurekaClaw's files). Blocking."""
        with self.pool.connection() as conn:
            return bool(conn.execute("SELECT NOT EXISTS (SELECT 1 FROM mutations)").fetchone()[0])

    def counts(self) -> dict[str, int]:
        """Rows per table (verify, migrate, sys.stats)."""
        with self.pool.connection() as conn:
            return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("mutations", *TABLES)}

    def statistics(self) -> dict[str, Any]:
        return {
            "store": "postgres",
            "commits": self.commits,
            "failures": self.failures,
            "last_error": self.last_error,
            "pool_size": self.pool_size,
            "connected": self.pool is not None,
            "attempts": self.attempts,
            "next_attempt_in": self.next_attempt_in,
        }


def _vector_models(mutations: list[Any]) -> set[tuple[str, int]]:
    """The (model, dimension) of every vector the mutations store (a CommitJob's and a review's memories too)."""
    from ..jobs.state import CommitJob
    from ..memory.records import PutMemory
    from ..memory.review import PutReview

    found: set[tuple[str, int]] = set()
    for mutation in mutations:
        if isinstance(mutation, CommitJob):
            found |= _vector_models(list(mutation.parts))
        elif isinstance(mutation, PutReview) and mutation.memory is not None:
            found |= _vector_models([mutation.memory])
        elif isinstance(mutation, PutMemory) and mutation.vector and mutation.model:
            found.add((mutation.model, len(mutation.vector) // 4))
    return found


def _vector_bytes(value: Any) -> bytes:
    """A pgvector value as read (the pgvector package's Vector, or a numpy array) as float32 bytes."""
    if value is None:
        return b""
    if hasattr(value, "to_numpy"):
        value = value.to_numpy()
    return np.asarray(value, dtype=np.float32).tobytes()


_INSERT_MUTATION = "INSERT INTO mutations (seq, body) VALUES (nextval('mutation_seq'), %s)"
_SEQ = "currval('mutation_seq')"  # the seq of the mutation inserted just before, in this session


def _statement(op: RowOp, pos: int) -> tuple[str, tuple[Any, ...]]:
    keys = TABLES[op.table]
    if op.op == "put":
        columns = [*keys, "seq", "pos", "body"]
        values: list[Any] = [*op.key, pos, op.body]
        if op.table == "memories":
            columns += ["model", "vec"]
            values += [op.model, np.frombuffer(op.vector, dtype=np.float32) if op.vector else None]
        updates = [f"{c} = EXCLUDED.{c}" for c in columns if c not in keys]
        if op.table == "memory_versions":
            updates += ["tail = NULL", "tail_seq = NULL", "tail_pos = NULL"]
        marks = ", ".join([*["%s"] * len(keys), _SEQ, *["%s"] * (len(columns) - len(keys) - 1)])
        sql = (
            f"INSERT INTO {op.table} ({', '.join(columns)}) VALUES ({marks}) "
            f"ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {', '.join(updates)}"
        )
        return sql, tuple(values)
    if op.op == "delete":
        where = " AND ".join(f"{key} = %s" for key in keys[: len(op.key)])
        return f"DELETE FROM {op.table} WHERE {where}", op.key
    if op.op == "delete_from_version":
        return "DELETE FROM memory_versions WHERE id = %s AND version >= %s", op.key
    if op.op == "version_tail":
        return (
            f"UPDATE memory_versions SET tail = %s, tail_seq = {_SEQ}, tail_pos = %s WHERE id = %s AND version ="
            " (SELECT max(version) FROM memory_versions WHERE id = %s)",
            (op.body, pos, op.key[0], op.key[0]),
        )
    raise ValueError(f"unknown row operation {op.op!r}")


def shown_dsn(dsn: str) -> str:
    """The DSN as a log line may show it: its password replaced."""
    try:
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        parts = conninfo_to_dict(dsn)
    except Exception:  # psycopg missing, or a DSN it cannot parse: show nothing of it
        return "(a connection string)"
    if "password" in parts:
        parts["password"] = "***"
    return make_conninfo(**{k: str(v) for k, v in parts.items()})


def postgres_store(config: Any) -> PostgresStore:
    """The configured PostgresStore, not connected yet (`connect_once`, `connect`); psycopg missing
    stops start-up with the reason (StartupError)."""
    from ..errors import StartupError

    try:
        import pgvector.psycopg  # noqa: F401
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        raise StartupError(
            f"store = postgres needs psycopg 3, psycopg_pool and pgvector ({exc}): pip install 'eurekamem[postgres]'"
        ) from None
    return PostgresStore(config.postgres_dsn, pool_size=config.postgres_pool_size)

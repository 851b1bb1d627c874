"""PostgreSQL as the daemon's store (`store = "postgres"`): the Store seam's second implementation.

Rules kept here:
- A commit's batch is in one transaction (with the other batches waiting at the time: `commit`):
  its mutations go into `mutations` (the change feed, daemon/postgres/feed.py, ordered by the
  feed's lock) and their row operations (daemon/postgres/rows.py) into the tiers' tables, and
  `commit` returns only after COMMIT returned (synchronous_commit on).
- The driver is psycopg 3's sync pool, called from trio through `trio.to_thread.run_sync` with a
  CapacityLimiter of the pool's size (psycopg's async API needs asyncio). Nothing else touches the
  pool; each call borrows a connection for its transaction and gives it back.
- What a failure means (daemon/storage/store.py): a connection that cannot be had is `unavailable`
  (retryable; nothing was sent). A connection that broke with the transaction sent (a restarted
  server's, or one lost during the transaction, COMMIT included) leaves the batch in doubt: it may
  have committed, and the caches, rolled back, would then lack rows the database holds. So it is
  committed again, on fresh connections, until a COMMIT returns or `timeout` passes (the server
  away: a short pause between tries): the outcome is then known, and the answer true. Only a batch
  still in doubt at the deadline answers `unavailable` with `data.in_doubt` (counted in
  `in_doubt`; a client's retry, or the change feed, brings the caches back to the rows). Committing
  again is safe because every row operation is an upsert or a delete by key of whole records: a
  batch committed twice leaves the same rows (and appears twice in the feed, whose mutations are
  state-based: applying one twice changes nothing), and the actor waits for this commit before
  its next batch, so nothing newer of its keys can be overwritten. A server that refuses the write (a full disk, a read-only server, a missing
  permission, any other error it raises) is `read_only`, with the server's message.
- Failover (several hosts in the DSN: a primary and its standbys): a connection is only ever made
  to the writable one (libpq's `target_session_attrs=read-write`, added when the DSN names several
  hosts and says nothing). While the primary is gone and no standby is promoted, every connect
  fails, so writes answer `unavailable`; a session that is on a read-only server anyway answers
  `unavailable` too (not `read_only`: the standby is about to be promoted, or the primary is on
  another host), and is closed, so the pool connects again, to the primary. The first broken
  connection makes the pool check its idle ones (they went to the same dead server) and puts the
  store in `reconnecting`: until the pool has a connection ready again, each commit connects on its
  own (and closes it after), so while the server is away a write answers `unavailable` as soon as
  libpq fails to connect, not after the pool's timeout, and the first commit after a promotion
  reaches the new primary at once, not after the pool's reconnection back-off (1, 2, 4 s..., which
  gives up after `timeout` here, not psycopg_pool's 5 minutes, and starts again at the next commit).
  Every connection bounds how long a vanished host may hold it (`_connect_options`).
- The schema is created or migrated at start (`schema_version`); a database of a newer version is
  refused, saying so.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import numpy as np
import trio

from ..storage.store import StoreConflict, StoreUnavailable
from .feed import FEED_CHANNEL, FEED_LOCK, FEED_SCHEMA, HEAD, OwnCommits
from .rows import TABLES, RowOp, row_ops

log = logging.getLogger("eurekamem.postgres")

# 2: an HNSW index per embedding model on memories.vec (vector_indexes)
# 3: the change feed (feed.py); job_queue, the team's job queue (daemon/postgres/jobqueue.py);
#    index_snapshots, tier 4's index snapshots (daemon/postgres/snapshots.py)
SCHEMA_VERSION = 3

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
        *FEED_SCHEMA,
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
    from .jobtable import SCHEMA as JOB_QUEUE_SCHEMA
    from .snapshots import schema as snapshot_schema  # version 3: tier 4's index snapshots

    return statements + JOB_QUEUE_SCHEMA + snapshot_schema()


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


class _Unreached(Exception):
    """A commit's own connection could not be made: nothing of the transaction was sent."""


def _in_doubt(exc: BaseException) -> StoreUnavailable:
    """What a batch answers whose connection broke and that could not be committed again (the
    module's rule): its outcome is unknown."""
    log.warning("PostgreSQL: a commit in doubt (its connection broke) could not be committed again: %s", exc)
    return StoreUnavailable(
        f"PostgreSQL is not reachable; the outcome of a COMMIT is unknown: {_first_line(exc)}",
        "unavailable", store="postgres", in_doubt=True,
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _classify(exc: BaseException, failover: bool = False) -> StoreUnavailable:
    """What a failed transaction's writes answer (the module's rule); `failover`: the DSN names
    several hosts, so a read-only server is a standby, not the database's answer."""
    import psycopg
    import psycopg_pool

    sqlstate = getattr(exc, "sqlstate", None) or ""
    message = _first_line(exc)
    if failover and sqlstate == "25006":
        return StoreUnavailable(f"PostgreSQL is failing over (a read-only server answered): {message}", "unavailable", store="postgres")
    # class 53: insufficient resources (disk full, out of memory); 25006: read-only transaction
    # (a standby, default_transaction_read_only); 42501: insufficient privilege
    if sqlstate[:2] == "53" or sqlstate in ("25006", "42501"):
        return StoreUnavailable(f"PostgreSQL refused the write: {message}", "read_only", store="postgres")
    # 25P03: the server ended a session idle in its transaction (a node that was stopped, FEED_HOLD_LIMIT);
    # class 40: a deadlock or serialization failure. Rolled back either way, and worth a retry.
    if sqlstate == "25P03" or sqlstate[:2] == "40":
        return StoreUnavailable(f"PostgreSQL rolled the transaction back: {message}", "unavailable", store="postgres")
    if isinstance(exc, (psycopg.OperationalError, psycopg_pool.PoolTimeout, psycopg.InterfaceError, _Unreached)):
        return StoreUnavailable(f"PostgreSQL is not reachable: {message}", "unavailable", store="postgres")
    return StoreUnavailable(f"PostgreSQL refused the write: {message}", "read_only", store="postgres")


classify = _classify  # what a failed transaction answers: the team's job queue's too (jobqueue.py)


class PostgresStore:
    """The Store seam (daemon/storage/store.py) over one PostgreSQL database (the module's rule)."""

    store_name = "postgres"

    def __init__(self, dsn: str, *, pool_size: int, timeout: float = 5.0) -> None:
        self.dsn, self.failover = _read_write(dsn)
        self.connect_options = _connect_options(self.dsn, timeout)
        self.pool_size = pool_size
        self.timeout = timeout
        self.limiter = trio.CapacityLimiter(pool_size)
        self.pool: Any = None
        self.commits = 0
        self.failures = 0
        self.recommitted = 0  # commits whose connection broke, committed again (the module's rule)
        self.in_doubt = 0  # commits whose connection broke and that could not be committed again in time
        self.conflicts = 0  # batches whose decisions another node's commit contradicted (StoreConflict)
        self.last_error: str | None = None
        self.attempts = 0  # connect_once's, this daemon's life
        # the models that have their HNSW index: read at open, grown by the commit that brings a
        # model's first vector (worker threads: under the lock)
        self.indexed: set[str] = set()
        self._index_lock = threading.Lock()
        self.next_attempt_in: float | None = None  # connect(): the back-off before the next attempt
        # a connection broke (the module's rule): commits connect on their own until the pool has one
        # ready (worker threads set and clear it; a stale read costs one commit the other path)
        self.reconnecting = False
        # the change feed (daemon/postgres/feed.py): this node's id in `mutations.node`, its commits as
        # the follower needs them (the re-apply rule), the follower once running (sys.stats), and
        # the feed's seq the tables were loaded at (rows_in_order, same snapshot)
        self.node_id = ""
        self.own = OwnCommits()
        self.feed: Any = None
        self.loaded_seq = 0
        # the batches waiting for the next transaction, and whether one is being committed (commit())
        self._queue: list[_Queued] = []
        self._committing = False
        self.feed_changes = 0  # chunks the follower applied (the local files' snapshot schedule: changes())

    # --- life -------------------------------------------------------------------------------------

    def open(self) -> None:
        """Connect, create or check the schema, and open the pool (in a thread: it blocks).
        Raises SchemaTooNew, or psycopg's errors when the server cannot be reached."""
        import psycopg
        from pgvector.psycopg import register_vector
        from psycopg_pool import ConnectionPool

        with psycopg.connect(self.dsn, autocommit=True, **self.connect_options) as conn:
            self._migrate(conn)

        def configure(conn: Any) -> None:
            register_vector(conn)
            conn.autocommit = False

        self.pool = ConnectionPool(
            self.dsn,
            min_size=1,
            max_size=self.pool_size,
            timeout=self.timeout,
            # psycopg_pool's reconnection backs off 1, 2, 4 s... up to this, then gives up (the next
            # getconn starts again): the default (5 min) would leave a promoted standby unused for
            # as long as the outage lasted (the module's rule)
            reconnect_timeout=self.timeout,
            kwargs=self.connect_options,
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
                if version < 3:
                    from .jobtable import fill_job_queue

                    fill_job_queue(conn)  # the jobs stored before job_queue was
                conn.execute("DELETE FROM schema_version")
                conn.execute("INSERT INTO schema_version VALUES (%s)", (SCHEMA_VERSION,))
            indexed = {model for (model,) in conn.execute("SELECT model FROM vector_indexes").fetchall()}
        with self._index_lock:
            self.indexed = indexed

    # --- the seam -----------------------------------------------------------------------------------

    async def commit(self, mutations: Sequence[Any], check: Any = None) -> None:
        """The seam's commit; `check`: the batch's decisions, checked in its transaction against what
        the other nodes committed (daemon/memory/concurrency.py; StoreConflict when they changed it). The batches committed meanwhile (by other tiers) wait and go together
        in the next transaction, whose commit is the first of them to have waited: the feed's lock
        lets one transaction of the database commit at a time, so one transaction (one flush) for
        every batch waiting gives back the group commit the lock takes away. Cancellable before it
        is queued, not after (nor was the worker thread a commit waits on once started)."""
        if not mutations:
            return
        await trio.lowlevel.checkpoint_if_cancelled()  # a caller cancelled before it commits: nothing queued
        after = self.own.applied  # the feed the node had applied when it decided (a check's default base)
        queued = _Queued(list(mutations), self.own.begin(), check, after)
        self._queue.append(queued)
        with trio.CancelScope(shield=True):
            if self._committing:
                await queued.wake.wait()  # its group committed, or it leads the next one
            else:
                self._committing = queued.lead = True
            if queued.lead:
                group, self._queue = self._queue, []
                try:
                    await self._commit_group(group)
                finally:
                    for other in group:  # an error that is no StoreUnavailable (a bug): nobody waits forever
                        if not other.wake.is_set():
                            self._ended(other, StoreUnavailable("the commit failed", "unavailable", store="postgres"))
                    if self._queue:  # what came meanwhile: the first of it leads the next transaction
                        self._queue[0].lead = True
                        self._queue[0].wake.set()
                    else:
                        self._committing = False
        if queued.error is not None:
            raise queued.error

    async def _commit_group(self, group: list[_Queued]) -> None:
        """One transaction for the group's batches, in order; when the server refuses it and it
        holds several, each batch alone (one refused batch fails only its own writes)."""
        mutations = [mutation for queued in group for mutation in queued.mutations]
        txns = [queued.txn for queued in group for _mutation in queued.mutations]
        checks = [queued.checked() for queued in group if queued.check is not None]
        try:
            broken = await trio.to_thread.run_sync(self._commit_sync, mutations, txns, checks, limiter=self.limiter)
        except StoreUnavailable as exc:
            if len(group) > 1 and (exc.code == "read_only" or isinstance(exc, StoreConflict)):
                for queued in group:
                    await self._commit_group([queued])
                return
            for queued in group:
                self._ended(queued, exc)
            return
        self.recommitted += bool(broken)
        for queued in group:
            self._ended(queued, None)

    def _ended(self, queued: _Queued, error: StoreUnavailable | None) -> None:
        self.own.end(queued.txn, kept=error is None, mutations=queued.mutations)
        if error is None:
            self.commits += 1
        elif isinstance(error, StoreConflict):  # decided again by its actor: no failure
            self.conflicts += 1
            queued.error = error
        else:
            self.failures += 1
            self.in_doubt += bool(error.data.get("in_doubt"))
            self.last_error = str(error)
            queued.error = error
        queued.wake.set()

    def _commit_sync(self, mutations: list[Any], txn: int | list[int] = 0, checks: Sequence[Check] = ()) -> int:
        """One transaction of `mutations` (blocking; the module's rule); `txn`: the node's commit id
        of each (or of all). Returns how many connections broke under it (0 mostly)."""
        import psycopg
        import psycopg_pool

        if self.pool is None:
            raise StoreUnavailable("PostgreSQL is not connected", "unavailable", store="postgres")
        deadline = time.monotonic() + self.timeout
        broken = 0  # attempts whose connection broke with the transaction sent: it may have committed
        pause = 0.05
        while True:
            try:
                self._transaction(mutations, txn, checks)
                break
            except StoreConflict:
                raise
            except Exception as exc:
                # nothing was sent: no connection from the pool (or the pool closed: the daemon stopping), none of its own
                unreached = isinstance(exc, (psycopg_pool.PoolTimeout, psycopg_pool.PoolClosed, _Unreached))
                if not unreached and isinstance(exc, psycopg.OperationalError):
                    if not broken:
                        log.info("PostgreSQL: a connection broke during a commit (%s); committing it again", exc)
                        self.reconnecting = True
                        self._check_pool()
                    broken += 1
                elif not broken:
                    raise _classify(exc, self.failover) from exc
                elif not unreached:  # refused now, but an earlier try may have committed
                    raise _in_doubt(exc) from exc
                if time.monotonic() >= deadline:
                    raise _in_doubt(exc) from exc
                if unreached:  # the server away (a failover): again after a short pause, until the deadline
                    time.sleep(pause)
                    pause = min(pause * 2, 0.5)
        self._index_new_models(mutations)
        return broken

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

    def _transaction(self, mutations: list[Any], txn: int | list[int] = 0, checks: Sequence[Check] = ()) -> None:
        """One batch's transaction (the module's rule), sent at once in psycopg's pipeline mode
        (BEGIN, every statement in order, COMMIT: one round trip and the commit's flush, where a
        statement at a time would wait on the server for each): the feed's lock first (FEED_LOCK:
        held to COMMIT, so seq order is commit order), then each mutation takes its seq in the
        feed (nextval) and its row operations take it from currval, in the same session; the NOTIFY
        wakes the other nodes' followers at COMMIT. A batch's `checks` first (check_decisions)."""
        import psycopg

        with self._connection() as conn:
            try:
                with conn.pipeline(), conn.transaction(), conn.cursor() as cur:
                    if checks:
                        check_decisions(cur, checks, self.node_id)
                    write_mutations(cur, mutations, self.node_id, txn)
            except psycopg.errors.ReadOnlySqlTransaction:
                if self.failover:  # a standby's session (the module's rule): the pool replaces it
                    conn.close()
                raise

    def _check_pool(self) -> None:
        """The pool's idle connections went to the server a broken one went to: the broken ones
        replaced now, not handed to the next commits (a pool closed meanwhile has none)."""
        import psycopg_pool

        pool = self.pool
        if pool is None:
            return
        try:
            pool.check()
        except psycopg_pool.PoolClosed:
            return

    def _connection(self) -> AbstractContextManager[Any]:
        """The connection of one commit's transaction: the pool's, but while `reconnecting` and the
        pool has none ready, one of its own, closed after (the module's rule)."""
        pool = self.pool
        if pool is None:  # closed meanwhile (the daemon stopping)
            raise _Unreached("PostgreSQL is not connected")
        pooled: AbstractContextManager[Any] = pool.connection()  # (not entered: borrows nothing yet)
        if not self.reconnecting:
            return pooled
        if pool.get_stats().get("pool_available", 0):
            self.reconnecting = False
            return pooled
        return self._own_connection()

    @contextmanager
    def _own_connection(self) -> Iterator[Any]:
        import psycopg
        from pgvector.psycopg import register_vector

        try:
            conn = psycopg.connect(self.dsn, **self.connect_options)
            register_vector(conn)
        except psycopg.OperationalError as exc:
            raise _Unreached(_first_line(exc)) from exc
        with conn:
            yield conn

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
                # the feed's seq these rows are at, read in their snapshot: the follower starts there (feed.py)
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                self.loaded_seq = int(conn.execute(HEAD).fetchone()[0])
                cur.itersize = 2000
                cur.execute(query)
                for _seq, _pos, body, vec in cur:
                    yield bytes(body), _vector_bytes(vec)

    def head_seq(self, conn: Any) -> int:
        """The feed's head as `conn`'s transaction sees it (feed.HEAD). Blocking."""
        return int(conn.execute(HEAD).fetchone()[0])

    def is_empty(self) -> bool:
        """Whether no mutation was ever committed here (a first start imports EurekaClaw's files). Blocking."""
        with self.pool.connection() as conn:
            return bool(conn.execute(f"SELECT ({HEAD}) = 0").fetchone()[0])

    def counts(self) -> dict[str, int]:
        """Rows per table (verify, migrate, sys.stats)."""
        with self.pool.connection() as conn:
            return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("mutations", *TABLES)}

    def identify(self, node_id: str) -> None:
        """The node's id its commits write in `mutations.node` (the daemon's, before any commit)."""
        self.node_id = node_id

    def followed_by(self, follower: Any) -> None:
        """The node's follower of the feed (daemon/postgres/feed.py), shown in statistics()."""
        self.feed = follower

    def changes(self) -> int:
        """How many times the tiers changed through this store: its commits and the feed's chunks
        (the local files' snapshot schedule compares it, daemon/snapshots.py)."""
        return self.commits + self.feed_changes

    def statistics(self) -> dict[str, Any]:
        return {
            "store": "postgres",
            "commits": self.commits,
            "failures": self.failures,
            "recommitted": self.recommitted,
            "in_doubt": self.in_doubt,
            "conflicts": self.conflicts,
            "last_error": self.last_error,
            "pool_size": self.pool_size,
            "connected": self.pool is not None,
            "attempts": self.attempts,
            "next_attempt_in": self.next_attempt_in,
            "feed": self.feed.statistics() if self.feed is not None else None,
        }


Check = tuple[Any, int]  # a batch's decisions (daemon/memory/concurrency.py) and the seq they were made at


class _Queued:
    """One batch waiting in PostgresStore.commit: woken when committed (or failed), or to lead the next transaction."""

    __slots__ = ("after", "check", "error", "lead", "mutations", "txn", "wake")

    def __init__(self, mutations: list[Any], txn: int, check: Any = None, after: int = 0) -> None:
        self.mutations = mutations
        self.txn = txn
        self.check = check
        self.after = after
        self.wake = trio.Event()
        self.lead = False
        self.error: StoreUnavailable | None = None

    def checked(self) -> Check:
        """The check and the seq it is made at: the check's own (the node caught up to it itself)
        when later than what the node's follower had applied when the batch was queued."""
        return self.check, max(self.after, self.check.after or 0)


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


# `at`: when the row was written, under the feed's lock (the followers' visibility lag is measured from it)
_INSERT_MUTATION = (
    "INSERT INTO mutations (seq, at, node, txn, body) VALUES (nextval('mutation_seq'), clock_timestamp(), %s, %s, %s)"
)
_IDLE_LIMIT = "set_config('idle_in_transaction_session_timeout', %s, true)"
FEED_LOCK_SQL = f"SELECT {_IDLE_LIMIT}, pg_advisory_xact_lock({FEED_LOCK})"
# how long a transaction holding the feed's lock (or a job's row lock) may sit idle before the server
# ends its session: a node stopped mid-transaction (SIGSTOP, a paused VM, a hung thread) whose
# connection stays up would otherwise hold every node's commits and claims (or that job) until it wakes. Our transactions send their
# statements back to back, so a legitimate one is never idle for long.
FEED_HOLD_LIMIT = "10s"


def take_feed_lock(cur: Any, lock: bool = True) -> None:
    """The feed's lock (write_mutations' rule), with the idle limit of the transaction holding it;
    `lock` False: the limit alone (a transaction that holds row locks other nodes may wait for)."""
    cur.execute(FEED_LOCK_SQL if lock else f"SELECT {_IDLE_LIMIT}", (FEED_HOLD_LIMIT,))
_NOTIFY = f"NOTIFY {FEED_CHANNEL}"
_SEQ = "currval('mutation_seq')"  # the seq of the mutation inserted just before, in this session


def write_mutations(cur: Any, mutations: Sequence[Any], node: str = "", txn: int | list[int] = 0) -> None:
    """The statements of the mutations, in order, on a cursor in a transaction (its caller's): the
    feed's lock first (FEED_LOCK, held to COMMIT: seq order is commit order; taken again, it is
    already held), each mutation into the feed (with the node and its commit id, or one per
    mutation), then its row operations (rows.py); the NOTIFY wakes the other nodes at COMMIT."""
    from ..storage.store import mutation_encoder

    take_feed_lock(cur)
    txns = txn if isinstance(txn, list) else [txn] * len(mutations)
    for mutation, commit_id in zip(mutations, txns):
        cur.execute(_INSERT_MUTATION, (node, commit_id, mutation_encoder.encode(mutation)))
        for pos, op in enumerate(row_ops(mutation)):
            sql, args = _statement(op, pos)
            cur.execute(sql, args)
    cur.execute(_NOTIFY)


_SINCE = "SELECT seq, node, body FROM mutations WHERE seq > %s ORDER BY seq"


def check_decisions(cur: Any, checks: Sequence[Check], node: str) -> None:
    """Batches' decisions against the committed rows, in their transaction: under the feed's lock
    (held to COMMIT: nothing commits between this read and this transaction's COMMIT), the feed
    after the earliest seq a check was made at; StoreConflict (the transaction rolls back) when a
    check finds another node changed what its batch decided on (daemon/memory/concurrency.py)."""
    take_feed_lock(cur)
    cur.execute(_SINCE, (min(after for _check, after in checks),))
    rows = [(int(seq), str(writer), bytes(body)) for seq, writer, body in cur.fetchall()]
    if any(check.conflicting(rows, node, after) for check, after in checks):
        raise StoreConflict(rows, rows[-1][0])


_JOB_STATE = (
    "INSERT INTO job_queue (id, key, kind, state, attempts, created) VALUES (%s, %s, %s, %s, %s, currval('mutation_seq'))"
    " ON CONFLICT (id) DO UPDATE SET key = EXCLUDED.key, kind = EXCLUDED.kind, state = EXCLUDED.state,"
    " attempts = EXCLUDED.attempts, created = CASE WHEN %s THEN EXCLUDED.created ELSE job_queue.created END,"
    " lease_until = CASE WHEN EXCLUDED.state = 'running' THEN job_queue.lease_until END, not_before = NULL"
)


def _statement(op: RowOp, pos: int) -> tuple[str, tuple[Any, ...]]:
    if op.table == "job_queue":  # not a table of bodies: the team's job queue (rows.py's job_state)
        if op.op == "job_state":
            return _JOB_STATE, (*op.key, *op.values)
        return "DELETE FROM job_queue WHERE id = %s", op.key
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


def _connect_options(dsn: str, timeout: float) -> dict[str, Any]:
    """libpq options of every connection, where the DSN does not set them: connect_timeout (per
    host: libpq tries them in turn), and over TCP, a vanished server (a primary's machine lost, no
    RST) found within ~10 s, where the kernel's defaults would hold a commit for many minutes:
    keepalives on an idle or waiting connection, tcp_user_timeout on unacknowledged data (a slow
    COMMIT is not cut: the server's kernel acknowledges at once). Unix sockets ignore the TCP ones."""
    import psycopg
    from psycopg import pq
    from psycopg.conninfo import conninfo_to_dict

    wanted: dict[str, Any] = {
        "connect_timeout": max(1, int(timeout)), "keepalives": 1, "keepalives_idle": max(1, int(timeout)),
        "keepalives_interval": 1, "keepalives_count": 3,
    }
    if pq.version() >= 120000:  # libpq 12 brought tcp_user_timeout
        wanted["tcp_user_timeout"] = int(timeout * 2000)
    try:
        given = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:  # a DSN psycopg cannot parse: the connect says why
        given = {}
    return {k: v for k, v in wanted.items() if k not in given}


def _read_write(dsn: str) -> tuple[str, bool]:
    """The DSN the pool connects with, and whether it names several hosts (failover, the module's
    rule): then a connection must reach the writable one, so `target_session_attrs=read-write` is
    added where the DSN does not say (libpq's default, `any`, would take a standby listed first)."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    try:
        parts = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:  # a DSN psycopg cannot parse: the connect says why
        return dsn, False
    hosts = str(parts.get("host") or parts.get("hostaddr") or "").split(",")
    if len(hosts) < 2:
        return dsn, False
    if "target_session_attrs" not in parts:
        log.info("PostgreSQL: the DSN names %d hosts: connecting with target_session_attrs=read-write", len(hosts))
        dsn = make_conninfo(dsn, target_session_attrs="read-write")
    return dsn, True


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

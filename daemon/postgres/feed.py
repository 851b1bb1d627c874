"""The change feed: several daemons (nodes) on one PostgreSQL, each applying what the others commit.

Rules kept here:
- Order: every commit takes the advisory lock FEED_LOCK first (daemon/postgres/store.py), so the
  feed's seqs are taken in commit order: once a seq is visible, no lower seq can commit later
  (a rolled-back transaction leaves a gap that stays one). A reader of `seq > last ORDER BY seq`
  misses nothing, and every node applies every mutation in the database's one order.
- The follower (one per node, `Follower`, on the event loop; its reads in a worker thread on a
  dedicated autocommit connection, never the pool's) reads by seq, woken by NOTIFY but also at
  every `poll` seconds, so a dropped connection, a restart or a burst loses nothing; it reconnects
  with back-off. Its one hand-off: `_apply` gives each tier actor its part of a chunk through
  `TierActor.apply_feed` (the actor applies it through the state's own `apply`, between batches,
  committing nothing, keeping no undo). A CommitJob's parts go to their tiers; the jobs tier's
  own mutations are not applied (each node runs its own queue until the team queue, issue 26 §3).
- Own mutations (the re-apply rule): a node applied its own writes before they committed, so a
  lower seq of another node applied by the follower after that would leave the older value. Each
  own commit records (OwnCommits) the seq through which the follower had applied everything when
  the commit began (`base`) and whether the node kept it. When the follower reaches the commit's
  rows it skips them only if the node kept them and it applied nothing through the feed since
  `base`; otherwise it applies them again at their place in the order (mutations carry whole
  records: re-applying is idempotent). Rows of a commit the node did not keep (its outcome was
  unknown, so it answered `unavailable` and rolled back) or does not know (a previous life) are
  applied like another node's. A row applied at its place may be older than what the node wrote
  since (the chunk was read before the node's next commit ended, or that commit's rows are past
  the chunk): so each tier's hand-off then applies again, in commit order, its part of every
  commit the node kept whose rows the follower has not passed (`OwnCommits.unreached`, asked when
  the actor runs the hand-off, between its batches, so every commit of that tier has ended by
  then). After a chunk through seq S, each tier holds the feed through S overlaid with the node's
  own later commits: a node always reads its own acknowledged writes, and a read-modify-write on
  it (memory.update, memory.delete) never builds on a row its own newer write replaced.
- The known limit of that rule: a memory's version history is not a pure function of its puts
  (a new version keeps, in the previous version's entry, the text the memory had when it was
  applied). When two nodes make new versions of one memory at once, the node whose own version
  was applied before the other's older one keeps, in that entry, the text it saw: the memory and
  its versions converge, that one entry's text may differ from the tables' until the node's
  restart. Exact order for it would keep each own commit's undo until the follower passes it.
- Start-up loads the tables and reads the feed's head in one REPEATABLE READ snapshot
  (PostgresStore.rows_in_order: `loaded_seq`); the follower starts there.
- Retention: the nodes heartbeat their applied seq into `nodes`; one node at a time (an advisory
  lock) trims `mutations` up to the least applied seq of the nodes seen within the retention, and
  records the point in `feed_trim`; only mutations older than the retention go (a node loading
  the tables meanwhile starts from a seq no older). A follower that finds itself behind it stops the daemon with
  the reason (`FeedBehind`): a restart loads the tables afresh (systemd's Restart=on-failure).
"""

from __future__ import annotations

import collections
import functools
import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec
import trio

from ..primitives import Histogram

log = logging.getLogger("eurekamem.feed")

FEED_SCHEMA = [
    "ALTER TABLE mutations ADD COLUMN IF NOT EXISTS node text NOT NULL DEFAULT ''",
    "ALTER TABLE mutations ADD COLUMN IF NOT EXISTS txn bigint NOT NULL DEFAULT 0",
    "CREATE TABLE IF NOT EXISTS nodes (id text PRIMARY KEY, name text NOT NULL, applied_seq bigint NOT NULL DEFAULT 0,"
    " seen_at timestamptz NOT NULL DEFAULT now())",
    "CREATE TABLE IF NOT EXISTS feed_trim (one boolean PRIMARY KEY DEFAULT true CHECK (one), seq bigint NOT NULL)",
]

# the feed's head: its last seq, or the point trimmed to when nothing is left after it
HEAD = (
    "SELECT greatest((SELECT coalesce(max(seq), 0) FROM mutations), (SELECT coalesce(max(seq), 0) FROM feed_trim))"
)

FEED_LOCK = 727002  # the advisory lock every commit takes first (PostgresStore._transaction): seq order is commit order
FEED_CHANNEL = "eurekamem_feed"  # NOTIFY'd by every commit (delivered at COMMIT)
TRIM_LOCK = 727003  # one node at a time trims

# a chunk of the feed after `seq`, with the trimmed point, in one statement (one snapshot)
_READ = (
    "SELECT t.trimmed, m.seq, m.node, m.txn, m.body, extract(epoch FROM m.at)::float8"
    " FROM (SELECT coalesce(max(seq), 0) AS trimmed FROM feed_trim) t"
    " LEFT JOIN LATERAL (SELECT seq, node, txn, body, at FROM mutations WHERE seq > %s ORDER BY seq LIMIT %s) m ON true"
    " ORDER BY m.seq"
)

Row = tuple[int, str, int, bytes, float]  # seq, node, txn, body, when it was written (seconds since 1970)


class FeedBehind(Exception):
    """The feed was trimmed past what this node applied: its tiers must be loaded afresh."""


class OwnCommits:
    """This node's commits as the follower needs them (the module's re-apply rule). PostgresStore.commit
    calls begin/end, the follower sets `applied` and calls `wanted`, on the event loop; `unreached`
    is read by the tier actors' hand-off, in their worker threads too (under the lock)."""

    KEPT_AT_MOST = 10_000  # ends remembered (a failed commit's rows may never appear)

    def __init__(self, parts: Callable[[Any], list[tuple[str, Any]]] | None = None) -> None:
        self.applied = 0  # the follower's: every seq up to it applied to every tier
        self.fed = 0  # the follower's: the last seq it applied through the feed (not skipped)
        self.parts = parts or own_parts  # (tier, mutation) of what a tier applies of one of its mutations
        # txn ids: random high bits per life, so a previous life's rows are not taken for this one's
        self._next = (secrets.randbits(30) + 1) << 32
        self._open: dict[int, tuple[int, trio.Event]] = {}
        self._done: dict[int, tuple[int, bool]] = {}  # txn -> (base, kept)
        self._current = (0, False)  # the txn being read and whether its rows are applied
        # the kept commits' mutations whose rows the follower has not passed yet, in commit order
        self._unreached: dict[int, collections.deque[Any]] = {}
        self._lock = threading.Lock()  # over _unreached: `unreached` is read from worker threads

    def begin(self) -> int:
        self._next += 1
        self._open[self._next] = (self.applied, trio.Event())
        return self._next

    def end(self, txn: int, kept: bool, mutations: Sequence[Any] = ()) -> None:
        """The commit `txn` ended: committed (kept, its `mutations` in order), or rolled back here."""
        base, done = self._open.pop(txn)
        self._done[txn] = (base, kept)
        if len(self._done) > self.KEPT_AT_MOST:
            del self._done[next(iter(self._done))]
        if kept and mutations:
            with self._lock:
                self._unreached[txn] = collections.deque(mutations)
                if len(self._unreached) > self.KEPT_AT_MOST:
                    del self._unreached[next(iter(self._unreached))]
        done.set()

    async def wanted(self, seq: int, own: bool, txn: int) -> bool:
        """Whether the follower applies the row `seq` (own: written by this node as `txn`); rows
        are asked about in seq order. Waits for an own commit still in flight to end."""
        if own and txn == self._current[0]:
            apply = self._current[1]
        elif own and txn:
            if txn in self._open:
                await self._open[txn][1].wait()
            base, kept = self._done.pop(txn, (0, False))
            apply = not kept or self.fed > base
            self._current = (txn, apply)
        else:
            apply = True
        if own and txn:
            self._passed(txn)
        if apply:
            self.fed = seq
        return apply

    def _passed(self, txn: int) -> None:
        """The follower passed one more row of the commit `txn` (its rows are in its mutations' order)."""
        with self._lock:
            rows = self._unreached.get(txn)
            if rows is not None:
                rows.popleft()
                if not rows:
                    del self._unreached[txn]

    def unreached(self, tier: str) -> list[Any]:
        """What `tier` applies again after a chunk of the feed (the re-apply rule): its part of every
        commit the node kept whose rows the follower has not passed, in commit order. Any thread."""
        with self._lock:
            mutations = [mutation for rows in self._unreached.values() for mutation in rows]
        return [item for mutation in mutations for part, item in self.parts(mutation) if part == tier]


def feed_parts(mutation: Any, own: bool = False) -> list[tuple[str, Any]]:
    """(tier, mutation) for what a node applies of one committed mutation (the module's rule);
    `own`: one of this node's commits, applied again as the node applied it."""
    from ..jobs.state import CommitJob
    from ..recovery import MUTATION_TIER

    items = list(mutation.parts) if isinstance(mutation, CommitJob) else [mutation]
    out = []
    for item in items:
        tier = MUTATION_TIER[type(item)]
        if tier == "jobs":
            continue
        if not own and getattr(item, "from_file", False):  # read from a file on the writer's node: here, the file is owed
            item = msgspec.structs.replace(item, from_file=False)
        out.append((tier, item))
    return out


def own_parts(mutation: Any) -> list[tuple[str, Any]]:
    return feed_parts(mutation, own=True)


class Follower:
    """A node's follower of the feed (the module's rule)."""

    def __init__(
        self,
        store: Any,
        actors: Mapping[str, Any],
        *,
        node_id: str,
        name: str,
        start: int,
        retention: float,
        poll: float = 1.0,
        chunk: int = 1000,
    ) -> None:
        self.store = store
        self.actors = actors
        self.node_id = node_id
        self.name = name
        self.own: OwnCommits = store.own
        self.own.applied = self.own.fed = start
        self.applied = start  # every seq up to it applied (or skipped as the node's own)
        self.retention = retention
        self.heartbeat = min(2.0, retention / 4)
        self.poll = poll
        self.chunk = chunk
        self.head = start  # the feed's last seq as last seen
        self.lag_seconds = 0.0  # how old the oldest mutation not applied was at the last heartbeat
        self.others: list[dict[str, Any]] = []  # the other nodes seen within the retention
        self.mutations = 0  # applied through the feed
        self.skipped = 0  # own mutations the node already had
        self.reapplied = 0  # own mutations applied again (the re-apply rule)
        self.reconnects = 0
        self.visibility = Histogram()  # another node's write: from its row's writing to applied here (as the clocks agree)
        self.trimmed = 0  # mutations this node trimmed
        self.last_error: str | None = None
        self._conn: Any = None  # the follower's connection: its worker thread's only
        self._stopping = False
        self._next_trim = 0.0  # time.monotonic() of the next attempt to trim

    # --- statistics -----------------------------------------------------------------------------------

    def statistics(self) -> dict[str, Any]:
        """sys.stats → store.feed."""
        return {
            "node": self.node_id,
            "name": self.name,
            "applied_seq": self.applied,
            "head_seq": max(self.head, self.applied),
            "lag_seqs": max(0, self.head - self.applied),
            "lag_seconds": round(self.lag_seconds, 3),
            "visibility_ms": {
                q: round(self.visibility.percentile(f) / 1000, 3) for q, f in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))
            },
            "mutations": self.mutations,
            "skipped": self.skipped,
            "reapplied": self.reapplied,
            "reconnects": self.reconnects,
            "trimmed": self.trimmed,
            "last_error": self.last_error,
            "nodes": self.others,
        }

    # --- life ---------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Follow the feed and heartbeat until cancelled; raises FeedBehind (the daemon stops)."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._beat)
                await self._follow()
        finally:
            self._stopping = True

    async def _follow(self) -> None:
        delay = 0.1
        while True:
            try:
                trimmed, rows = await trio.to_thread.run_sync(self._fetch, self.applied, abandon_on_cancel=True)
            except Exception as exc:
                self._fail(exc)
                self.reconnects += 1
                log.warning("feed: reading the feed failed (%s); again in %.1f s", self.last_error, delay)
                await trio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            delay = 0.1
            if trimmed > self.applied:
                raise FeedBehind(
                    f"the feed was trimmed to seq {trimmed} while this node had applied up to {self.applied} "
                    "(it was not seen within feed_retention): restart it to load the tables afresh"
                )
            if rows:
                await self._apply(rows)

    def _fail(self, exc: Exception) -> None:
        self.last_error = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception as close_error:  # the connection is dead already: nothing else to do
                log.debug("feed: closing a broken connection: %s", close_error)

    # --- the worker thread's side ---------------------------------------------------------------------

    def _connect(self) -> Any:
        import psycopg

        conn = psycopg.connect(
            self.store.dsn,
            autocommit=True,
            connect_timeout=max(1, int(self.store.timeout)),
            application_name=f"eurekamem-feed-{self.node_id}",  # what an operator (or a test) finds it by
        )
        conn.execute(f"LISTEN {FEED_CHANNEL}")
        return conn

    def _fetch(self, after: int) -> tuple[int, list[Row]]:
        """The next chunk after `after` (and the trimmed point); when there is none, waits for a
        NOTIFY, at most `poll` seconds, and reads again. Blocking (the worker thread)."""
        if self._conn is None:
            self._conn = self._connect()
        conn = self._conn
        for _ in conn.notifies(timeout=0.0):  # those queued: the read below covers them
            pass
        trimmed, rows = self._read(conn, after)
        if not rows:
            for _ in conn.notifies(timeout=self.poll, stop_after=1):
                pass
            trimmed, rows = self._read(conn, after)
        if self._stopping:  # an abandoned call (shutdown): the connection is closed here, its last user
            self._fail(RuntimeError("stopping"))
        return trimmed, rows

    def _read(self, conn: Any, after: int) -> tuple[int, list[Row]]:
        found = conn.execute(_READ, (after, self.chunk)).fetchall()
        rows = [(seq, node, txn, bytes(body), at) for _t, seq, node, txn, body, at in found if seq is not None]
        return int(found[0][0]) if found else 0, rows

    # --- the hand-off ---------------------------------------------------------------------------------

    async def _apply(self, rows: list[Row]) -> None:
        """One chunk, in seq order: what each tier applies of it, handed to its actor (the module's rule)."""
        from ..recovery import decode_mutation

        per_tier: dict[str, list[Any]] = {}
        written: list[float] = []  # when each row applied was written
        for seq, node, txn, body, at in rows:
            own = node == self.node_id
            if not await self.own.wanted(seq, own, txn):
                self.skipped += 1
                continue
            if own:
                self.reapplied += 1
            else:
                written.append(at)
            for tier, mutation in feed_parts(decode_mutation(body)):
                per_tier.setdefault(tier, []).append(mutation)
            self.mutations += 1
        if per_tier:
            async with trio.open_nursery() as nursery:
                for tier, mutations in per_tier.items():
                    again = functools.partial(self.own.unreached, tier)
                    nursery.start_soon(self.actors[tier].apply_feed, mutations, again)
        now = time.time()  # the visibility lag: from the commit's writing of the row to its use here
        for at in written:
            self.visibility.add(max(0.0, now - at) * 1e6)
        self.applied = self.own.applied = rows[-1][0]
        self.head = max(self.head, self.applied)
        self.store.feed_changes += 1  # the local files' snapshot schedule sees the change (Snapshots.written)

    # --- heartbeat and retention ----------------------------------------------------------------------

    async def _beat(self) -> None:
        while True:
            try:
                await trio.to_thread.run_sync(self._beat_sync, self.applied, limiter=self.store.limiter)
            except Exception as exc:  # the database is away: the follower says so and reconnects
                log.info("feed: heartbeat failed: %s", exc)
            await trio.sleep(self.heartbeat)

    def _beat_sync(self, applied: int) -> None:
        pool = self.store.pool
        if pool is None:
            return
        with pool.connection() as conn, conn.transaction():
            conn.execute(
                "INSERT INTO nodes (id, name, applied_seq, seen_at) VALUES (%s, %s, %s, now()) ON CONFLICT (id)"
                " DO UPDATE SET name = EXCLUDED.name, applied_seq = EXCLUDED.applied_seq, seen_at = now()",
                (self.node_id, self.name, applied),
            )
            window = {"secs": self.retention}
            others = conn.execute(
                "SELECT id, name, applied_seq, extract(epoch FROM now() - seen_at)::float8 FROM nodes"
                " WHERE id <> %(me)s AND seen_at > now() - make_interval(secs => %(secs)s) ORDER BY name, id",
                {"me": self.node_id, **window},
            ).fetchall()
            head = int(conn.execute(HEAD).fetchone()[0])
            oldest = conn.execute(
                "SELECT extract(epoch FROM now() - at)::float8 FROM mutations WHERE seq > %s ORDER BY seq LIMIT 1", (applied,)
            ).fetchone()
            trim_now = time.monotonic() >= self._next_trim
            trimmed = self._trim(conn, window) if trim_now else 0
        if trim_now:
            self._next_trim = time.monotonic() + min(30.0, self.retention)
        self.others = [
            {"node": node, "name": name, "applied_seq": seq, "seen_seconds_ago": round(ago, 3)} for node, name, seq, ago in others
        ]
        self.head = max(self.head, head)
        self.lag_seconds = float(oldest[0]) if oldest else 0.0
        self.trimmed += trimmed

    def _trim(self, conn: Any, window: dict[str, float]) -> int:
        """The feed trimmed up to what every node seen within the retention applied, by one node at a
        time (the module's rule); how many mutations went."""
        if not conn.execute(f"SELECT pg_try_advisory_xact_lock({TRIM_LOCK})").fetchone()[0]:
            return 0
        (upto,) = conn.execute(
            "SELECT min(applied_seq) FROM nodes WHERE seen_at > now() - make_interval(secs => %(secs)s)", window
        ).fetchone()
        if not upto:
            return 0
        # only what is older than the retention too (a prefix of the feed: up to the last such seq): a
        # node that loaded the tables meanwhile starts from a seq no older, and appears in `nodes` at its first beat
        (upto,) = conn.execute(
            "SELECT max(seq) FROM mutations WHERE seq <= %(upto)s AND at < now() - make_interval(secs => %(secs)s)",
            {"upto": upto, **window},
        ).fetchone()
        if not upto:
            return 0
        gone = conn.execute("DELETE FROM mutations WHERE seq <= %s", (upto,)).rowcount
        conn.execute(
            "INSERT INTO feed_trim VALUES (true, %s) ON CONFLICT (one) DO UPDATE SET seq = greatest(feed_trim.seq, EXCLUDED.seq)",
            (upto,),
        )
        log.info("feed: trimmed %d mutations, up to seq %d", gone, upto)
        return int(gone)


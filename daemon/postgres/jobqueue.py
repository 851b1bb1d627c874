"""The team's job queue: which of the daemons sharing one PostgreSQL runs which job, decided in the database.

Rules kept here:
- `job_queue` holds one row per job: its key, kind, state and attempts, which rows.py sets with
  every job mutation in the same transaction (so the row is never behind the job's record), and
  what only this module writes: who holds the job (`node`, a `token` per claim, `lease_until`),
  its lane (set at accept, or at its first claim for a job stored before), a back-off's `not_before`.
- A claim is one transaction: `SELECT ... FOR UPDATE SKIP LOCKED` over the claimable rows (queued,
  or running under a lease that expired; not backing off; of a kind this node runs), oldest first;
  each job's record and input are read from the `jobs` table (whichever node accepted it) and
  started by JobsState's own rules (the attempt cap, an interruption counted) on a JobsState of
  its own, written as a PutJob, and leased to this node under a new token.
- Lanes: a job with a lane (a conversation group) is claimed only under the lane's advisory lock
  (transaction-scoped) and while no job of the lane runs under a live lease, so two jobs of one
  lane never run at once on any of the nodes while their leases are renewed. The claim's SELECT
  already passes over the jobs whose lane runs (so it locks no more rows than it may start: other
  nodes' claims skip only what this one takes); the check under the lock decides.
- Every later write of an attempt (its result with its completion: the CommitJob; a requeue, a
  failure) commits only if the job's row still names this node and this token, checked under
  `SELECT ... FOR UPDATE` in the same transaction; else nothing is written (StaleAttempt). A node
  whose lease was taken over, or whose job was cancelled or completed by a delivered result,
  commits nothing: a job ends exactly once. A delivered result (session.learned) commits while
  the job is neither done nor cancelled, under the same row lock.
- What reads the queue to decide (an accept by key and its debounce, jobs.cancel, jobs.retry)
  decides on the committed rows, under the key's advisory lock or the job's row lock, with
  JobsState's own functions, so every node answers the same.
- Every call is one transaction on a connection of the store's pool, in a worker thread, within
  the store's CapacityLimiter; a failure is what the store's commits answer (StoreUnavailable).
"""

from __future__ import annotations

import functools
import secrets
import zlib
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, TypeVar

import msgspec
import trio

from ..jobs.state import AcceptJob, JobInput, JobRecord, JobsState, PurgeJob, PutJob, StaleAttempt
from ..storage.store import StoreUnavailable
from .jobtable import decoder
from .jobtable import key_bytes as _b
from .store import classify, take_feed_lock, write_mutations

KEY_LOCK = 727002  # advisory locks' first key: an accept by key (the second: the key's hash)
LANE_LOCK = 727003  # ... a lane's claim
PURGE_LOCK = 727004  # ... the purge of old finished jobs (one node at a time)

T = TypeVar("T")
Loaded = tuple[JobRecord, JobInput | None]


class Claim(NamedTuple):
    """What a claim did (TeamQueue.claim)."""

    claimed: list[tuple[JobRecord, JobInput, str]]  # (record, input, this node's token) of each job started
    ended: list[Loaded]  # jobs it failed instead (the attempt cap, no input)
    lane_waits: dict[str, str]  # job id -> the job of its lane it waits for


def _hash(text: str) -> int:
    """A signed 32-bit key for an advisory lock (two texts of one hash only wait for each other)."""
    value = zlib.crc32(_b(text))
    return value - (1 << 32) if value >= 1 << 31 else value


def _load(conn: Any, ids: list[bytes]) -> dict[bytes, Loaded]:
    """The jobs' records (their last put, else their accept's) and inputs, from the `jobs` table."""
    return _assemble(ids, conn.execute("SELECT id, slot, body FROM jobs WHERE id = ANY(%s)", (ids,)).fetchall())


def _assemble(ids: list[bytes], rows: Iterable[tuple[Any, Any, Any]]) -> dict[bytes, Loaded]:
    """_load's jobs from their rows of the `jobs` table (id, slot, body)."""
    accepted: dict[bytes, AcceptJob] = {}
    last: dict[bytes, JobRecord] = {}
    for job_id, slot, body in rows:
        if body is None:  # a job_queue row without its jobs rows (the outer join's)
            continue
        mutation = decoder.decode(bytes(body))
        if bytes(slot) == b"accept" and isinstance(mutation, AcceptJob):
            accepted[bytes(job_id)] = mutation
        elif isinstance(mutation, PutJob):
            last[bytes(job_id)] = mutation.job
    out: dict[bytes, Loaded] = {}
    for job_id in ids:
        accept = accepted.get(job_id)
        record = last.get(job_id) or (accept.job if accept is not None else None)
        if record is not None:
            out[job_id] = (record, accept.input if accept is not None else None)
    return out


def _state_of(loaded: Iterable[Loaded], max_attempts: int) -> JobsState:
    """A JobsState holding just these jobs: JobsState's own rules decide on the database's rows."""
    state = JobsState(max_attempts)
    state.purging = False
    for record, job_input in loaded:
        state.adopt(record, job_input)
    return state


_LIVE = "r.lane = q.lane AND r.state = 'running' AND r.lease_until >= now() AND r.id <> q.id"
# the claimable rows, oldest first (the module's rule); a lane's job while the lane runs is not one
_CLAIMABLE = (  # with the jobs' rows of `jobs` (id, state, slot, body): one round trip
    "WITH c AS (SELECT q.id, q.state, q.created FROM job_queue q WHERE q.state IN ('queued', 'running') AND (q.state = 'queued' OR"
    " (q.state = 'running' AND"
    " (q.lease_until IS NULL OR q.lease_until < now()))) AND (q.not_before IS NULL OR q.not_before <= now())"
    f" AND q.kind = ANY(%s) AND (q.lane IS NULL OR NOT EXISTS (SELECT 1 FROM job_queue r WHERE {_LIVE}))"
    " AND NOT (q.id = ANY(%s))"
    " ORDER BY q.created LIMIT %s FOR UPDATE OF q SKIP LOCKED)"
    " SELECT c.id, c.state, j.slot, j.body FROM c LEFT JOIN jobs j ON j.id = c.id ORDER BY c.created, c.id"
)
# the queued jobs that wait for their lane: (id, lane, the lane's running job, its node)
_LANE_WAITS = (  # from the running side: few rows (at most every node's concurrency)
    "SELECT q.id, q.lane, r.id, r.node FROM job_queue r JOIN job_queue q ON q.lane = r.lane AND q.state = 'queued'"
    " WHERE r.state = 'running' AND r.lane IS NOT NULL AND r.lease_until >= now() AND q.kind = ANY(%s)"
    " ORDER BY q.created LIMIT 100"
)


class TeamQueue:
    """The job queue of the daemons on one database (the module's rule), for one node."""

    def __init__(self, store: Any, node: str, *, lease: float, renew: float) -> None:
        self.store = store  # the PostgresStore: its pool and limiter
        self.node = node
        self.lease = lease  # seconds a claim or a renewal holds a job
        self.renew = renew  # seconds between renewals (and between looks at the queue)
        self.claims = 0
        self.lost = 0  # leases found lost at renewal or at a commit

    async def _run(self, fn: Callable[..., T], *args: Any, writes: bool = True) -> T:
        """fn(conn, *args) in one transaction, in a worker thread (the module's rule). `writes`: fn
        writes the feed after taking row locks (False: it reads, or updates job_queue alone)."""
        result: T = await trio.to_thread.run_sync(
            functools.partial(self._transaction, fn, args, writes), limiter=self.store.limiter
        )
        return result

    def _transaction(self, fn: Callable[..., T], args: tuple[Any, ...], writes: bool) -> T:
        if self.store.pool is None:
            raise StoreUnavailable("PostgreSQL is not connected", "unavailable", store="postgres")
        try:
            with self.store.pool.connection() as conn, conn.transaction():
                # a transaction that writes the feed takes the feed's lock first, as every commit does
                # (store.write_mutations): one order of locks, so its row locks never wait in a circle
                # with a commit's. One that only reads, or only updates job_queue's own columns (a
                # renewal, every `renew` seconds on every node), waits for no lock while it holds one,
                # and does not take it: it would serialise the team's renewals with every commit.
                # Either way the server ends it if this node stops mid-way (FEED_HOLD_LIMIT): a
                # renewal's row lock would keep the job from the node taking it over.
                take_feed_lock(conn.cursor(), lock=writes)
                return fn(conn, *args)
        except (StaleAttempt, StoreUnavailable, msgspec.DecodeError):
            raise
        except Exception as exc:
            if type(exc).__module__.startswith(("psycopg", "psycopg_pool")):
                raise classify(exc) from exc
            raise

    # --- start ----------------------------------------------------------------------------------------

    async def take_back(self) -> int:
        """At start: the leases of this node's previous life expire now (nothing of it runs any
        more), so its jobs are claimable at once rather than after their lease. Returns how many."""
        return await self._run(self._take_back, writes=False)

    def _take_back(self, conn: Any) -> int:
        cur = conn.execute(
            "UPDATE job_queue SET lease_until = NULL WHERE node = %s AND state = 'running'", (self.node,)
        )
        return int(cur.rowcount)

    # --- accept -----------------------------------------------------------------------------------------

    async def accept(
        self,
        kind: str,
        key: str,
        job_input: JobInput | None,
        job_id: str,
        covers: Callable[[JobRecord], bool],
        max_attempts: int,
        lane: str | None = None,
    ) -> tuple[Loaded | None, bool]:
        """JobsState.accept_coalesced on the key's newest job in the database, under the key's lock:
        ((record, input) or None, whether it was created now). `lane`: a new job's (the module's rule)."""

        def accept_in(conn: Any) -> tuple[Loaded | None, bool]:
            conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (KEY_LOCK, _hash(key)))
            row = conn.execute(
                "SELECT id FROM job_queue WHERE key = %s ORDER BY created DESC LIMIT 1", (_b(key),)
            ).fetchone()
            state = _state_of(_load(conn, [bytes(row[0])]).values() if row else [], max_attempts)
            record, created = state.accept_coalesced(kind, key, job_input, job_id, covers)
            if record is None:
                return None, False
            write_mutations(conn.cursor(), state.take_pending())
            if created and lane is not None:
                conn.execute("UPDATE job_queue SET lane = %s WHERE id = %s", (_b(lane), _b(record.id)))
            return (record, state.inputs.get(record.id, job_input if created else None)), created

        return await self._run(accept_in)

    # --- claim, renew, commit ---------------------------------------------------------------------------

    async def claim(
        self,
        limit: int,
        kinds: list[str],
        max_attempts: int,
        lane: Callable[[str, Any], str | None],
        running: Iterable[str] = (),
    ) -> Claim:
        """Up to `limit` jobs claimed for this node (the module's rule): (record, input, token) of
        each started; the (record, input) of those the claim ended instead (failed: the attempt
        cap, or no input); and why each job passed over for its lane waits. `running`: the jobs
        this node runs now, never claimed again by it (a lease it renewed late has expired, but the
        attempt goes on, and its renewal or its commit says whether it still holds)."""
        claim: Claim = await self._run(self._claim, limit, kinds, max_attempts, lane, [_b(j) for j in running])
        self.claims += len(claim.claimed)
        return claim

    def _claim(
        self,
        conn: Any,
        limit: int,
        kinds: list[str],
        max_attempts: int,
        lane_of: Callable[[str, Any], str | None],
        running: list[bytes],
    ) -> Claim:
        found = conn.execute(_CLAIMABLE, (kinds, running, limit)).fetchall()
        rows = list(dict.fromkeys((bytes(job_id), row_state) for job_id, row_state, _, _ in found))
        loaded = _assemble([job_id for job_id, _ in rows], [(job_id, slot, body) for job_id, _, slot, body in found])
        out = Claim([], [], {})
        claimed, ended = out.claimed, out.ended
        lanes: set[str] = set()
        writes: list[Any] = []  # the claim's mutations, in order
        leases: list[tuple[Any, ...]] = []  # (node, token, lane, lease, id) of each job started
        for job_id, row_state in rows:
            if len(claimed) >= limit:
                break
            found = loaded.get(bytes(job_id))
            if found is None:
                continue
            record, job_input = found
            state = _state_of([found], max_attempts)
            if row_state == "running":  # its node's lease expired: an interrupted attempt, counted
                state.interrupted(record, f"its node's lease expired during attempt {record.attempts} (the node died or was cut off)")
            if job_input is None:
                ended.append((state.finish(state.jobs[record.id], "failed", error="its input is missing"), None))
                writes += state.take_pending()
                continue
            lane = lane_of(record.kind, job_input)
            busy = self._lane_busy(conn, lane, bytes(job_id), lanes) if lane is not None else None
            if busy is not None:
                out.lane_waits[record.id] = f"waiting for {busy} of the same lane ({lane}) to finish"
                continue
            started = state.start(record.id)
            writes += state.take_pending()
            if started is None:  # failed: the attempt cap
                ended.append((state.jobs[record.id], job_input))
                continue
            token = secrets.token_hex(8)
            leases.append((self.node, token, _b(lane) if lane is not None else None, self.lease, bytes(job_id)))
            if lane is not None:
                lanes.add(lane)
            claimed.append((started[0], started[1], token))
        with conn.pipeline(), conn.cursor() as cur:  # the writes in one round trip
            write_mutations(cur, writes)
            cur.executemany(
                "UPDATE job_queue SET node = %s, token = %s, lane = %s,"
                " lease_until = now() + make_interval(secs => %s) WHERE id = %s",
                leases,
            )
        for job_id, lane, holder, node in conn.execute(_LANE_WAITS, (kinds,)).fetchall():
            ident = bytes(job_id).decode("utf-8", "surrogatepass")
            out.lane_waits.setdefault(
                ident,
                f"waiting for job {bytes(holder).decode('utf-8', 'surrogatepass')} (on {node}) of the same lane "
                f"({bytes(lane).decode('utf-8', 'surrogatepass')}) to finish",
            )
        return out

    def _lane_busy(self, conn: Any, lane: str, job_id: bytes, taken: set[str]) -> str | None:
        """None if a job of `lane` may start now (the module's rule; the lane's lock is then held to
        the claim's end), else what it waits for."""
        if lane in taken:
            return "a job this claim started"
        if not conn.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", (LANE_LOCK, _hash(lane))).fetchone()[0]:
            return "another node's claim"
        row = conn.execute(
            "SELECT id, node FROM job_queue WHERE lane = %s AND state = 'running' AND lease_until >= now()"
            " AND id <> %s LIMIT 1",
            (_b(lane), job_id),
        ).fetchone()
        return None if row is None else f"job {bytes(row[0]).decode('utf-8', 'surrogatepass')} (on {row[1]})"

    async def renew_leases(self, held: dict[str, str]) -> set[str]:
        """Renew this node's leases (job id -> token); the ids whose lease is lost."""
        kept = await self._run(self._renew, held, writes=False)
        lost = set(held) - kept
        self.lost += len(lost)
        return lost

    def _renew(self, conn: Any, held: dict[str, str]) -> set[str]:
        rows = conn.execute(
            "UPDATE job_queue q SET lease_until = now() + make_interval(secs => %s)"
            " FROM unnest(%s::bytea[], %s::text[]) AS l(id, token)"
            " WHERE q.id = l.id AND q.token = l.token AND q.node = %s AND q.state = 'running' RETURNING q.id",
            (self.lease, [_b(job_id) for job_id in held], list(held.values()), self.node),
        ).fetchall()
        return {bytes(row[0]).decode("utf-8", "surrogatepass") for row in rows}

    async def commit(
        self, mutations: list[Any], job_id: str, token: str | None, *, not_before: float | None = None
    ) -> None:
        """The mutations of a job's attempt (token: this node's lease on it) or of a delivered result
        (token None), committed only while that holds (the module's rule); StaleAttempt when not.
        `not_before`: the job backs off this many seconds (a requeue). A connection that broke
        gets the transaction once more, which finds out whether the first one committed."""
        import psycopg
        import psycopg_pool

        for attempt in (1, 2):
            try:
                await self._run(self._commit, mutations, job_id, token, not_before, attempt == 2)
                return
            except StoreUnavailable as exc:
                cause = exc.__cause__
                broke = isinstance(cause, psycopg.OperationalError) and not isinstance(cause, psycopg_pool.PoolTimeout)
                if attempt == 2 or not broke:
                    raise
            except StaleAttempt:
                self.lost += 1
                raise

    def _commit(
        self, conn: Any, mutations: list[Any], job_id: str, token: str | None, not_before: float | None, again: bool
    ) -> None:
        row = conn.execute(
            "SELECT state, node, token FROM job_queue WHERE id = %s FOR UPDATE", (_b(job_id),)
        ).fetchone()
        if token is not None:
            held = row is not None and row[0] == "running" and row[1] == self.node and row[2] == token
            final = _final_state(mutations, job_id)
            if not held and again and row is not None and row[2] == token and row[0] == final:
                return  # the first try committed before its connection broke
        else:
            held = row is not None and row[0] not in ("done", "cancelled")
            if not held and again:
                raise StoreUnavailable(
                    "PostgreSQL: the connection broke during a delivered result's commit; whether it committed is "
                    "unknown", "unavailable", store="postgres",
                )
        if not held:
            raise StaleAttempt(job_id)
        with conn.pipeline(), conn.cursor() as cur:  # the writes in one round trip
            write_mutations(cur, mutations)
            if not_before is not None:
                cur.execute(
                    "UPDATE job_queue SET not_before = now() + make_interval(secs => %s) WHERE id = %s",
                    (not_before, _b(job_id)),
                )

    async def purge(self, keep: int) -> list[str]:
        """The finished jobs past the `keep` newest purged (PurgeJob through the feed, as JobsState's
        purge_old does for one daemon), by one node at a time (an advisory lock; a node that finds
        it taken purges nothing now); a job being retried or cancelled meanwhile (its row locked)
        is passed over. The ids purged."""
        return await self._run(self._purge, keep)

    def _purge(self, conn: Any, keep: int) -> list[str]:
        if not conn.execute("SELECT pg_try_advisory_xact_lock(%s, 0)", (PURGE_LOCK,)).fetchone()[0]:
            return []
        rows = conn.execute(
            "SELECT id FROM job_queue WHERE state IN ('done', 'failed', 'cancelled') ORDER BY created DESC"
            " OFFSET %s FOR UPDATE SKIP LOCKED",
            (keep,),
        ).fetchall()
        ids = [bytes(row[0]).decode("utf-8", "surrogatepass") for row in rows]
        with conn.pipeline(), conn.cursor() as cur:
            write_mutations(cur, [PurgeJob(job_id) for job_id in ids])
        return ids

    async def clear_backoffs(self) -> None:
        """sys.resume: every job's back-off forgotten, on every node."""
        await self._run(
            lambda conn: conn.execute("UPDATE job_queue SET not_before = NULL WHERE not_before IS NOT NULL"), writes=False
        )

    # --- jobs.* -----------------------------------------------------------------------------------------

    async def change(self, job_id: str, method: str, params: Any, max_attempts: int) -> tuple[Loaded, bool]:
        """jobs.cancel or jobs.retry decided on the job's committed row, under its lock, by JobsState's
        handler: (the job after, input) and whether it was running when cancelled. ProtocolError
        (not_found, ...) as the handler raises it."""
        return await self._run(self._change, job_id, method, params, max_attempts)

    def _change(self, conn: Any, job_id: str, method: str, params: Any, max_attempts: int) -> tuple[Loaded, bool]:
        from ...protocol import ProtocolError
        conn.execute("SELECT 1 FROM job_queue WHERE id = %s FOR UPDATE", (_b(job_id),))
        found = _load(conn, [_b(job_id)]).get(_b(job_id))
        if found is None:
            raise ProtocolError("not_found", f"no job with id {job_id!r}", id=job_id)
        state = _state_of([found], max_attempts)
        state.handle(method, params)
        write_mutations(conn.cursor(), state.take_pending())
        return (state.jobs[job_id], state.inputs.get(job_id)), bool(state.cancelled_running)

    async def get(self, job_id: str) -> Loaded | None:
        """The job as committed (None: no such job)."""
        found: dict[bytes, Loaded] = await self._run(_load, [_b(job_id)], writes=False)
        return found.get(_b(job_id))

    async def jobs(self, state: str | None, kind: str | None, limit: int) -> list[Loaded]:
        """jobs.list's jobs as committed, newest first."""
        return await self._run(self._list, state, kind, limit, writes=False)

    def _list(self, conn: Any, state: str | None, kind: str | None, limit: int) -> list[Loaded]:
        rows = conn.execute(
            "SELECT id FROM job_queue WHERE (%s::text IS NULL OR state = %s) AND (%s::text IS NULL OR kind = %s)"
            " ORDER BY created DESC LIMIT %s",
            (state, state, kind, kind, limit),
        ).fetchall()
        ids = [bytes(row[0]) for row in rows]
        loaded = _load(conn, ids)
        return [loaded[job_id] for job_id in ids if job_id in loaded]

    def statistics(self) -> dict[str, Any]:
        return {"node": self.node, "lease": self.lease, "renew": self.renew, "claims": self.claims, "leases_lost": self.lost}


def _final_state(mutations: list[Any], job_id: str) -> str | None:
    """The state the mutations leave the job in (the last of its records among them)."""
    final = None
    for mutation in mutations:
        job = getattr(mutation, "job", None)
        if isinstance(job, JobRecord) and job.id == job_id:
            final = job.state
    return final


"""The daemon: it wires the parts together and runs a daemon's life, start-up to shutdown.

Rule kept here: no durable tier answers until its state is loaded (newest snapshot, then the
journal replayed past the snapshot's checkpoint; or PostgreSQL's tables). Under the journal, and
under PostgreSQL reached at the first attempt, the daemon listens only after that; under PostgreSQL
not reachable at start it listens at once with tier 1 and sys.* (ping, hello, stats), answering
every call that needs a durable tier `unavailable` with the reason until the store is connected
and loaded, then builds and starts the durable tiers' actors (`_serve`). Every part gets what it needs when it is made
(the actors, their loops' settings and the small protocols they call each other by), before any
of them runs; what is built here is only wired and started here. On shutdown it stops accepting,
answers what it has received, stops the background loops, writes a final snapshot and closes the
journal.

The parts: accepting connections (daemon/accept.py), `dispatch` (the one choke point every
request passes: redaction, then its tier's actor or daemon/sys_calls.py), the snapshots
(daemon/snapshots.py), each tier's actor with its own loops (tier 4's projection, scans,
re-embedding and maintenance schedule: daemon/memory/actor.py; the conversation extraction's
schedule: daemon/conversation/actor.py). Ownership: the Daemon reads no actor's state. What is
process-wide is owned here, per Daemon: the embedder (made here, or handed in by the caller), and
the garbage collector's tuning for the daemon's life (`_gc_tuned`, undone when serve() returns).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import msgspec
import trio

from ..protocol import Call, now_rfc3339
from . import systemd
from .accept import Acceptor, limits_of
from .config import Config
from .conversation.actor import ConversationActor
from .errors import StartupError
from .io_layer import BulkConnection, IOLayer
from .jobs import JobKind, JobsActor, LLMHandle, default_kinds
from .jobs.conversation import ConversationTrigger
from .listener import socket_access
from .llm import LLM, LLMConfigError, resolve
from .memory.actor import MemoryActor, MemoryLoops
from .memory.strength import StrengthSettings
from .paths import Paths, owned_root, record_socket
from .postgres.feed import FeedBehind, Follower
from .postgres.jobqueue import TeamQueue
from .postgres.node import node_id, node_name
from .postgres.store import postgres_store
from .recovery import Recovered, open_local_root, recover_reporting, recovery_line
from .redact import Redactor
from .retrieval.embed import Embedder, make_embedder, preload_embedder
from .skills.actor import SkillsActor
from .snapshots import PurgeSignal, Snapshots
from .stats import VERSION, RequestStats, duration, startup_line
from .storage.files import FileLayer
from .storage.journal import Journal
from .storage.journal_actor import JournalActor
from .storage.journal_kernel import make_journal_actor
from .storage.store import Store, StoreUnavailable
from .sys_calls import SysCalls
from .tier import HANDLERS, Reply, TierActor, Work, stuck_actors
from .tiers.episodic import EpisodicActor, EpisodicState, ExtractionQueue

log = logging.getLogger("eurekamem")

__all__ = ["VERSION", "Daemon"]


PEER_STAMPED = frozenset({"memory.promote", "review.approve", "review.reject"})  # params with peer_uid


@contextlib.contextmanager
def _gc_tuned() -> Iterator[None]:
    """The collector's tuning for a daemon's life, undone after (a test process runs many daemons).

    What recovery loaded lives as long as the daemon: frozen out of every collection; requests make
    many short-lived objects: collect less often."""
    threshold = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


class Daemon:
    # made once recovery is done (serve), each with what it needs
    journal_actor: JournalActor
    store_in_use: Store  # where the tiers commit: the journal actor, or the PostgresStore
    store: Any  # store = postgres: the PostgresStore (daemon/postgres/store.py), connected before the durable tiers load
    memory_actor: MemoryActor
    skills_actor: SkillsActor
    conversation_actor: ConversationActor
    jobs_actor: JobsActor
    snapshots: Snapshots
    sys_calls: SysCalls
    extractions: Extractions  # tier 1's way to the job queue (there once the durable tiers are built)
    _scheduler_scope: trio.CancelScope  # the snapshot schedule's (cancelled at shutdown)

    def __init__(
        self,
        config: Config,
        fs: FileLayer | None = None,
        service_manager: systemd.ServiceManager | None = None,
        embedder: Embedder | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        job_kinds: dict[str, JobKind] | None = None,
        llm_factory: Callable[[], LLMHandle] | None = None,
        wall_clock: Callable[[], float] | None = None,
    ) -> None:
        self.config = config
        # tier 4's embedder: made from the config at serve(), or one the caller shares between
        # daemons it runs one after another (the tests: a model loads once per test process)
        self.embedder = embedder
        # the wall clock of tier 4's timestamps, strength and maintenance schedule (seconds since
        # 1970); tests give one that follows trio's virtual clock
        self.wall = wall_clock or time.time
        self.fs = fs  # the journal's file layer (tests pass a fake one); None means the real files
        # where the LLM's key and settings are looked up (resolved at start and at sys.resume)
        self.environ = os.environ if environ is None else environ
        self.job_kinds = job_kinds  # None: the daemon's own (tests pass others)
        self.llm_factory: Callable[[], LLMHandle] = llm_factory or self._make_llm  # tests pass a fake provider's
        # systemd's notify socket and watchdog, from the environment (a no-op when systemd did not start us)
        self.systemd = service_manager or systemd.ServiceManager()
        self.paths = Paths(config.data_dir)
        self.limits = limits_of(config)
        self.stats = RequestStats()
        self.started_at = now_rfc3339()
        self._shutdown = trio.Event()
        self.redactor = Redactor.from_config(config)  # every write's text passes it in dispatch
        self._intercepted = frozenset(self.redactor.plan) | PEER_STAMPED
        self.acceptor = Acceptor(config, self.limits, self.dispatch, self.stats)
        self.actors: dict[str, TierActor] = {}
        self.recovery: dict[str, Any] = {}
        self._started_clock = 0.0  # trio.current_time() when serve() began
        self._feed_scope = trio.CancelScope()  # the change feed's follower (store = postgres), cancelled at _stop
        self.failed: Exception | None = None  # why the daemon stopped itself (the feed trimmed past it; exit status 1)

    # what tests and tools read of a running daemon (the parts own them)
    @property
    def refused_peers(self) -> int:
        return self.acceptor.refused_peers

    @property
    def _connections(self) -> set[BulkConnection]:
        return self.acceptor.connections

    @property
    def io_layer(self) -> IOLayer | None:
        return self.acceptor.io_layer

    def statistics(self) -> dict[str, Any]:
        """sys.stats's answer (daemon/sys_calls.py)."""
        return self.sys_calls.statistics()

    async def snapshot(self, force: bool = False) -> int:
        """Write every snapshot file now (daemon/snapshots.py); returns the journal seq covered."""
        return await self.snapshots.snapshot(force)

    def request_shutdown(self) -> None:
        self._shutdown.set()

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self._started_clock = trio.current_time()
        async with owned_root(self.paths, f"eurekamem {VERSION}"):
            await self._serve_locked(task_status)

    def _make_llm(self) -> LLMHandle:
        """The LLM client the configuration and the environment name (one that says why, when none);
        what its errors hold (an error body, a refusal's text) leaves it redacted like a request."""
        return LLM(resolve(self.config.llm_config(), self.environ), scrub=self.redactor.text)

    async def _serve_locked(self, task_status: Any) -> None:
        started = trio.current_time()
        log.info("%s", startup_line(self.config))
        socket_access(self.config)  # allowed_uids that could not reach the socket: refused now, not after recovery
        try:
            first_llm = self.llm_factory()
        except LLMConfigError as exc:
            raise StartupError(str(exc)) from None
        if self.embedder is None:
            try:
                self.embedder = make_embedder(self.config.embedder, **self.config.embedder_options)
            except (ValueError, TypeError) as exc:
                raise StartupError(f"embedder {self.config.embedder!r}: {exc}") from None
        # the model loads in a thread of its own while recovery reads the snapshots (2 cores: the
        # first search after a restart need not wait for both one after the other)
        threading.Thread(target=_load_and_log, args=(self.embedder,), name="embedder-load", daemon=True).start()
        recovered: Recovered | None = None
        if self.config.store == "journal":
            recovered = await self._recover(started)
            assert recovered.journal is not None
            journal = recovered.journal
        else:
            self.store = postgres_store(self.config)
            journal = await trio.to_thread.run_sync(open_local_root, self.paths, self.fs)
            self.store.identify(node_id(self.paths))  # before any commit: its rows name the node
            try:
                if await self.store.connect_once():
                    recovered = await self._recover(started)
            except BaseException:
                journal.close()
                raise
        try:
            with _gc_tuned():
                await self._serve(journal, recovered, task_status, first_llm)
        finally:
            if self.config.store == "postgres":
                await trio.to_thread.run_sync(self.store.close)

    async def _recover(self, began: float) -> Recovered:
        """The durable tiers' state, from the journal's root, or from PostgreSQL once connected."""
        store = self.store if self.config.store == "postgres" else None
        recovered = await recover_reporting(self.paths, self.fs, self.embedder, self.redactor, self.systemd, store)
        self.redactor.counted(recovered.redacted)  # what a first start's import replaced (recovery's thread handed it back)
        self.recovery.update(recovered.summary(trio.current_time() - began))
        log.info("%s", recovery_line(self.recovery))
        return recovered

    def not_serving(self) -> StoreUnavailable:
        """What a call needing a durable tier answers before they serve (PostgreSQL not reached yet, or loading)."""
        reason = self.store.last_error or "loading the durable tiers from PostgreSQL"
        return StoreUnavailable(
            f"the durable tiers are not serving yet: {reason}; tier 1 and sys.* answer meanwhile, retry",
            "unavailable",
            store="postgres",
            reason=reason,
        )

    def _build(self, recovered: Recovered, first_llm: LLMHandle, purged: PurgeSignal) -> None:
        """Every durable tier's actor, each made with what it needs (the jobs actor first: the tiers queue
        jobs; its table of tiers is filled here, before any actor runs)."""
        config = self.config
        store = self.store_in_use
        tiers: dict[str, TierActor] = {"episodic": self.actors["episodic"]}  # what the job queue's attempts read and stage through
        jobs = self.jobs_actor = JobsActor(
            recovered.jobs,
            store,
            tiers=tiers,
            kinds=self.job_kinds if self.job_kinds is not None else default_kinds(config.conversation_extract_token_budget),
            llm=first_llm,
            llm_factory=self.llm_factory,
            embedder=recovered.memory.embedder,
            concurrency=config.jobs_concurrency,
            max_attempts=config.jobs_max_attempts,
            environ=self.environ,
            redactor=self.redactor,
            queue=self._team_queue(),
        )
        conversation = self.conversation_actor = ConversationActor(
            recovered.conversation,
            store,
            retention_days=config.conversation_retention_days,
            session_gap=config.conversation_session_gap,
            trigger=functools.partial(ConversationTrigger, jobs),
            extract_interval=config.conversation_extract_interval,
            extract_min_chars=config.conversation_extract_min_chars,
        )
        memory = self.memory_actor = MemoryActor(
            recovered.memory,
            store,
            self.paths.root,
            conversation=conversation,  # MEMORY.md's group summaries, memory.inject's messages and summaries
            jobs=jobs,  # tier 4's maintenance runs as jobs
            redactor=self.redactor,  # for the learning loop's proposals (MemoryActor.propose)
            on_purge=purged.set,  # a purge snapshots at once (its text leaves the journal)
            write_backlog=config.memory_write_backlog,  # the fast lane's bound
            loops=MemoryLoops(
                projection_interval=config.projection_interval,
                watch_interval=config.watch_interval,
                watch_full_interval=config.watch_full_interval,
                maintenance_at=config.maintenance_at,
                maintenance_catchup=config.maintenance_catchup,
            ),
            wall=self.wall,
            share_policy=config.share_policy_for,  # memory.promote's, per domain
            strength=StrengthSettings.from_config(config),
        )
        skills = self.skills_actor = SkillsActor(
            recovered.skills,
            store,
            self.paths.root,
            projection_interval=config.projection_interval,
            watch_interval=config.watch_interval,  # skills/ is scanned as memories/ is
            watch_full_interval=config.watch_full_interval,
        )
        tiers.update(
            persistent=TierActor(recovered.persistent, store, inline=True),
            graph=TierActor(recovered.graph, store, inline=True),
            memory=memory,
            skills=skills,
            conversation=conversation,
        )
        journal_actor = self.journal_actor
        fresh = recovered.replayed == 0 and not recovered.imported  # the files on disk are current
        self.snapshots = Snapshots(
            self.paths,
            journal_actor,
            memory=memory,
            skills=skills,
            conversation=conversation,
            persistent=tiers["persistent"],
            graph=tiers["graph"],
            jobs=jobs,
            purged=purged,
            quiet=config.snapshot_quiet,
            max_delay=config.snapshot_max_delay,
            seq=journal_actor.acked_seq if fresh else -1,
            local_store=self.store if config.store == "postgres" else None,
        )
        self.extractions.serve(jobs)
        self.actors.update(tiers, jobs=jobs)  # dispatch routes to them from now on

    def _team_queue(self) -> TeamQueue | None:
        """store = postgres: the job queue shared with the other daemons on the database, as this node."""
        if self.config.store != "postgres":
            return None
        return TeamQueue(
            self.store, self.store.node_id, lease=self.config.jobs_lease, renew=self.config.jobs_lease_renew
        )

    def _start_durable(self, system: trio.Nursery) -> None:
        """The durable tiers' actors and the snapshot schedule run; sys.* gets their parts."""
        for name, actor in self.actors.items():
            if name != "episodic":
                system.start_soon(actor.run)
        self.sys_calls.serve_durable(
            memory=self.memory_actor,
            skills=self.skills_actor,
            conversation=self.conversation_actor,
            jobs=self.jobs_actor,
            snapshots=self.snapshots,
        )
        system.start_soon(self.snapshots.schedule, self._scheduler_scope)
        if self.config.store == "postgres":
            system.start_soon(self._follow_feed)

    async def _follow_feed(self) -> None:
        """store = postgres: this node follows the change feed (daemon/postgres/feed.py) from the seq
        its tiers were loaded at, until shutdown; a node the feed was trimmed past stops the daemon."""
        follower = Follower(
            self.store,
            self.actors,
            node_id=self.store.node_id,
            name=node_name(self.config.node_name),
            start=self.store.loaded_seq,
            retention=self.config.feed_retention,
        )
        self.store.followed_by(follower)
        log.info("feed: node %s (%s) follows the feed from seq %d", follower.node_id, follower.name, follower.applied)
        with self._feed_scope:
            try:
                await follower.run()
            except FeedBehind as exc:
                log.error("feed: %s", exc)
                self.failed = exc
                self.request_shutdown()

    async def _load_when_connected(self) -> Recovered | None:
        """The durable tiers' state once PostgreSQL answers (retried with back-off) and is loaded;
        None if shutdown was asked for first."""
        loaded: list[Recovered] = []

        async def load(scope: trio.CancelScope) -> None:
            await self.store.connect()
            loaded.append(await self._recover(trio.current_time()))
            gc.freeze()  # what was loaded lives as long as the daemon (_gc_tuned)
            scope.cancel()

        async with trio.open_nursery() as race:
            race.start_soon(load, race.cancel_scope)
            await self._shutdown.wait()
            race.cancel_scope.cancel()
        return loaded[0] if loaded else None

    async def _serve(
        self, journal: Journal, recovered: Recovered | None, task_status: Any, first_llm: LLMHandle
    ) -> None:
        """Serve until shutdown. Tier 1 and sys.* serve from the start; the durable tiers too when
        `recovered` is there, else (PostgreSQL not reached at start) once it is loaded, their calls
        answering `unavailable` meanwhile (dispatch, SysCalls)."""
        config = self.config
        # the Journal is handed to the journal actor here (its writer thread's, or under fsync=always where
        # the kernel can make the fdatasync, trio's: daemon/storage/journal_kernel.py); the
        # journal's acknowledgements come back through the I/O layer's passes
        journal_actor = self.journal_actor = make_journal_actor(
            journal, config.fsync, config.batch_interval, acks="poller", sync=config.journal_sync
        )
        # where the durable tiers commit (daemon/storage/store.py): the journal, or PostgreSQL
        self.store_in_use = journal_actor if config.store == "journal" else self.store
        self.extractions = Extractions(self.not_serving)
        self.actors["episodic"] = EpisodicActor(
            EpisodicState(config.max_open_sessions), None, self.paths, idle_close=config.session_idle_close,
            jobs=self.extractions,  # session.close queues extractions
        )
        self._scheduler_scope = trio.CancelScope()
        if recovered is not None:
            self._build(recovered, first_llm, PurgeSignal())
        acceptor = self.acceptor
        activated = await acceptor.open()
        record_socket(self.paths, self.config.socket_path)
        try:
            async with trio.open_nursery() as system:
                system.start_soon(journal_actor.run)
                system.start_soon(self.actors["episodic"].run)
                self.sys_calls = SysCalls(
                    config,
                    self.paths,
                    limits=self.limits,
                    stats=self.stats,
                    started_at=self.started_at,
                    recovery=self.recovery,
                    actors=self.actors,
                    journal_actor=journal_actor,
                    store=self.store_in_use,
                    acceptor=acceptor,
                    redactor=self.redactor,
                    llm_factory=self.llm_factory,
                    nursery=system,
                    not_serving=lambda: self.not_serving().error(),
                )
                if recovered is not None:
                    self._start_durable(system)
                watchdog_scope = trio.CancelScope()
                system.start_soon(self._feed_watchdog, watchdog_scope)
                async with trio.open_nursery() as connections:
                    io_scope = trio.CancelScope()
                    acceptor.start_io(journal_actor, connections, io_scope)
                    acceptor.start_accepting(connections)
                    where = f"{config.socket_path}{' (socket activation)' if activated else ''}"
                    task_status.started(config.socket_path)
                    if recovered is None:
                        log.warning(
                            "listening on %s: tier 1 and sys.* answer; the durable tiers answer unavailable until "
                            "PostgreSQL is reached and loaded (%s)", where, self.store.last_error,
                        )
                        self.systemd.ready(f"tier 1 and sys.* on {config.socket_path}; waiting for PostgreSQL")
                        recovered = await self._load_when_connected()
                        if recovered is not None:
                            self._build(recovered, first_llm, PurgeSignal())
                            self._start_durable(system)
                            self.systemd.status(f"serving on {config.socket_path}")
                    else:
                        self.systemd.ready(f"serving on {config.socket_path}")
                    if recovered is not None:
                        log.info(
                            "ready: serving on %s (data root %s, store %s, fsync %s, journal sync: %s, started in %.2f s)",
                            where, self.paths.root, config.store, config.fsync, journal_actor.sync,
                            trio.current_time() - self._started_clock,
                        )
                        await self._shutdown.wait()
                    self.systemd.stopping("stopping: finishing answers, then a final snapshot")
                    log.info("shutting down: no new connections, finishing answers")
                    acceptor.stop_accepting()
                    if recovered is not None:
                        await self.jobs_actor.stop()  # running attempts stay queued in the journal; jobs.wait answers now
                    if not await acceptor.finish_connections(config.shutdown_grace):
                        connections.cancel_scope.cancel()
                    io_scope.cancel()
                await self._stop(recovered is not None, watchdog_scope, system)
        finally:
            acceptor.close()  # a socket passed by systemd is systemd's: never unlinked
            await trio.to_thread.run_sync(journal.close)  # the journal actor's writer thread has ended
            log.info("stopped after %s up", duration(trio.current_time() - self._started_clock))

    async def _stop(self, durable: bool, watchdog_scope: trio.CancelScope, system: trio.Nursery) -> None:
        """After the connections: the loops stopped, a final snapshot, the actors closed."""
        self._scheduler_scope.cancel()
        self._feed_scope.cancel()
        if durable:
            # the actors' own loops: projections, scans, embedding, and the schedules that only
            # ask for jobs (the job queue runs them)
            self.memory_actor.stop_loops()
            self.skills_actor.stop_loops()
            self.conversation_actor.stop_loops()
        watchdog_scope.cancel()
        with trio.CancelScope(shield=True):
            if durable:
                try:
                    await self.snapshot(force=True)
                except Exception:
                    log.exception("final snapshot failed; the journal still holds everything")
            for actor in self.actors.values():
                actor.close()
            self.journal_actor.close()
            system.cancel_scope.deadline = trio.current_time() + self.config.shutdown_grace

    async def _feed_watchdog(self, scope: trio.CancelScope) -> None:
        with scope:
            await systemd.feed_watchdog(self.systemd, self._heartbeat)

    async def _heartbeat(self, timeout: float) -> list[str]:
        """The names of the tier actors that did not answer within `timeout` (daemon/tier.py)."""
        return await stuck_actors(self.actors, timeout)

    # --- routing ------------------------------------------------------------------------------------

    def dispatch(self, call: Call, reply: Reply, started_ns: int) -> None:
        if call.spec.name in self._intercepted:  # the one choke point: nothing below sees the text unredacted
            self._intercept(call, reply)
        tier = call.spec.tier
        if tier != "sys":
            actor = self.actors.get(tier)
            if actor is None:  # a durable tier before PostgreSQL is reached and loaded
                reply.deliver(call, self.not_serving().error(), started_ns)
                return
            if actor.can_inline(call):  # a read (or tier 1) while the actor owes nothing: answer it here
                reply.deliver(call, actor.handle_inline(call, started_ns), started_ns)
            else:
                actor.submit(Work(call, reply, started_ns))
            return
        HANDLERS[call.spec.name].fn(self.sys_calls, call, reply, started_ns)

    def _intercept(self, call: Call, reply: Reply) -> None:
        """Before a write reaches its tier: its free text redacted (daemon/redact.py) and, for the
        review methods, who asked stamped in as the kernel reports it (a peer_uid sent is replaced)."""
        self.redactor.call(call)
        if call.spec.name in PEER_STAMPED:
            call.params = msgspec.structs.replace(call.params, peer_uid=getattr(reply, "peer_uid", None))


class Extractions:
    """Tier 1's job queue (session.close's extraction jobs): the jobs actor once the durable tiers are
    built; before that (PostgreSQL not reached yet) a session.close that would queue one answers
    `unavailable` and an idle session stays open (daemon/tiers/episodic.py), as while the store fails."""

    def __init__(self, not_serving: Callable[[], StoreUnavailable]) -> None:
        self.jobs: ExtractionQueue | None = None  # serve(): once Daemon._build made the jobs actor
        self.not_serving = not_serving

    def serve(self, jobs: ExtractionQueue) -> None:
        """From now on the jobs actor takes tier 1's extraction jobs (the one hand-over, in _build)."""
        self.jobs = jobs

    async def accept(self, kind: str, key: str, job_input: Any) -> str:
        if self.jobs is None:
            raise self.not_serving()
        return await self.jobs.accept(kind, key, job_input)


def _load_and_log(embedder: Embedder) -> None:
    """preload_embedder in its thread, then one line naming the model, its dimension and the load time."""
    began = time.monotonic()
    preload_embedder(embedder)
    if getattr(embedder, "loaded", False):
        log.info(
            "embedding model %s loaded (%s dimensions) in %.1f s",
            embedder.name, getattr(embedder, "dim", "?"), time.monotonic() - began,
        )

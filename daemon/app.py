"""The daemon: recovery, the actors, the listener, snapshots and an orderly shutdown.

Rule kept here: the daemon answers nothing until recovery is complete (newest snapshot, then the
journal replayed past the snapshot's checkpoint); a snapshot is written only from copies the tier
actors hand over between batches, after the journal has rotated, and journal segments are dropped
only after the snapshot files and the checkpoint that covers them are durable. On shutdown it stops
accepting, answers what it has received, writes a final snapshot and closes the journal.

Ownership: the Daemon reads no actor's state. sys.stats is built from what each actor publishes
(`TierActor.stats()`, `MemoryActor.statistics()`, `JournalActor.statistics()` and `.facts`); a
snapshot asks each actor for copies (`run_internal`). What is process-wide is owned here, per
Daemon: the embedder (made here, or handed in by the caller), and the garbage collector's tuning
for the daemon's life (`_gc_tuned`, undone when serve() returns).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import gc
import json
import logging
import os
import socket as stdlib_socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import outcome
import trio

from ..protocol import (
    METHODS,
    PROTOCOL_VERSION,
    Call,
    ProtocolError,
    failure,
    frame_ndjson,
    now_rfc3339,
)
from ..protocol import _methods as limits_module
from . import systemd
from .config import Config
from .conversation.actor import ConversationActor
from .errors import StartupError
from .io_layer import BulkConnection, IOLayer
from .jobs import JobsActor, default_kinds
from .jobs.conversation import ConversationTrigger
from .jobs.state import snapshot_of as jobs_snapshot_of
from .listener import open_listener, socket_access
from .llm import LLM, LLMConfigError, resolve
from .memory.actor import MemoryActor
from .memory.maintenance import Maintenance, schedule
from .memory.prepared import GroupSummary
from .memory.strength import StrengthSettings
from .memory.watch import SCAN_FACTOR
from .paths import OWN_FOLDERS, Paths, acquire_lock, claim_data_root
from .recovery import Recovered, recover
from .redact import Redactor
from .retrieval.embed import Embedder, make_embedder, preload_embedder
from .server import IN_ORDER_TIERS, Limits
from .skills.actor import SkillsActor
from .stats import RequestStats
from .storage import eurekaclaw
from .storage.files import PRIVATE_UMASK, RealFiles, atomic_write, make_private, write_unless_same
from .storage.journal import JournalWriteError
from .storage.journal_actor import JournalActor, JournalUnavailable
from .storage.journal_kernel import make_journal_actor
from .tier import HANDLERS, TierActor, Work, handles
from .tiers.episodic import EpisodicActor, EpisodicState

log = logging.getLogger("eurekamem")


try:
    from importlib.metadata import version as _dist_version

    VERSION = _dist_version("eurekamem")
except Exception:  # not installed as a distribution (running from a source tree)
    VERSION = "0.0.0+source"


REFUSAL_LINGER = 1.0  # seconds a refused peer may still send (dropped) before the daemon closes


MAX_LINGERING = 32


PEER_STAMPED = frozenset({"memory.promote", "review.approve", "review.reject"})  # params with peer_uid


BUSY_LIMIT = 900.0  # seconds one batch may take before the watchdog calls its actor stuck


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
# a snapshot that fails with one of these answers read_only (the disk is full or failing), with
# any other OSError internal (an unexpected I/O error: a file where a folder should be, say)
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG})


def _internal(what: str, exc: Exception) -> ProtocolError:
    """The answer to a sys call that failed in an unexpected way (logged with its traceback)."""
    log.exception("%s failed", what)
    return ProtocolError("internal", f"{what} failed: {exc}")


class Daemon:
    journal_actor: JournalActor  # set once recovery is done (serve)
    memory_actor: MemoryActor
    skills_actor: SkillsActor
    conversation_actor: ConversationActor
    jobs_actor: JobsActor

    def __init__(
        self,
        config: Config,
        fs: Any = None,
        service_manager: systemd.ServiceManager | None = None,
        embedder: Embedder | None = None,
        *,
        environ: Any = None,
        job_kinds: dict[str, Any] | None = None,
        llm_factory: Any = None,
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
        self.llm_factory = llm_factory or self._make_llm  # tests pass a fake provider's
        # systemd's notify socket and watchdog, from the environment (a no-op when systemd did not start us)
        self.systemd = service_manager or systemd.ServiceManager()
        self.refused_peers = 0  # connections refused by the SO_PEERCRED check
        self._lingering = 0
        self.paths = Paths(config.data_dir)
        self.limits = Limits(
            max_frame_bytes=config.max_frame_bytes,
            max_inflight=config.max_inflight,
            max_requests_per_second=config.max_requests_per_second,
            request_burst=config.request_burst,
        )
        self.stats = RequestStats()
        self.started_at = now_rfc3339()
        self._shutdown = trio.Event()
        self._connections: set[BulkConnection] = set()
        self._connection_closed = trio.Event()  # set (and replaced) as each connection closes
        self.io_layer: IOLayer | None = None  # the layer that reads and writes every socket (set in serve)
        self._snapshot_lock = trio.Lock()
        self._resume_lock = trio.Lock()
        self._snapshot_seq = -1
        self._purged = trio.Event()  # a memory was purged: snapshot now (its text leaves the journal)
        self.actors: dict[str, TierActor] = {}
        self.recovery: dict[str, Any] = {}
        self._started_clock = 0.0  # trio.current_time() when serve() began
        # tier 4's background embedding, as sys.stats → memory.embedding shows it; written only by
        # _memory_background, read by statistics(), both on the event loop
        self.embedding = EmbeddingProgress()
        self.redactor = Redactor.from_config(config)  # every write's text passes it in dispatch
        self._intercepted = frozenset(self.redactor.plan) | PEER_STAMPED
        self.maintenance: Maintenance | None = None  # tier 4's maintenance: jobs of the queue (serve)
        self.conversation_trigger: Any = None  # conversation extraction's triggers (serve)

    def request_shutdown(self) -> None:
        self._shutdown.set()

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self._started_clock = trio.current_time()
        # everything the daemon creates is its user's alone: folders 0700, files 0600 (the journal,
        # the snapshots and the memory files hold every memory); restored when serve returns
        umask = os.umask(PRIVATE_UMASK)
        try:
            made_here = claim_data_root(self.paths)
            lock_fd = acquire_lock(self.paths)
            try:
                if made_here:
                    atomic_write(RealFiles(), str(self.paths.made_here), f"made by eurekamem {VERSION}\n".encode())
                ours = self.paths.made_here.exists()
                only = None if ours else OWN_FOLDERS
                tightened = await trio.to_thread.run_sync(functools.partial(make_private, self.paths.root, only=only))
                if tightened:
                    log.warning(
                        "data root %s: removed group and other permissions from %d files and folders%s "
                        "(now 0700 folders, 0600 files: only this user may read the memories)", self.paths.root, tightened,
                        "" if ours else f" in {', '.join(OWN_FOLDERS)} (a folder the daemon did not make: nothing else in it is changed)",
                    )
                await self._serve_locked(task_status)
            finally:
                os.close(lock_fd)
        finally:
            os.umask(umask)

    def _make_llm(self) -> Any:
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
        embedder = self.embedder
        # the model loads in a thread of its own while recovery reads the snapshots (2 cores: the
        # first search after a restart need not wait for both one after the other)
        threading.Thread(target=_load_and_log, args=(embedder,), name="embedder-load", daemon=True).start()
        gc.disable()  # recovery allocates millions of objects that all live on: collecting them is waste
        try:
            recovered = await self._recover(embedder)
        finally:
            gc.enable()
        self.redactor.counted(recovered.redacted)  # what a first start's import replaced (recovery's thread handed it back)
        self.recovery = {
            "checkpoint_seq": recovered.checkpoint_seq,
            "replayed": recovered.replayed,
            "imported": recovered.imported,
            "seconds": round(trio.current_time() - started, 3),
            "interrupted_jobs": recovered.interrupted_jobs,
        }
        log.info("%s", recovery_line(self.recovery))
        with _gc_tuned():
            await self._serve_recovered(recovered, task_status, first_llm)

    async def _serve_recovered(self, recovered: Recovered, task_status: Any, first_llm: Any) -> None:
        journal = recovered.journal
        assert journal is not None
        recovered.memory.share_policy = self.config.share_policy_for  # memory.promote's, per domain
        recovered.memory.settings = StrengthSettings.from_config(self.config)
        recovered.memory.wall = self.wall
        # the Journal is handed to the journal actor here (its writer thread's, or under fsync=always where
        # the kernel can make the fdatasync, trio's: daemon/storage/journal_kernel.py); the
        # journal's acknowledgements come back through the I/O layer's passes
        self.journal_actor = make_journal_actor(
            journal, self.config.fsync, self.config.batch_interval, acks="poller", sync=self.config.journal_sync
        )
        self.memory_actor = MemoryActor(recovered.memory, self.journal_actor, self.paths.root)
        self.memory_actor.redactor = self.redactor  # for the learning loop's proposals (MemoryActor.propose)
        self.memory_actor.write_backlog = self.config.memory_write_backlog  # the fast lane's bound
        self.skills_actor = SkillsActor(
            recovered.skills, self.journal_actor, self.paths.root, projection_interval=self.config.projection_interval
        )
        self.conversation_actor = ConversationActor(
            recovered.conversation, self.journal_actor, retention_days=self.config.conversation_retention_days
        )
        self.actors = {
            "episodic": EpisodicActor(EpisodicState(), None, self.paths, self.config),
            "persistent": TierActor(recovered.persistent, self.journal_actor, inline=True),
            "graph": TierActor(recovered.graph, self.journal_actor, inline=True),
            "memory": self.memory_actor,
            "skills": self.skills_actor,
            "conversation": self.conversation_actor,
        }
        self.actors["memory"].on_purge = self._snapshot_after_purge  # type: ignore[attr-defined]
        recovered.conversation.session_gap = self.config.conversation_session_gap
        self.jobs_actor = JobsActor(
            recovered.jobs,
            self.journal_actor,
            tiers=dict(self.actors),
            kinds=self.job_kinds
            if self.job_kinds is not None
            else default_kinds(self.config.conversation_extract_token_budget),
            llm=first_llm,
            llm_factory=self.llm_factory,
            embedder=recovered.memory.embedder,
            concurrency=self.config.jobs_concurrency,
            max_attempts=self.config.jobs_max_attempts,
            environ=self.environ,
            redactor=self.redactor,
        )
        self.actors["jobs"] = self.jobs_actor
        episodic: Any = self.actors["episodic"]
        episodic.jobs = self.jobs_actor  # session.close queues extractions (wired before any actor runs)
        self.maintenance = Maintenance(self.jobs_actor, self.memory_actor, wall=self.wall)
        self.memory_actor.summaries = self._group_summaries  # MEMORY.md's "Summary" (conversation groups)
        self.memory_actor.messages = self.conversation_actor.search_messages  # memory.inject's raw messages
        self.memory_actor.group_summaries = self._group_summaries_full  # memory.inject's include_summary
        self.conversation_trigger = ConversationTrigger(self.jobs_actor, self.conversation_actor)
        trigger = self.conversation_trigger
        self.conversation_actor.flush = lambda group: trigger.request(group, "conversation.flush")
        if recovered.replayed == 0 and not recovered.imported:
            self._snapshot_seq = self.journal_actor.acked_seq  # the files on disk are current
        listener, activated = await self._listener()
        listener_stat = None if activated else os.stat(self.config.socket_path)
        try:
            async with trio.open_nursery() as system:
                system.start_soon(self.journal_actor.run)
                for actor in self.actors.values():
                    system.start_soon(actor.run)
                scheduler_scope = trio.CancelScope()
                system.start_soon(self._snapshot_scheduler, scheduler_scope)
                background_scope = trio.CancelScope()
                system.start_soon(self._memory_background, background_scope)
                watch_scope = trio.CancelScope()
                system.start_soon(self._watch_files, watch_scope)
                maintenance_scope = trio.CancelScope()
                system.start_soon(self._maintenance_schedule, maintenance_scope)
                conversation_scope = trio.CancelScope()
                system.start_soon(self._conversation_schedule, conversation_scope)
                watchdog_scope = trio.CancelScope()
                system.start_soon(self._feed_watchdog, watchdog_scope)
                self._system = system
                async with trio.open_nursery() as connections:
                    io_scope = trio.CancelScope()
                    self.io_layer = IOLayer(
                        self.limits, self.dispatch, self.stats, ordered_tiers=IN_ORDER_TIERS, on_close=self._closed,
                    )
                    assert self.journal_actor.ack_fd is not None  # acks="poller" (made so above)
                    self.io_layer.add_waker(
                        self.journal_actor.ack_fd, self.journal_actor.drain_acks, self.journal_actor.poller_stopped
                    )
                    connections.start_soon(self._run_io, self.io_layer, io_scope)
                    accept_scope = trio.CancelScope()
                    connections.start_soon(self._accept_loop, listener, connections, accept_scope)
                    log.info(
                        "ready: serving on %s%s (data root %s, fsync %s, journal sync: %s, started in %.2f s)",
                        self.config.socket_path, " (socket activation)" if activated else "", self.paths.root,
                        self.config.fsync, self.journal_actor.sync, trio.current_time() - self._started_clock,
                    )
                    task_status.started(self.config.socket_path)
                    self.systemd.ready(f"serving on {self.config.socket_path}")
                    await self._shutdown.wait()
                    self.systemd.stopping("stopping: finishing answers, then a final snapshot")
                    log.info("shutting down: no new connections, finishing answers")
                    accept_scope.cancel()
                    trio.lowlevel.notify_closing(listener)
                    listener.close()
                    await self.jobs_actor.stop()  # running attempts stay queued in the journal; jobs.wait answers now
                    for conn in list(self._connections):
                        conn.stop_reading()
                    with trio.move_on_after(self.config.shutdown_grace) as grace:
                        while self._connections:
                            self._connection_closed = trio.Event()
                            await self._connection_closed.wait()
                    if grace.cancelled_caught:
                        log.warning("gave up waiting for %d connections", len(self._connections))
                        connections.cancel_scope.cancel()
                    io_scope.cancel()
                scheduler_scope.cancel()
                background_scope.cancel()
                watch_scope.cancel()
                maintenance_scope.cancel()  # the schedule only asks for jobs: the job queue runs them
                conversation_scope.cancel()  # the periodic extraction likewise
                watchdog_scope.cancel()
                with trio.CancelScope(shield=True):
                    try:
                        await self.snapshot(force=True)
                    except Exception:
                        log.exception("final snapshot failed; the journal still holds everything")
                    for actor in self.actors.values():
                        actor.close()
                    self.journal_actor.close()
                    system.cancel_scope.deadline = trio.current_time() + self.config.shutdown_grace
        finally:
            listener.close()
            try:  # a socket passed by systemd is systemd's: never unlink it
                if listener_stat is not None and os.stat(self.config.socket_path).st_ino == listener_stat.st_ino:
                    os.unlink(self.config.socket_path)
            except FileNotFoundError:
                pass
            await trio.to_thread.run_sync(journal.close)  # the journal actor's writer thread has ended
            log.info("stopped after %s up", _duration(trio.current_time() - self._started_clock))

    async def _accept_loop(self, listener: Any, nursery: trio.Nursery, scope: trio.CancelScope) -> None:
        with scope:
            while True:
                await trio.lowlevel.wait_readable(listener)
                try:
                    sock, _ = listener.accept()
                except BlockingIOError:
                    continue
                except OSError as exc:
                    if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                        log.error("accept failed (%s); pausing", exc)
                        await trio.sleep(0.1)
                        continue
                    raise
                uid = self._peer_allowed(sock, nursery)
                if uid is None:
                    continue
                sock.setblocking(False)
                if self.io_layer is not None:
                    self._connections.add(self.io_layer.add(sock, uid))
                    self.stats.connections_total += 1
                    self.stats.connections_open += 1

    def _peer_allowed(self, sock: stdlib_socket.socket, nursery: trio.Nursery) -> int | None:
        """Let in the daemon's own uid and Config.allowed_uids; refuse anyone else (SO_PEERCRED).

        A refused peer gets one JSON error line and the connection closes. The contract has no
        "permission" kind; the closest is `invalid_request` (-32600): the connection as a whole is
        not a request this daemon takes. sys.stats counts refusals under access.refused. So that a
        client which sends its request before reading gets the line rather than a broken pipe, what
        it sends is read and dropped for up to REFUSAL_LINGER seconds before the close (at most
        MAX_LINGERING such connections at once; past that they close at once).
        """
        try:
            pid, uid, gid = struct.unpack("3i", sock.getsockopt(stdlib_socket.SOL_SOCKET, stdlib_socket.SO_PEERCRED, struct.calcsize("3i")))
        except OSError as exc:
            log.warning("refused a connection whose peer cannot be identified: %s", exc)
            uid = pid = -1
        if uid == os.getuid() or uid in self.config.allowed_uids:
            result: int | None = uid
            return result
        self.refused_peers += 1
        log.warning("refused a connection from uid %d (pid %d): not this daemon's uid nor in allowed_uids", uid, pid)
        error = ProtocolError("invalid_request", f"uid {uid} is not allowed")
        try:
            sock.send(frame_ndjson(msgspec.json.encode(failure(None, error))), stdlib_socket.MSG_DONTWAIT | stdlib_socket.MSG_NOSIGNAL)
            sock.shutdown(stdlib_socket.SHUT_WR)
        except OSError:
            sock.close()
            return None
        if self._lingering >= MAX_LINGERING:
            sock.close()
        else:
            sock.setblocking(False)
            self._lingering += 1
            nursery.start_soon(self._drop_and_close, trio.socket.from_stdlib_socket(sock))
        return None

    async def _drop_and_close(self, sock: Any) -> None:
        try:
            with trio.move_on_after(REFUSAL_LINGER):
                dropped = 0
                while dropped < 64 * 1024:
                    data = await sock.recv(16 * 1024)
                    if not data:
                        break
                    dropped += len(data)
        except OSError as exc:  # the refused peer went away first: nothing more to tell it
            log.debug("refused peer closed early: %s", exc)
        finally:
            self._lingering -= 1
            sock.close()

    async def _recover(self, embedder: Any) -> Recovered:
        """recover() in a worker thread; meanwhile systemd hears progress and grants more start-up time."""
        progress = systemd.Progress("loading snapshots")
        self.systemd.notify("STATUS=recovering: loading snapshots and replaying the journal", f"EXTEND_TIMEOUT_USEC={systemd.RECOVERY_EXTEND_USEC}")
        async with trio.open_nursery() as nursery:
            if self.systemd.enabled:
                nursery.start_soon(systemd.report_recovery, self.systemd, progress)
            result = await outcome.acapture(
                trio.to_thread.run_sync, recover, self.paths, self.fs, embedder, progress.set, self.redactor
            )
            nursery.cancel_scope.cancel()
        return result.unwrap()

    async def _listener(self) -> tuple[stdlib_socket.socket, bool]:
        """The socket passed by socket activation (used as is; the first if several), else our own."""
        try:
            passed = systemd.listen_fds()
        except ValueError as exc:
            raise StartupError(str(exc)) from None
        if not passed:
            return await open_listener(self.config.socket_path, socket_access(self.config)), False
        listener, extra = passed[0], passed[1:]
        if extra:
            log.warning("socket activation passed %d sockets; using the first (fd %d), closing the rest", len(passed), listener.fileno())
            for sock in extra:
                sock.close()
        problem = systemd.describe_listener(listener)
        if problem:
            listener.close()
            raise StartupError(f"cannot serve on the socket passed by systemd: {problem}")
        name = listener.getsockname()
        if name and isinstance(name, str) and name != str(self.config.socket_path):
            log.info("socket activation: serving on %s (not %s)", name, self.config.socket_path)
            self.config.socket_path = Path(name)
        listener.setblocking(False)
        return listener, True

    async def _feed_watchdog(self, scope: trio.CancelScope) -> None:
        with scope:
            await systemd.feed_watchdog(self.systemd, self._heartbeat)

    async def _heartbeat(self, timeout: float) -> list[str]:
        """The names of the tier actors that did not answer within `timeout` (each runs a no-op between batches)."""
        missing = set(self.actors)

        async def beat(name: str, actor: TierActor) -> None:
            try:
                await actor.run_internal(lambda state: None)
            except Exception as exc:  # closed at shutdown, or failing: not an answer
                log.debug("heartbeat to %s failed: %s", name, exc)
                return
            missing.discard(name)

        with trio.move_on_after(timeout):
            async with trio.open_nursery() as nursery:
                for name, actor in self.actors.items():
                    nursery.start_soon(beat, name, actor)
        # an actor inside one long batch (a large memory.add_many embedding in its thread) is busy,
        # not stuck, for up to BUSY_LIMIT seconds
        now = trio.current_time()
        stuck = []
        for name in missing:
            busy_since = self.actors[name].busy_since
            if busy_since is None or now - busy_since > BUSY_LIMIT:
                stuck.append(name)
        return sorted(stuck)

    async def _run_io(self, layer: IOLayer, scope: trio.CancelScope) -> None:
        with scope:
            await layer.run()

    def _closed(self, conn: BulkConnection) -> None:
        self._connections.discard(conn)
        self.stats.connections_open -= 1
        self._connection_closed.set()

    # --- routing ------------------------------------------------------------------------------------

    def dispatch(self, call: Call, reply: Any, started_ns: int) -> None:
        if call.spec.name in self._intercepted:  # the one choke point: nothing below sees the text unredacted
            self._intercept(call, reply)
        tier = call.spec.tier
        if call.spec.name == "memory.list" and call.params.readable:  # reads the conversation tier too
            self._system.start_soon(self._answer_readable, call, reply, started_ns)
            return
        if tier != "sys":
            actor = self.actors[tier]
            if actor.can_inline(call):  # a read (or tier 1) while the actor owes nothing: answer it here
                reply.deliver(call, actor.handle_inline(call, started_ns), started_ns)
            else:
                actor.submit(Work(call, reply, started_ns))
            return
        HANDLERS[call.spec.name].fn(self, call, reply, started_ns)

    def _intercept(self, call: Call, reply: Any) -> None:
        """Before a write reaches its tier: its free text redacted (daemon/redact.py) and, for the
        review methods, who asked stamped in as the kernel reports it (a peer_uid sent is replaced)."""
        self.redactor.call(call)
        if call.spec.name in PEER_STAMPED:
            call.params = msgspec.structs.replace(call.params, peer_uid=getattr(reply, "peer_uid", None))

    # --- sys.* (registered in daemon/tier.py's HANDLERS like every tier's handlers) -------------------

    @handles("sys.ping", "sys")
    def _sys_ping(self, call: Call, reply: Any, started_ns: int) -> None:
        reply.deliver(call, {"pong": True}, started_ns)

    @handles("sys.hello", "sys")
    def _sys_hello(self, call: Call, reply: Any, started_ns: int) -> None:
        reply.deliver(call, self.hello(), started_ns)

    @handles("sys.stats", "sys")
    def _sys_stats(self, call: Call, reply: Any, started_ns: int) -> None:
        reply.deliver(call, self.statistics(), started_ns)

    @handles("sys.snapshot", "sys")
    def _sys_snapshot(self, call: Call, reply: Any, started_ns: int) -> None:
        self._system.start_soon(self._answer_snapshot, call, reply, started_ns)

    @handles("sys.resume", "sys")
    def _sys_resume(self, call: Call, reply: Any, started_ns: int) -> None:
        self._system.start_soon(self._answer_resume, call, reply, started_ns)

    @handles("sys.maintain", "sys")
    def _sys_maintain(self, call: Call, reply: Any, started_ns: int) -> None:
        self._system.start_soon(self._answer_maintain, call, reply, started_ns)

    async def _group_summaries(self, slugs: list[str]) -> dict[str, str]:
        """The conversation tier's summary of each group whose domain slug is in `slugs` (a domain
        that is a conversation group), read through its actor, for the memory actor's MEMORY.md."""
        wanted = set(slugs)

        def read(state: Any) -> dict[str, str]:
            return {g.slug: g.summary.summary for g in state.groups.values() if g.slug in wanted and g.summary.summary}

        result: dict[str, str] = await self.conversation_actor.run_internal(read)
        return result

    async def _answer_readable(self, call: Call, reply: Any, started_ns: int) -> None:
        """memory.list with `readable: true`: the page and the projection's text (MemoryActor.list_readable)."""
        try:
            result: Any = await self.memory_actor.list_readable(call.params)
        except ProtocolError as exc:
            result = exc
        except Exception as exc:
            result = _internal("memory.list", exc)
        reply.deliver(call, result, started_ns)
        reply.flush()

    async def _group_summaries_full(self, slugs: list[str]) -> dict[str, GroupSummary]:
        """The summary and intents of each conversation group whose domain slug is in `slugs`, read
        through the conversation actor (memory.inject's include_summary)."""
        wanted = set(slugs)

        def read(state: Any) -> dict[str, GroupSummary]:
            return {
                g.slug: GroupSummary(g.summary.summary, list(g.summary.intents))
                for g in state.groups.values()
                if g.slug in wanted and (g.summary.summary or g.summary.intents)
            }

        result: dict[str, GroupSummary] = await self.conversation_actor.run_internal(read)
        return result

    async def _conversation_schedule(self, scope: trio.CancelScope) -> None:
        """The periodic conversation extraction (daemon/jobs/conversation.py), until shutdown."""
        with scope:
            await self.conversation_trigger.periodic(
                self.config.conversation_extract_interval, self.config.conversation_extract_min_chars
            )

    async def _answer_maintain(self, call: Call, reply: Any, started_ns: int) -> None:
        """sys.maintain: {"job_id"} of the memory.maintain job queued now (journaled before the
        answer), or of the one queued or running already; its report is that job's result."""
        assert self.maintenance is not None  # made before the listener opens
        try:
            result: Any = {"job_id": await self.maintenance.request("sys.maintain")}
        except JournalUnavailable as exc:
            result = ProtocolError("read_only", f"read-only: {exc}")
        except Exception as exc:
            result = _internal("sys.maintain", exc)
        reply.deliver(call, result, started_ns)
        reply.flush()

    async def _maintenance_schedule(self, scope: trio.CancelScope) -> None:
        """The nightly schedule (daemon/memory/maintenance.py: schedule), until shutdown."""
        with scope:
            assert self.maintenance is not None  # made before the tasks start
            await schedule(self.maintenance, self.config.maintenance_at, self.config.maintenance_catchup)

    async def _answer_snapshot(self, call: Call, reply: Any, started_ns: int) -> None:
        try:
            seq = await self.snapshot(force=True)
            result: Any = {"seq": seq}
        except (OSError, JournalWriteError, JournalUnavailable) as exc:
            if isinstance(exc, OSError) and exc.errno not in DISK_ERRNOS:  # not the disk: a file in the way, say
                log.exception("snapshot failed")
                result = ProtocolError("internal", f"snapshot failed: {exc}")
            else:  # the disk is full or failing: as for a journal write
                log.error("snapshot failed (the journal still holds everything; the old snapshot files are intact): %s", exc)
                result = ProtocolError("read_only", f"read-only: the snapshot could not be written: {exc}")
        except Exception as exc:
            result = _internal("snapshot", exc)
        reply.deliver(call, result, started_ns)
        reply.flush()

    async def _answer_resume(self, call: Call, reply: Any, started_ns: int) -> None:
        try:
            result: Any = await self.resume()
        except JournalUnavailable as exc:
            result = ProtocolError("read_only", str(exc))
        except Exception as exc:
            log.exception("sys.resume failed")
            result = ProtocolError("internal", f"sys.resume failed: {exc}")
        reply.deliver(call, result, started_ns)
        reply.flush()

    async def resume(self) -> dict[str, Any]:
        """sys.resume: leave read-only mode if the journal can be written again (JournalUnavailable if not).

        Under fsync=batch/off, records acknowledged before the failure but cut from the journal
        (written after its last sync) are made durable by a snapshot before any write is let in."""
        async with self._resume_lock:
            journal_actor = self.journal_actor
            if not journal_actor.failed:
                return {"resumed": False, "read_only": False, "jobs": self._nudge_jobs()}
            was, since = journal_actor.failed, journal_actor.failed_at
            cut = await journal_actor.resume_journal()
            facts = journal_actor.facts  # as the writer thread published them after the resume
            unsynced_acked = journal_actor.acked_seq - facts.last_seq
            note: dict[str, Any] = {"cut_records": cut, "segment": facts.current_segment}
            if unsynced_acked > 0:
                try:
                    note["snapshot_seq"] = await self.snapshot(force=True)
                except Exception as exc:
                    log.exception("sys.resume: the snapshot covering %d acknowledged records failed", unsynced_acked)
                    raise JournalUnavailable(
                        f"still read-only: the journal is writable again, but the snapshot that must first cover "
                        f"{unsynced_acked} records acknowledged before its last sync (fsync={journal_actor.fsync}) failed: {exc}"
                    ) from exc
            journal_actor.clear_failure(note)
            jobs = self._nudge_jobs()
            return {"resumed": True, "read_only": False, "was": was, "failed_at": since, **note, "jobs": jobs}

    def _nudge_jobs(self) -> dict[str, Any]:
        """sys.resume for the job queue: the LLM resolved again from the configuration and the
        environment, back-offs forgotten, queued jobs started now if they can be."""
        jobs = self.jobs_actor
        try:
            llm = self.llm_factory()
        except LLMConfigError as exc:
            log.error("sys.resume: the LLM configuration cannot be used (%s); keeping the current one", exc)
            llm = None
        jobs.nudge(llm)
        return {"queued": jobs.stats()["queued"], "llm": jobs.llm_status()}

    def hello(self) -> dict[str, Any]:
        return {
            "server": "eurekamem",
            "version": VERSION,
            "protocol": PROTOCOL_VERSION,
            "methods": sorted(METHODS),
            "limits": {
                "max_frame_bytes": self.limits.max_frame_bytes,
                "max_inflight": self.limits.max_inflight,
                "max_requests_per_second": self.limits.max_requests_per_second,
                "request_burst": self.limits.burst if self.limits.max_requests_per_second > 0 else 0,
                "max_id_chars": limits_module.MAX_ID,
                "max_key_chars": limits_module.MAX_KEY,
                "max_text_chars": limits_module.MAX_TEXT,
                "max_tags": limits_module.MAX_TAGS,
            },
        }

    def statistics(self) -> dict[str, Any]:
        """sys.stats: only what the actors published (no actor's state is read here), so it is
        cheap at any size and safe while their worker threads run."""
        tiers = {name: actor.stats() for name, actor in self.actors.items()}
        return {
            "version": VERSION,
            "pid": os.getpid(),
            "started_at": self.started_at,
            "data_dir": str(self.paths.root),
            "socket": str(self.config.socket_path),
            "read_only": bool(self.journal_actor.failed),
            "tiers": tiers,
            "journal": self.journal_actor.statistics(),
            "memory": {
                **self.memory_actor.statistics(),
                "embedding": self.embedding.summary(trio.current_time()),
                "maintenance": self.maintenance.statistics() if self.maintenance is not None else None,
            },
            "skills": self.skills_actor.statistics(),
            "conversation": self.conversation_actor.statistics(),
            "jobs": {**self.jobs_actor.statistics(), "conversation": self.conversation_trigger.statistics()},
            "snapshot": {"seq": self._snapshot_seq},
            "recovery": self.recovery,
            "requests": self.stats.summary(),
            "io": self.io_statistics(),
            "access": {"refused": self.refused_peers, "allowed_uids": list(self.config.allowed_uids)},
            "redaction": self.redactor.statistics(),
        }

    def io_statistics(self) -> dict[str, Any]:
        """The I/O layer's passes: how many found work, how many ready sockets (and wakers) they
        handled (events per pass: the requests one wake-up serves), and the looks after a pass that
        went on looking (IOLayer._spin) and found something. `mode` is always "bulk" (the one layer)."""
        layer = self.io_layer
        if layer is None:
            return {"mode": "bulk"}
        return {
            "mode": "bulk",
            "passes": layer.passes,
            "events": layer.events,
            "spins": layer.spins,
            "spin_hits": layer.spin_hits,
        }

    # --- snapshots ----------------------------------------------------------------------------------

    def _snapshot_after_purge(self) -> None:
        self._purged.set()

    async def snapshot(self, force: bool = False) -> int:
        """Write persistent.json, knowledge_graph.json and the checkpoint; returns the covered seq.

        Every file is written to a temporary name and renamed only once complete and synced (the
        vector files too, see VectorStore.save), so a failure (a full disk) leaves the previous
        snapshot's files as they were; the journal segments go only after everything is durable."""
        async with self._snapshot_lock:
            self._purged = trio.Event()  # this snapshot covers every purge answered so far
            journal_actor = self.journal_actor
            if not force and journal_actor.acked_seq == self._snapshot_seq:
                return self._snapshot_seq
            began = trio.current_time()
            rotated = not journal_actor.facts.failed  # the journal file takes writes (again, during sys.resume)
            if rotated:
                start = await journal_actor.run_exclusive(lambda journal: journal.rotate())
            else:
                start = journal_actor.acked_seq + 1
            covered = start - 1
            memory_actor = self.memory_actor
            await memory_actor.run_internal(
                lambda s: memory_actor.save_snapshot(s, self.paths.memory_snapshot, self.paths.vectors)
            )
            await memory_actor.project_files(durable=True)  # the .md files and _index.json are current and durable too
            await self.skills_actor.project_files(durable=True)  # the SKILL.md files are the skills' snapshot
            await self.conversation_actor.save_snapshot(self.paths.conversation_snapshot, self.paths.conversation_vectors)
            records = await self.actors["persistent"].run_internal(lambda s: dict(s.records))
            nodes, edges = await self.actors["graph"].run_internal(lambda s: (dict(s.nodes), dict(s.edges)))
            jobs = await self.jobs_actor.run_internal(jobs_snapshot_of)
            covers = covered if rotated else None
            await trio.to_thread.run_sync(self._write_snapshot, records, nodes, edges, jobs, covers)
            if rotated:
                dropped = await journal_actor.run_exclusive(lambda journal: journal.drop_before(start))
                if dropped:
                    log.debug("dropped journal segments %s", dropped)
            self._snapshot_seq = covered
            log.info("snapshot: covers journal seq %d (%.0f ms)", covered, (trio.current_time() - began) * 1000)
            result: int = covered
            return result

    def _write_snapshot(
        self, records: dict[str, Any], nodes: dict[str, Any], edges: dict[Any, Any], jobs: bytes, covered: int | None
    ) -> None:
        fs = RealFiles()
        self.paths.memory.mkdir(parents=True, exist_ok=True)
        # EurekaClaw's two files are rewritten only when their content changed (EurekaClaw reads them)
        write_unless_same(fs, str(self.paths.persistent), eurekaclaw.write_persistent(records))
        write_unless_same(fs, str(self.paths.graph), eurekaclaw.write_graph(nodes, edges))
        atomic_write(fs, str(self.paths.jobs_snapshot), jobs)
        if covered is not None:
            files = ["persistent.json", "knowledge_graph.json", "jobs.snapshot"]
            doc = {"seq": covered, "written_at": now_rfc3339(), "files": files}
            atomic_write(fs, str(self.paths.checkpoint), json.dumps(doc).encode())

    async def _memory_background(self, scope: trio.CancelScope) -> None:
        """Write changed memory files about every second; embed memories that lack a vector, logging
        the progress (counts, rate, time left) every EMBED_LOG_EVERY seconds. At shutdown this scope
        is cancelled first; an embedding batch under way is abandoned (its thread's result dropped:
        the memories stay unembedded and are embedded again after the restart)."""
        with scope:
            memory_actor = self.memory_actor
            progress = self.embedding
            try:
                renamed = await memory_actor.run_internal(lambda state: state.separate_shared_files())
                if renamed:
                    log.warning("tier 4: %d memories shared a file with another; each has its own now", len(renamed))
            except Exception:
                log.exception("tier 4: could not separate memories that share a file; will try at the next start")
            while True:
                await trio.sleep(self.config.projection_interval)
                try:
                    await memory_actor.project_files()
                    while True:
                        pending = memory_actor.stats().get("unembedded", 0)
                        if pending and not progress.running:
                            progress.begin(trio.current_time(), pending)
                            log.info("tier 4: embedding %d memories in the background with %s", pending, memory_actor.model)
                        done = await memory_actor.reembed_some(progress.batch())
                        if not done:
                            break
                        now = trio.current_time()
                        progress.add(now, done, memory_actor.stats().get("unembedded", 0))
                        if progress.due(now):
                            log.info("tier 4: %s", progress.describe(now, memory_actor.model))
                        await memory_actor.project_files()
                    if progress.running and not memory_actor.stats().get("unembedded", 0):
                        log.info("tier 4: %s", progress.finish(trio.current_time(), memory_actor.model))
                except trio.ClosedResourceError:
                    return  # the actors closed: the daemon is stopping
                except Exception:
                    log.exception("memory background work failed; will try again")

    async def _watch_files(self, scope: trio.CancelScope) -> None:
        """Scan memories/ every watch_interval seconds (or more: SCAN_FACTOR) for files other
        programs wrote, changed or removed (daemon/memory/watch.py); the first scan at once, before
        the first projection, so that the projection never overwrites a file edited while the
        daemon was down."""
        interval = self.config.watch_interval
        if not interval:
            return
        memory_actor = self.memory_actor
        memory_actor.watching = True
        memory_actor.watch_full_interval = self.config.watch_full_interval
        skills_actor = self.skills_actor  # skills/ likewise (daemon/skills/watch.py)
        skills_actor.watching = True
        skills_actor.watch_full_interval = self.config.watch_full_interval
        with scope:
            while True:
                try:
                    await memory_actor.scan_files()
                except trio.ClosedResourceError:
                    return  # the actors closed: the daemon is stopping
                except Exception:
                    log.exception("tier 4: the scan of memories/ failed; will try again")
                finally:
                    memory_actor.first_scan.set()
                try:
                    await skills_actor.scan_files()
                except trio.ClosedResourceError:
                    return
                except Exception:
                    log.exception("skills: the scan of skills/ failed; will try again")
                await trio.sleep(max(interval, SCAN_FACTOR * memory_actor.watcher.last_stat_seconds))

    async def _snapshot_scheduler(self, scope: trio.CancelScope) -> None:
        """Snapshot after a quiet period without writes, or after snapshot_max_delay of steady writing."""
        with scope:
            await self._snapshot_loop()

    async def _snapshot_loop(self) -> None:
        """Also snapshots at once after a purge: that drops the journal segments holding the text."""
        poll = min(1.0, self.config.snapshot_quiet)
        last_seen = self.journal_actor.acked_seq
        quiet_for = 0.0
        dirty_for = 0.0
        while True:
            with trio.move_on_after(poll):
                await self._purged.wait()
            if self._purged.is_set():
                try:
                    await self.snapshot()
                except Exception:
                    log.exception("the snapshot after a purge failed; will try again")
                    await trio.sleep(poll)
                quiet_for = dirty_for = 0.0
                continue
            seq = self.journal_actor.acked_seq
            if seq == self._snapshot_seq:
                quiet_for = dirty_for = 0.0
                last_seen = seq
                continue
            dirty_for += poll
            quiet_for = quiet_for + poll if seq == last_seen else 0.0
            last_seen = seq
            if quiet_for >= self.config.snapshot_quiet or dirty_for >= self.config.snapshot_max_delay:
                try:
                    await self.snapshot()
                except Exception:
                    log.exception("scheduled snapshot failed; will try again")
                quiet_for = dirty_for = 0.0




EMBED_LOG_EVERY = 10.0  # seconds between progress lines of the background embedding
EMBED_BATCH_SECONDS = 1.0  # the background embedding's batches take about this long ...
EMBED_BATCH_MIN, EMBED_BATCH_MAX = 4, 64  # ... within these sizes


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


class EmbeddingProgress:
    """Tier 4's background embedding as counts, rate and time left; one owner: the Daemon's
    _memory_background task writes it, statistics() reads it, both on the event loop."""

    def __init__(self) -> None:
        self.running = False
        self.started = 0.0
        self.done = 0
        self.pending = 0
        self.total_done = 0  # since the daemon started, over every run
        self._last_log = 0.0
        self._last_add = 0.0

    def batch(self) -> int:
        """Memories to embed in the next batch: about EMBED_BATCH_SECONDS of work at the rate so far
        (a few at first), so progress shows soon and a stop never waits for a long batch."""
        if not self.done:
            return EMBED_BATCH_MIN
        per_memory = (self._last_add - self.started) / self.done
        return max(EMBED_BATCH_MIN, min(EMBED_BATCH_MAX, int(EMBED_BATCH_SECONDS / max(per_memory, 1e-6))))

    def begin(self, now: float, pending: int) -> None:
        self.running, self.started, self.done, self.pending, self._last_log = True, now, 0, pending, now

    def add(self, now: float, done: int, pending: int) -> None:
        self.done += done
        self.total_done += done
        self.pending = pending
        self._last_add = now

    def rate(self, now: float) -> float | None:
        elapsed = now - self.started
        return self.done / elapsed if self.done and elapsed > 0 else None

    def eta(self, now: float) -> float | None:
        rate = self.rate(now)
        return self.pending / rate if rate else None

    def due(self, now: float) -> bool:
        if now - self._last_log >= EMBED_LOG_EVERY:
            self._last_log = now
            return True
        return False

    def describe(self, now: float, model: str) -> str:
        total = self.done + self.pending
        text = f"embedded {self.done:,} of {total:,} memories with {model} ({100 * self.done / max(total, 1):.0f} %)"
        rate, eta = self.rate(now), self.eta(now)
        if rate:
            text += f", {rate:.1f}/s"
        if eta is not None:
            text += f", about {_duration(eta)} left"
        return text

    def finish(self, now: float, model: str) -> str:
        self.running = False
        self.pending = 0
        return f"background embedding done: {self.done:,} memories with {model} in {_duration(now - self.started)}"

    def summary(self, now: float) -> dict[str, Any]:
        """sys.stats → memory.embedding: this run's `done` and `pending`, `per_second`, `eta_seconds`
        (null when not known), `running`, and `embedded_since_start` over every run."""
        rate, eta = (self.rate(now), self.eta(now)) if self.running else (None, None)
        return {
            "running": self.running,
            "done": self.done if self.running else 0,
            "pending": self.pending if self.running else 0,
            "per_second": round(rate, 2) if rate else None,
            "eta_seconds": round(eta, 1) if eta is not None else None,
            "embedded_since_start": self.total_done,
        }


def startup_line(config: Config) -> str:
    """The first log line: versions, the data root, the socket, the model, the durability."""
    import platform
    import sys as _sys

    versions = [f"Python {platform.python_version()}", f"trio {trio.__version__}", f"msgspec {msgspec.__version__}"]
    try:
        import numpy

        versions.append(f"numpy {numpy.__version__}")
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    return (
        f"eurekamem {VERSION} starting ({', '.join(versions)}; {_sys.prefix}): data root {config.data_dir}, "
        f"socket {config.socket_path}, embedding model {config.embedder}, fsync {config.fsync}"
    )


def recovery_line(recovery: dict[str, Any]) -> str:
    """What recovery found, in words: the checkpoint, the records replayed, what was imported."""
    imported = {name: n for name, n in (recovery.get("imported") or {}).items() if n}
    text = (
        f"recovered in {recovery['seconds']:.2f} s: snapshot covers journal seq {recovery['checkpoint_seq']}, "
        f"replayed {recovery['replayed']:,} journal records"
    )
    if imported:
        text += "; imported from EurekaClaw's files: " + ", ".join(f"{n:,} {name}" for name, n in imported.items())
    if recovery.get("interrupted_jobs"):
        text += f"; {recovery['interrupted_jobs']:,} interrupted jobs queued again"
    return text


def _load_and_log(embedder: Any) -> None:
    """preload_embedder in its thread, then one line naming the model, its dimension and the load time."""
    import time

    began = time.monotonic()
    preload_embedder(embedder)
    if getattr(embedder, "loaded", False):
        log.info(
            "embedding model %s loaded (%s dimensions) in %.1f s",
            embedder.name, getattr(embedder, "dim", "?"), time.monotonic() - began,
        )

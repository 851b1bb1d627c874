"""The `sys.*` methods: ping, hello, stats, snapshot, resume, maintain; and skills.scan, which
waits for a scan of skills/ as they wait.

Rule kept here: sys.stats reads only what the actors publish (`TierActor.stats()`,
`MemoryActor.statistics()`, `JournalActor.statistics()` and `.facts`), never a tier's state, so it
is cheap at any size and safe while their worker threads run. A call that waits (snapshot, resume,
maintain) is answered by a task of its own in the daemon's nursery, never by the connection's pass.
sys.resume lets writes in again only once the journal takes them, and, under fsync=batch/off, only
after a snapshot covers what was acknowledged but cut from the journal.

The handlers are registered in daemon/tier.py's HANDLERS like every tier's; `Daemon.dispatch` calls
them with the SysCalls it built once recovery was done.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from ..protocol import METHODS, PROTOCOL_VERSION, Call, ProtocolError
from ..protocol import methods as limits_module
from .accept import Acceptor
from .config import Config
from .conversation.actor import ConversationActor
from .jobs import JobsActor, LLMHandle
from .llm import LLMConfigError
from .memory.actor import MemoryActor
from .paths import Paths
from .redact import Redactor
from .server import Limits
from .skills.actor import SkillsActor
from .snapshots import DISK_ERRNOS, Snapshots
from .stats import VERSION, RequestStats
from .storage.journal import JournalWriteError
from .storage.journal_actor import JournalActor, JournalUnavailable
from .tier import Reply, TierActor, handles

log = logging.getLogger("eurekamem")


def internal_error(what: str, exc: Exception) -> ProtocolError:
    """The answer to a call that failed in an unexpected way (logged with its traceback)."""
    log.exception("%s failed", what)
    return ProtocolError("internal", f"{what} failed: {exc}")


class SysCalls:
    """The daemon's own methods, over the actors and the parts a running daemon is made of.

    The durable tiers' parts come later than the rest (`serve_durable`) where the store was not
    there at start (PostgreSQL): meanwhile ping, hello and stats answer and the calls that need
    them answer `unavailable` with the reason."""

    memory: MemoryActor
    skills: SkillsActor
    conversation: ConversationActor
    jobs: JobsActor
    snapshots: Snapshots

    def __init__(
        self,
        config: Config,
        paths: Paths,
        *,
        limits: Limits,
        stats: RequestStats,
        started_at: str,
        recovery: dict[str, Any],
        actors: Mapping[str, TierActor],
        journal_actor: JournalActor,
        store: Any,
        acceptor: Acceptor,
        redactor: Redactor,
        llm_factory: Callable[[], LLMHandle],
        nursery: trio.Nursery,
        not_serving: Callable[[], ProtocolError],
    ) -> None:
        self.config = config
        self.paths = paths
        self.limits = limits
        self.stats = stats
        self.started_at = started_at
        self.recovery = recovery
        self.actors = actors
        self.journal_actor = journal_actor
        self.store = store  # the tiers' Store (daemon/storage/store.py): the journal actor, or PostgreSQL
        self.serving = False  # the durable tiers' parts are here (serve_durable)
        self.not_serving = not_serving  # what a call that needs them answers before
        self.acceptor = acceptor
        self.redactor = redactor
        self.llm_factory = llm_factory
        self.nursery = nursery  # the daemon's: where the calls that wait are answered
        self._resume_lock = trio.Lock()

    def serve_durable(
        self,
        *,
        memory: MemoryActor,
        skills: SkillsActor,
        conversation: ConversationActor,
        jobs: JobsActor,
        snapshots: Snapshots,
    ) -> None:
        """The durable tiers' parts, once they are loaded (at start, or once PostgreSQL is reached)."""
        self.memory = memory
        self.skills = skills
        self.conversation = conversation
        self.jobs = jobs
        self.snapshots = snapshots
        self.serving = True

    def _refused(self, call: Call, reply: Reply, started_ns: int) -> bool:
        """Before the durable tiers serve, a call that needs them is answered `not_serving` (True)."""
        if self.serving:
            return False
        reply.deliver(call, self.not_serving(), started_ns)
        return True

    # --- the handlers ---------------------------------------------------------------------------------

    @handles("sys.ping", "sys")
    def _sys_ping(self, call: Call, reply: Reply, started_ns: int) -> None:
        reply.deliver(call, {"pong": True}, started_ns)

    @handles("sys.hello", "sys")
    def _sys_hello(self, call: Call, reply: Reply, started_ns: int) -> None:
        reply.deliver(call, self.hello(), started_ns)

    @handles("sys.stats", "sys")
    def _sys_stats(self, call: Call, reply: Reply, started_ns: int) -> None:
        reply.deliver(call, self.statistics(), started_ns)

    @handles("sys.digest", "sys")
    def _sys_digest(self, call: Call, reply: Reply, started_ns: int) -> None:
        if not self._refused(call, reply, started_ns):
            self.nursery.start_soon(self._answer_awaited, call, reply, started_ns, self.digest)

    async def digest(self) -> dict[str, Any]:
        """sys.digest: each durable tier's kinds of record, counted and checksummed by its own actor
        (daemon/postgres/migrate.py's checksums, so a view compares with the tables loaded afresh);
        under PostgreSQL with the feed's seq applied when asked."""
        from .postgres.migrate import CHECKSUM_TIERS, tier_checksums

        feed = getattr(self.store, "feed", None)
        applied = feed.applied if feed is not None else None
        kinds: dict[str, Any] = {}
        for tier in CHECKSUM_TIERS:
            found: dict[str, tuple[int, str]] = await self.actors[tier].run_internal(functools.partial(tier_checksums, tier))
            kinds.update({kind: {"count": count, "sha256": digest} for kind, (count, digest) in found.items()})
        return {"kinds": kinds, "applied_seq": applied}

    @handles("sys.snapshot", "sys")
    def _sys_snapshot(self, call: Call, reply: Reply, started_ns: int) -> None:
        if not self._refused(call, reply, started_ns):
            self.nursery.start_soon(self._answer_snapshot, call, reply, started_ns)

    @handles("sys.resume", "sys")
    def _sys_resume(self, call: Call, reply: Reply, started_ns: int) -> None:
        if not self._refused(call, reply, started_ns):
            self.nursery.start_soon(self._answer_resume, call, reply, started_ns)

    @handles("sys.maintain", "sys")
    def _sys_maintain(self, call: Call, reply: Reply, started_ns: int) -> None:
        if not self._refused(call, reply, started_ns):
            self.nursery.start_soon(self._answer_maintain, call, reply, started_ns)

    @handles("skills.scan", "sys")
    def _skills_scan(self, call: Call, reply: Reply, started_ns: int) -> None:
        if not self._refused(call, reply, started_ns):
            self.nursery.start_soon(self._answer_skills_scan, call, reply, started_ns)

    # --- the calls that wait ------------------------------------------------------------------------

    async def _answer_snapshot(self, call: Call, reply: Reply, started_ns: int) -> None:
        try:
            seq = await self.snapshots.snapshot(force=True)
            result: Any = {"seq": seq}
        except (OSError, JournalWriteError, JournalUnavailable) as exc:
            if isinstance(exc, OSError) and exc.errno not in DISK_ERRNOS:  # not the disk: a file in the way, say
                log.exception("snapshot failed")
                result = ProtocolError("internal", f"snapshot failed: {exc}")
            else:  # the disk is full or failing: as for a journal write
                log.error("snapshot failed (the journal still holds everything; the old snapshot files are intact): %s", exc)
                result = ProtocolError("read_only", f"read-only: the snapshot could not be written: {exc}")
        except Exception as exc:
            result = internal_error("snapshot", exc)
        reply.deliver(call, result, started_ns)
        reply.flush()

    async def _answer_resume(self, call: Call, reply: Reply, started_ns: int) -> None:
        try:
            result: Any = await self.resume()
        except JournalUnavailable as exc:
            result = ProtocolError("read_only", str(exc))
        except Exception as exc:
            log.exception("sys.resume failed")
            result = ProtocolError("internal", f"sys.resume failed: {exc}")
        reply.deliver(call, result, started_ns)
        reply.flush()

    async def _answer_maintain(self, call: Call, reply: Reply, started_ns: int) -> None:
        """sys.maintain: {"job_id"} of the memory.maintain job queued now (journaled before the
        answer), or of the one queued or running already; its report is that job's result."""

        async def queue() -> Any:
            maintenance = self.memory.maintenance
            if maintenance is None:  # a memory actor made without the job queue (never the daemon's)
                raise ProtocolError("unavailable", "tier 4's maintenance is not running in this daemon")
            return {"job_id": await maintenance.request("sys.maintain")}

        await self._answer_awaited(call, reply, started_ns, queue)

    async def _answer_skills_scan(self, call: Call, reply: Reply, started_ns: int) -> None:
        """skills.scan: one full scan of skills/ now (every SKILL.md stat-ed: an edit in place is
        seen too), as EurekaClaw's SkillRegistry reads the whole folder on load and after
        reload(); the routed registry asks for this first. The counts of what it found;
        `unavailable` when skills/ is not watched (watch_interval 0)."""

        async def scan() -> Any:
            if not self.skills.watching:
                raise ProtocolError("unavailable", "skills/ is not watched by this daemon (watch_interval is 0)")
            return await self.skills.scan_files(full=True)

        await self._answer_awaited(call, reply, started_ns, scan)

    async def _answer_awaited(
        self, call: Call, reply: Reply, started_ns: int, work: Callable[[], Awaitable[Any]]
    ) -> None:
        """Answer `call` with what `work` returns once it is done: a ProtocolError as itself, a
        journal that cannot be written as `read_only`, anything else as `internal` (logged)."""
        try:
            result: Any = await work()
        except ProtocolError as exc:
            result = exc
        except JournalUnavailable as exc:
            result = ProtocolError("read_only", f"read-only: {exc}")
        except Exception as exc:
            result = internal_error(call.spec.name, exc)
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
                    note["snapshot_seq"] = await self.snapshots.snapshot(force=True)
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
        jobs = self.jobs
        try:
            llm: LLMHandle | None = self.llm_factory()
        except LLMConfigError as exc:
            log.error("sys.resume: the LLM configuration cannot be used (%s); keeping the current one", exc)
            llm = None
        jobs.nudge(llm)
        return {"queued": jobs.stats()["queued"], "llm": jobs.llm_status()}

    # --- the answers ---------------------------------------------------------------------------------

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
        """sys.stats: only what the actors published (the module's rule). Before the durable tiers
        serve, their sections are absent and `store.serving` is false, with the reason."""
        tiers = {name: actor.stats() for name, actor in self.actors.items()}
        store = self.store.statistics() if self.store is not self.journal_actor else {"store": "journal"}
        answer: dict[str, Any] = {
            "version": VERSION,
            "pid": os.getpid(),
            "started_at": self.started_at,
            "data_dir": str(self.paths.root),
            "socket": str(self.config.socket_path),
            "read_only": bool(self.journal_actor.failed),
            "tiers": tiers,
            "journal": self.journal_actor.statistics(),
            "store": {**store, "serving": self.serving},
            "recovery": self.recovery,
            "requests": self.stats.summary(),
            "io": self.io_statistics(),
            "access": {"refused": self.acceptor.refused_peers, "allowed_uids": list(self.config.allowed_uids)},
            "redaction": self.redactor.statistics(),
        }
        if not self.serving:
            answer["store"]["reason"] = self.not_serving().data.get("reason")
            return answer
        memory = self.memory
        answer.update({
            "memory": {
                **memory.statistics(),
                "embedding": memory.embedding.summary(trio.current_time()),
                "maintenance": memory.maintenance.statistics() if memory.maintenance is not None else None,
            },
            "skills": self.skills.statistics(),
            "conversation": self.conversation.statistics(),
            "jobs": {**self.jobs.statistics(), "conversation": self.conversation.trigger_statistics()},
            "snapshot": {"seq": self.snapshots.seq, **self.snapshots.statistics()},
        })
        return answer

    def io_statistics(self) -> dict[str, Any]:
        """The I/O layer's passes: how many found work, how many ready sockets (and wakers) they
        handled (events per pass: the requests one wake-up serves), and the looks after a pass that
        went on looking (IOLayer._spin) and found something. `mode` is always "bulk" (the one layer)."""
        layer = self.acceptor.io_layer
        if layer is None:
            return {"mode": "bulk"}
        return {
            "mode": "bulk",
            "passes": layer.passes,
            "events": layer.events,
            "spins": layer.spins,
            "spin_hits": layer.spin_hits,
        }

"""Snapshots: every tier's files and the checkpoint that lets the journal's older segments go.

Rule kept here: a snapshot is written only from copies the tier actors hand over between batches
(`run_internal`), after the journal has rotated; every file is written to a temporary name and
renamed only once complete and synced (the vector files too, see VectorStore.save), so a failure
(a full disk) leaves the previous snapshot's files as they were; and journal segments are dropped
only after the snapshot files and the checkpoint that covers them are durable. One snapshot at a
time (the lock). A purge snapshots at once: that drops the journal segments that held its text.
Under PostgreSQL (`local_store`) the database holds everything: a snapshot writes only what local
readers read (EurekaClaw's two files, `memories/` and MEMORY.md, `skills/`), scheduled by its commits,
and, when due, tier 4's index snapshot into the database (daemon/postgres/snapshots.py's DatabaseSnapshots).

Ownership: the Snapshots' seq and purge signal are trio's (the scheduler, sys.snapshot,
sys.resume and shutdown all run on the event loop).
"""

from __future__ import annotations

import errno
import json
import logging
from typing import Any, Protocol

import trio

from ..protocol import now_rfc3339
from .conversation.actor import ConversationActor
from .jobs.state import snapshot_of as jobs_snapshot_of
from .memory.actor import MemoryActor
from .memory.snapshot import save_snapshot
from .paths import Paths
from .skills.actor import SkillsActor
from .storage import eurekaclaw
from .storage.files import RealFiles, atomic_write, write_unless_same
from .storage.journal_actor import JournalActor

log = logging.getLogger("eurekamem")

# a snapshot that fails with one of these answers read_only (the disk is full or failing), with
# any other OSError internal (an unexpected I/O error: a file where a folder should be, say)
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG})


class InternalCalls(Protocol):
    """What a snapshot asks of the tiers whose files it writes itself (persistent, graph, jobs)."""

    async def run_internal(self, fn: Any) -> Any: ...


class PurgeSignal:
    """Set (by tier 4's actor, on the event loop) when a batch purged a memory; the scheduler then
    snapshots at once. Made before the actors, so the memory actor gets its `set` at construction."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def clear(self) -> None:
        self._event = trio.Event()

    async def wait(self) -> None:
        await self._event.wait()


class Snapshots:
    """Writes the snapshot and schedules it: after a quiet period without writes, after
    snapshot_max_delay of steady writing, and at once after a purge."""

    def __init__(
        self,
        paths: Paths,
        journal_actor: JournalActor,
        *,
        memory: MemoryActor,
        skills: SkillsActor,
        conversation: ConversationActor,
        persistent: InternalCalls,
        graph: InternalCalls,
        jobs: InternalCalls,
        purged: PurgeSignal,
        quiet: float,
        max_delay: float,
        seq: int = -1,
        local_store: Any = None,
    ) -> None:
        self.paths = paths
        self.journal_actor = journal_actor
        self.local_store = local_store  # store = postgres: the PostgresStore (only local readers' files are written)
        self.memory = memory
        self.skills = skills
        self.conversation = conversation
        self.persistent = persistent
        self.graph = graph
        self.jobs = jobs
        self.purged = purged
        self.quiet = quiet
        self.max_delay = max_delay
        self.seq = seq  # the journal seq the files on disk cover (-1: none yet)
        self._lock = trio.Lock()
        self.database: Any = None  # store = postgres: when tier 4's index snapshot goes into the database
        if local_store is not None:
            from .postgres.snapshots import DatabaseSnapshots

            self.database = DatabaseSnapshots(local_store, memory, paths.memory / "postgres")

    def written(self) -> int:
        """How far the store's durable writes go: the journal's acknowledged seq, or under
        PostgreSQL its count of commits and of the feed's changes (what the schedule compares with `seq`)."""
        return self.journal_actor.acked_seq if self.local_store is None else int(self.local_store.changes())

    async def snapshot(self, force: bool = False) -> int:
        """Write persistent.json, knowledge_graph.json and the checkpoint; returns the covered seq.
        Under PostgreSQL (`local_store`), only the files local readers read: no memories.snapshot,
        vector files, conversation or jobs snapshot, nor checkpoint (the database holds it all)."""
        async with self._lock:
            purged = self.purged.is_set()
            self.purged.clear()  # this snapshot covers every purge answered so far
            journal_actor = self.journal_actor
            if not force and self.written() == self.seq:
                return self.seq
            began = trio.current_time()
            local_only = self.local_store is not None
            # the journal file takes writes (again, during sys.resume)
            rotated = not local_only and not journal_actor.facts.failed
            if rotated:
                start = await journal_actor.run_exclusive(lambda journal: journal.rotate())
            else:
                start = self.written() + 1
            covered = start - 1
            memory = self.memory
            if not local_only:
                await memory.run_internal(lambda s: save_snapshot(s, self.paths.memory_snapshot, self.paths.vectors))
            await memory.project_files(durable=True)  # the .md files and _index.json are current and durable too
            await self.skills.project_files(durable=True)  # the SKILL.md files are the skills' snapshot
            if not local_only:
                await self.conversation.save_snapshot(self.paths.conversation_snapshot, self.paths.conversation_vectors)
            records = await self.persistent.run_internal(lambda s: dict(s.records))
            nodes, edges = await self.graph.run_internal(lambda s: (dict(s.nodes), dict(s.edges)))
            jobs = None if local_only else await self.jobs.run_internal(jobs_snapshot_of)
            covers = covered if rotated else None
            await trio.to_thread.run_sync(self._write, records, nodes, edges, jobs, covers)
            if rotated:
                dropped = await journal_actor.run_exclusive(lambda journal: journal.drop_before(start))
                if dropped:
                    log.debug("dropped journal segments %s", dropped)
            self.seq = covered
            took = (trio.current_time() - began) * 1000
            if local_only:
                log.info("snapshot: the local files cover %d PostgreSQL commits (%.0f ms)", covered, took)
                await self._database(force, purged)
            else:
                log.info("snapshot: covers journal seq %d (%.0f ms)", covered, took)
            result: int = covered
            return result

    def _write(
        self, records: dict[str, Any], nodes: dict[str, Any], edges: dict[Any, Any], jobs: bytes | None, covered: int | None
    ) -> None:
        fs = RealFiles()
        self.paths.memory.mkdir(parents=True, exist_ok=True)
        # EurekaClaw's two files are rewritten only when their content changed (EurekaClaw reads them)
        write_unless_same(fs, str(self.paths.persistent), eurekaclaw.write_persistent(records))
        write_unless_same(fs, str(self.paths.graph), eurekaclaw.write_graph(nodes, edges))
        if jobs is not None:
            atomic_write(fs, str(self.paths.jobs_snapshot), jobs)
        if covered is not None:
            files = ["persistent.json", "knowledge_graph.json", "jobs.snapshot"]
            doc = {"seq": covered, "written_at": now_rfc3339(), "files": files}
            atomic_write(fs, str(self.paths.checkpoint), json.dumps(doc).encode())

    def statistics(self) -> dict[str, Any]:
        """sys.stats → snapshot, beside its seq: under PostgreSQL, tier 4's index snapshot (`database`)."""
        return {} if self.database is None else {"database": self.database.statistics()}

    async def _database(self, force: bool, purged: bool) -> None:
        """Tier 4's index snapshot into PostgreSQL when due: a failure there is logged, never the
        snapshot's (the database still holds every row; the next start replays more of the feed)."""
        try:
            await self.database.maybe_write(force, purged)
        except Exception:
            log.exception("PostgreSQL: tier 4's index snapshot could not be written; will try again")

    async def schedule(self, scope: trio.CancelScope) -> None:
        """Until `scope` is cancelled (shutdown, before the final snapshot)."""
        with scope:
            if self.database is not None:
                try:
                    await self.database.start()
                except Exception:
                    log.exception("PostgreSQL: the index snapshots' state could not be read")
                async with self._lock:
                    await self._database(False, False)  # owed at once when the database has none, or an old one
            await self._loop()

    async def _loop(self) -> None:
        poll = min(1.0, self.quiet)
        last_seen = self.written()
        quiet_for = 0.0
        dirty_for = 0.0
        while True:
            with trio.move_on_after(poll):
                await self.purged.wait()
            if self.purged.is_set():
                try:
                    await self.snapshot()
                except Exception:
                    log.exception("the snapshot after a purge failed; will try again")
                    await trio.sleep(poll)
                quiet_for = dirty_for = 0.0
                continue
            seq = self.written()
            if seq == self.seq:
                quiet_for = dirty_for = 0.0
                last_seen = seq
                continue
            dirty_for += poll
            quiet_for = quiet_for + poll if seq == last_seen else 0.0
            last_seen = seq
            if quiet_for >= self.quiet or dirty_for >= self.max_delay:
                try:
                    await self.snapshot()
                except Exception:
                    log.exception("scheduled snapshot failed; will try again")
                quiet_for = dirty_for = 0.0

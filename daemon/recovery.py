"""Recovery at start: the snapshots (EurekaClaw's files on a first start), then the journal replayed past them.

Rule kept here: the daemon answers nothing until recovery is complete; every journaled mutation
type is in MUTATION_TIER, which names the tier whose `apply` replays it, so replay and run time use
the same function. A CommitJob (a job's result and its completion in one record) is the one
record that spans tiers: each of its parts goes to the tier MUTATION_TIER names, then the job to
the jobs tier, exactly as the tier actors applied them at run time. Jobs left `running` are
queued again once the journal is replayed.
"""

from __future__ import annotations

import collections
import gc
import itertools
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Union

import msgspec
import outcome
import trio

from ..protocol import (
    now_rfc3339,
)
from . import systemd
from .config import config_default
from .conversation.actor import load_snapshot as load_conversations
from .conversation.state import ConversationState, DropMessages, MoveMark, PutMessages, PutSummary
from .errors import StartupError
from .jobs.state import AcceptJob, CommitJob, JobsState, PurgeJob, PutJob
from .jobs.state import load_snapshot as load_jobs_snapshot
from .memory.files import import_eurekaclaw_memories
from .memory.records import MaintenanceRecord, PurgeMemory, PutMemory
from .memory.review import PutReview
from .memory.snapshot import load_vectors, read_memory_snapshot
from .memory.state import MemoryState
from .paths import Paths
from .retrieval.embed import make_embedder
from .skills.actor import load_skill_files
from .skills.state import PutSkill, RemoveSkill, SkillsState
from .storage import eurekaclaw
from .storage.files import RealFiles, atomic_write
from .storage.journal import Journal
from .storage.store import RTYPE_MUTATION
from .tiers.graph import GraphState, PutEdge, PutNode
from .tiers.persistent import DeleteKey, PersistentState, PutRecord

log = logging.getLogger("eurekamem")

STORE_MARKER = "STORE"  # memory/journal/STORE: "postgres" where the data root's store is PostgreSQL


MUTATION_TIER: dict[type, str] = {
    PutRecord: "persistent",
    DeleteKey: "persistent",
    PutNode: "graph",
    PutEdge: "graph",
    PutMemory: "memory",
    PurgeMemory: "memory",
    PutReview: "memory",  # the review queue lives in the memory tier (daemon/memory/review.py)
    MaintenanceRecord: "memory",
    PutSkill: "skills",
    RemoveSkill: "skills",  # another program removed the SKILL.md (daemon/skills/watch.py)
    PutMessages: "conversation",
    DropMessages: "conversation",
    MoveMark: "conversation",
    PutSummary: "conversation",
    AcceptJob: "jobs",
    PutJob: "jobs",
    PurgeJob: "jobs",
    CommitJob: "jobs",  # and its parts to their own tiers (see the module's rule)
}


# the Union is built from the table at run time (no `X | Y` spelling for that)
mutation_decoder = msgspec.msgpack.Decoder(Union[tuple(MUTATION_TIER)])  # noqa: UP007


def decode_mutation(payload: bytes) -> Any:
    """One journal record of type RTYPE_MUTATION as the mutation it holds (any type in MUTATION_TIER),
    decoded as recovery decodes it, so a reader outside the daemon (`eurekamem verify`) sees the
    journal the way a restart would; msgspec.DecodeError or ValidationError when it does not decode."""
    return mutation_decoder.decode(payload)


class Recovered:
    def __init__(self, embedder: Any) -> None:
        self.journal: Journal | None = None
        self.persistent = PersistentState()
        self.graph = GraphState()
        self.memory = MemoryState(embedder)
        self.skills = SkillsState(embedder)
        # the same embedder object: one model in memory; the daemon sets its configured gap before serving
        self.conversation = ConversationState(embedder, session_gap=config_default("conversation_session_gap"))
        self.jobs = JobsState(config_default("jobs_max_attempts"))
        self.checkpoint_seq = 0
        self.replayed = 0
        self.imported: dict[str, int] = {}
        self.interrupted_jobs = 0
        self.redacted: list[str] = []  # the kinds redaction replaced in what a first start imported

    def summary(self, seconds: float) -> dict[str, Any]:
        """sys.stats → recovery (and recovery_line's words): what this recovery found, and how long it took."""
        return {
            "checkpoint_seq": self.checkpoint_seq,
            "replayed": self.replayed,
            "imported": self.imported,
            "seconds": round(seconds, 3),
            "interrupted_jobs": self.interrupted_jobs,
        }


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


def _read_eurekaclaw_json(paths: Paths, out: Recovered, redactor: Any, has_checkpoint: bool) -> dict[str, Any] | None:
    """persistent.json and knowledge_graph.json into `out`'s tiers; redacted when `redactor` is given
    and no checkpoint says the daemon wrote them (files another program wrote). The records read."""
    records: dict[str, Any] | None = _read_snapshot(paths.persistent, eurekaclaw.read_persistent, has_checkpoint)
    first_import = redactor is not None and not has_checkpoint
    if records:
        for record in records.values():
            out.persistent.apply(eurekaclaw_put(redactor.imported(record, out.redacted) if first_import else record))
    graph = _read_snapshot(paths.graph, eurekaclaw.read_graph, has_checkpoint)
    if graph:
        nodes, edges = graph
        if first_import:
            nodes = {node_id: redactor.imported(node, out.redacted) for node_id, node in nodes.items()}
        out.graph.load(nodes)
        for edge in edges:
            out.graph.apply(_edge(*edge))
        out.graph.keep_copies(edges)  # EurekaClaw's duplicate edges: the file gets them back
    return records


def recover(
    paths: Paths,
    fs: Any = None,
    embedder: Any = None,
    progress: Callable[[str], None] | None = None,
    redactor: Any = None,
    store: Any = None,
) -> Recovered:
    """Load the snapshots (EurekaClaw's files on a first start), then replay the journal past them.

    `progress(text)`, when given, hears what recovery is doing (called from this thread). Without
    an `embedder`, the configuration's default model is used (Config.embedder). `redactor` (the
    daemon's Redactor, daemon/redact.py) redacts what a first start imports from files another
    program wrote, as a write storing it would be (the files themselves are left as they are); the
    kinds replaced come back in `Recovered.redacted` for the daemon to count. With `store` (an
    opened PostgresStore, `store = "postgres"`), every durable tier is loaded from its tables
    instead (the data root opened by open_local_root; `Recovered.journal` stays None)."""
    fs = fs or RealFiles()
    progress = progress or (lambda text: None)
    if store is not None:
        return _recover_from_store(paths, embedder, progress, store, redactor)
    if (paths.journal / STORE_MARKER).exists():
        raise StartupError(
            f"{paths.root} is the local root of a daemon whose store is PostgreSQL (its {STORE_MARKER} file): "
            "its data is in the database; start with store = \"postgres\" and its postgres_dsn"
        )
    progress("loading snapshots")
    out = Recovered(embedder or make_embedder(config_default("embedder")))
    has_checkpoint = paths.checkpoint.exists()
    if has_checkpoint:
        out.checkpoint_seq = int(json.loads(paths.checkpoint.read_bytes())["seq"])
    records = _read_eurekaclaw_json(paths, out, redactor, has_checkpoint)
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
        kinds = redactor.unknown_domain if redactor is not None else frozenset()
        imported_memories = import_eurekaclaw_memories(out.memory, paths.root, kinds, out.redacted)
    progress("loading the conversations and their index")
    load_conversations(out.conversation, paths.conversation_snapshot, paths.conversation_vectors)
    if paths.jobs_snapshot.exists():
        try:
            load_jobs_snapshot(out.jobs, paths.jobs_snapshot.read_bytes())
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise StartupError(
                f"{paths.jobs_snapshot}: does not decode ({exc}); the daemon wrote it, so it refuses to guess"
            ) from None
    if not has_checkpoint and (records or out.graph.nodes or out.graph.edges):
        out.imported = {"records": len(records or {}), "nodes": len(out.graph.nodes), "edges": len(out.graph.edges)}
    if imported_memories:
        out.imported["memories"] = imported_memories
    progress("loading the skills")
    skills = load_skill_files(out.skills, paths.root)  # skills/<name>/SKILL.md: EurekaClaw's, or our own
    if skills and not has_checkpoint:
        out.imported["skills"] = skills
    journal, entries = Journal.open(paths.journal, fs=fs, first_seq=out.checkpoint_seq + 1)
    out.journal = journal
    if journal.next_seq <= out.checkpoint_seq:
        journal.close()
        raise StartupError(
            f"the journal in {paths.journal} ends at seq {journal.last_seq}, before the checkpoint's "
            f"seq {out.checkpoint_seq}: journal segments were removed by hand; refusing to reuse their numbers"
        )
    progress("replaying the journal")
    replayed = (
        mutation_decoder.decode(payload)
        for seq, rtype, payload in entries
        if seq > out.checkpoint_seq and rtype == RTYPE_MUTATION
    )
    return _replay(out, replayed, progress, "replaying the journal: {} records")


def open_local_root(paths: Paths, fs: Any = None) -> Journal:
    """The data root of a daemon whose store is PostgreSQL: its journal opened (it stays empty: the
    daemon journals nothing there) and marked with STORE_MARKER; a root whose journal holds records
    is a journal root (migrate it first) and is refused (StartupError)."""
    fs = fs or RealFiles()
    journal, entries = Journal.open(paths.journal, fs=fs, first_seq=1)
    marker = paths.journal / STORE_MARKER
    if not marker.exists():
        held = sum(1 for _seq, rtype, _payload in entries if rtype == RTYPE_MUTATION)
        if held or paths.checkpoint.exists():
            journal.close()
            raise StartupError(
                f"{paths.root} holds a journal's data ({held} records past its snapshot): its store is the "
                "journal; start it with store = \"journal\", or copy it into PostgreSQL with "
                "`eurekamem migrate --to postgres` and use another data root for this daemon"
            )
        atomic_write(fs, str(marker), b"postgres\n")
    return journal


def _recover_from_store(
    paths: Paths, embedder: Any, progress: Callable[[str], None], store: Any, redactor: Any
) -> Recovered:
    """recover() for a daemon whose store is PostgreSQL (its root opened by open_local_root): its
    tables' bodies, in commit order, applied through each tier's own `apply` (daemon/postgres/rows.py's
    rule), the vectors from pgvector. Into an empty database, a first start first imports EurekaClaw's
    persistent.json and knowledge_graph.json from the data root, as the journal's first start adopts
    them (memories/ and skills/ are adopted by the tiers' scans, as files another program writes)."""
    out = Recovered(embedder or make_embedder(config_default("embedder")))
    if store.is_empty():
        _import_into_store(paths, out, store, redactor)
    return load_from_store(store, out, progress, scratch=pg_scratch(paths))


def pg_scratch(paths: Paths) -> Path:
    """Where a daemon on PostgreSQL keeps its local copy of tier 4's index snapshot and the files
    of one being loaded or written (daemon/postgres/snapshots.py); those a crash left are removed."""
    import shutil

    folder = paths.memory / "postgres"
    for left in folder.glob(".pg-*"):
        shutil.rmtree(left, ignore_errors=True)
    return folder


def _import_into_store(paths: Paths, out: Recovered, store: Any, redactor: Any) -> None:
    from .postgres.migrate import commit_all, graph_mutations, persistent_mutations

    read = Recovered(out.memory.embedder)
    records = _read_eurekaclaw_json(paths, read, redactor, has_checkpoint=False)
    if not (records or read.graph.nodes or read.graph.edges):
        return
    commit_all(store, itertools.chain(persistent_mutations(read.persistent), graph_mutations(read.graph)))
    out.imported = {"records": len(records or {}), "nodes": len(read.graph.nodes), "edges": len(read.graph.edges)}
    out.redacted.extend(read.redacted)


def load_from_store(
    store: Any,
    out: Recovered,
    progress: Callable[[str], None] | None = None,
    *,
    scratch: Path | None = None,
    use_snapshot: bool = True,
) -> Recovered:
    """The tiers of `out` (fresh states) loaded from an opened PostgresStore's tables, with no data
    root: start-up's loading part, which `eurekamem migrate` also uses to check what it wrote
    (`use_snapshot=False`: every row). Tier 4 comes from its index snapshot and the feed after it
    when the database holds a usable one (daemon/postgres/snapshots.py), else from its rows."""
    progress = progress or (lambda text: None)
    if use_snapshot and _load_with_snapshot(store, out, progress, scratch):
        return out
    progress("loading the tiers from PostgreSQL")
    current: dict[str, bytes] = {}  # memory id -> its vector of the current model
    others: dict[str, tuple[str, bytes]] = {}  # memory id -> a vector of another model
    rows = _with_vectors(store.rows_in_order(), out.memory.model, current, others)
    _replay(out, rows, progress, "loading from PostgreSQL: {} rows")
    progress("loading from PostgreSQL: building the vector index")
    out.memory.add_loaded_vectors(current)
    _keep_previous_model(out.memory, others)
    return out


MEMORY_TABLES = ("memories", "memory_versions", "reviews", "maintenance")  # tier 4's (daemon/postgres/rows.py)


def _load_with_snapshot(store: Any, out: Recovered, progress: Callable[[str], None], scratch: Path | None) -> bool:
    """Tier 4 from the newest usable index snapshot and the feed's memory mutations after it, the
    other tiers from their rows; False (nothing loaded) when there is no usable snapshot."""
    import time

    from .postgres import snapshots

    progress("loading tier 4's index snapshot from PostgreSQL")
    t0 = time.perf_counter()
    got = snapshots.fetch(store.dsn, out.memory.model, out.memory.embedder.dim, scratch)
    if isinstance(got, str):
        log.info("PostgreSQL: tier 4 is rebuilt from its rows: %s", got)
        return False
    memory = out.memory
    memory.load_snapshot(got.doc, got.vectors)
    for loaded in memory.memories.values():  # the local root's files are owed, as after a load from the rows
        memory._changed(loaded)
    memory.global_dirty = bool(memory._global)
    out.checkpoint_seq = got.upto_seq
    t1 = time.perf_counter()
    progress("replaying the feed after tier 4's snapshot")
    tail = 0
    others = [table for table in store_tables() if table not in MEMORY_TABLES]
    with snapshots.one_snapshot(store) as conn:  # the tail and the other tiers of one moment: the feed's head
        for body in snapshots.feed_after(conn, got.upto_seq):
            for part in _memory_parts(mutation_decoder.decode(body)):
                memory.apply(part)
                tail += 1
        t2 = time.perf_counter()
        _replay(out, (mutation_decoder.decode(body) for body, _vector in snapshots.rows_of(conn, others)), progress,
                "loading from PostgreSQL: {} rows")
    out.replayed += tail
    log.info(
        "PostgreSQL: tier 4 from the index snapshot at seq %d, its %s (%s, built %.2f s) and %d feed mutations "
        "after it (%.2f s); the other tiers' rows %.2f s",
        got.upto_seq, got.source, ", ".join(f"{k} {v:.2f} s" for k, v in got.seconds.items()), t1 - t0, tail, t2 - t1,
        time.perf_counter() - t2,
    )
    return True


def store_tables() -> list[str]:
    from .postgres.rows import TABLES

    return list(TABLES)


def _memory_parts(mutation: Any) -> list[Any]:
    """Tier 4's mutations in one of the feed's (a CommitJob's parts included, in their order)."""
    if isinstance(mutation, CommitJob):
        return [part for part in mutation.parts if MUTATION_TIER[type(part)] == "memory"]
    return [mutation] if MUTATION_TIER[type(mutation)] == "memory" else []


def _with_vectors(rows: Any, model: str, current: dict[str, bytes], others: dict[str, tuple[str, bytes]]) -> Any:
    """The stored bodies as mutations. Each memory's latest vector, from its pgvector column: of
    the current `model`, kept apart in `current` (added in one insert once every row is applied);
    of another model, put back in its mutation (the memory waits for re-embedding) and noted in `others`."""
    for body, vector in rows:
        mutation = mutation_decoder.decode(body)
        if isinstance(mutation, (PutMemory, PurgeMemory)):
            memory_id = mutation.memory.id if isinstance(mutation, PutMemory) else mutation.id
            current.pop(memory_id, None)
            others.pop(memory_id, None)
            if vector and isinstance(mutation, PutMemory):
                if mutation.model == model:
                    current[memory_id] = vector
                else:
                    mutation = msgspec.structs.replace(mutation, vector=vector)
                    others[memory_id] = (mutation.model, vector)
        yield mutation


def _keep_previous_model(memory: MemoryState, others: dict[str, tuple[str, bytes]]) -> None:
    """After a restart in the middle of a change of model: the memories not re-embedded yet still
    hold the previous model's vector in their row, and keep answering dense search with it until
    re-embedded (the journal store keeps the previous model's vector file for the same purpose)."""
    if not others:
        return
    model = collections.Counter(m for m, _ in others.values()).most_common(1)[0][0]
    try:
        embedder = make_embedder(model)
    except (ValueError, TypeError) as exc:
        log.warning("tier 4: the previous model %s cannot serve search meanwhile: %s", model, exc)
        return
    kept = memory.keep_previous(model, {i: v for i, (m, v) in others.items() if m == model}, embedder)
    if kept:
        log.info("tier 4: %d memories answer dense search with %s's vectors until re-embedded by %s", kept, model, memory.model)


def _replay(out: Recovered, mutations: Any, progress: Callable[[str], None], saying: str) -> Recovered:
    """Apply mutations in order, each through its tier's `apply` (a CommitJob's parts first, to
    their own tiers: the module's rule); then the interrupted jobs are queued again."""
    states = {
        "persistent": out.persistent, "graph": out.graph, "memory": out.memory, "skills": out.skills,
        "conversation": out.conversation, "jobs": out.jobs,
    }
    for mutation in mutations:
        if isinstance(mutation, CommitJob):
            for part in mutation.parts:
                states[MUTATION_TIER[type(part)]].apply(part)
        states[MUTATION_TIER[type(mutation)]].apply(mutation)
        out.replayed += 1
        if out.replayed % 10_000 == 0:
            progress(saying.format(out.replayed))
    out.interrupted_jobs = out.jobs.load_finished()
    return out


def eurekaclaw_put(record: Any) -> Any:
    from .tiers.persistent import PutRecord

    return PutRecord(record)


def _edge(from_id: str, to_id: str, relation: str) -> Any:
    from .tiers.graph import PutEdge

    return PutEdge(from_id, to_id, relation)




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


async def recover_reporting(
    paths: Paths, fs: Any, embedder: Any, redactor: Any, manager: systemd.ServiceManager, store: Any = None
) -> Recovered:
    """recover() in a worker thread; meanwhile systemd hears progress and grants more start-up time.
    The collector is off while it runs: recovery allocates millions of objects that all live on."""
    progress = systemd.Progress("loading snapshots")
    manager.notify("STATUS=recovering: loading snapshots and replaying the journal", f"EXTEND_TIMEOUT_USEC={systemd.RECOVERY_EXTEND_USEC}")
    gc.disable()
    try:
        async with trio.open_nursery() as nursery:
            if manager.enabled:
                nursery.start_soon(systemd.report_recovery, manager, progress)
            result = await outcome.acapture(trio.to_thread.run_sync, recover, paths, fs, embedder, progress.set, redactor, store)
            nursery.cancel_scope.cancel()
    finally:
        gc.enable()
    recovered: Recovered = result.unwrap()
    return recovered

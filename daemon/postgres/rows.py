"""What a mutation does to the PostgreSQL store's tables: each mutation as row operations.

Rule kept here: the tables hold, per record, the mutations that make it what it is now, so that
start-up applies them (in their commit order) through the tiers' own `apply`, as journal replay
does, and gets the same state: a compacted journal. Every mutation carries its whole record, so
for most kinds that is the last one per id (a put replaces the row, a delete or purge removes it).
Where a state keeps more than the last record, the rows keep what it needs:

- a memory's versions: `memory_versions` holds each version's put (version > 0) and the last
  same-version put that followed it (its metadata: feedback, archive), which is the text and
  state the next version's history entry keeps; `memories` holds the last put with its vector
  in a pgvector column (the body's own vector is emptied: stored once);
- a review that promoted a memory: the review row and the memory's put, apart;
- a job: its accept (its input) and its last put;
- a CommitJob: each of its parts as its own kind, and the job as a put;
- PutMessages: one row per message;
- every job mutation also sets the job's row in `job_queue` (its key, kind, state and attempts:
  what the team's job queue claims by, daemon/postgres/jobqueue.py), in the same transaction.

Row operations are plain values (`RowOp`): the store turns them into SQL; nothing here does I/O.
Keys are bytes (UTF-8): an id may hold any character, NUL included, and a bytea key takes it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec

from ..conversation.state import DropMessages, MoveMark, PutMessages, PutSummary
from ..jobs.state import AcceptJob, CommitJob, PurgeJob, PutJob
from ..memory.records import MaintenanceRecord, PurgeMemory, PutMemory
from ..memory.review import PutReview
from ..skills.state import PutSkill, RemoveSkill
from ..tiers.graph import PutEdge, PutNode
from ..tiers.persistent import DeleteKey, PutRecord

encoder = msgspec.msgpack.Encoder()

# table -> its key columns (each bytea, but memory_versions' version, an integer)
TABLES: dict[str, tuple[str, ...]] = {
    "persistent": ("key",),
    "graph_nodes": ("id",),
    "graph_edges": ("from_id", "to_id", "relation"),
    "memories": ("id",),
    "memory_versions": ("id", "version"),
    "reviews": ("id",),
    "maintenance": ("job_id",),
    "skills": ("name",),
    "messages": ("grp", "mseq"),
    "conversation_marks": ("grp",),
    "conversation_summaries": ("grp",),
    "jobs": ("id", "slot"),
}


class RowOp(NamedTuple):
    """One change to one table: `put` (insert or replace the row with `body`), `delete` (the rows
    whose keys equal `key`'s, a prefix of the table's key columns), `version_tail` (a memory's
    same-version put: it becomes the tail of the row of the memory's latest version)."""

    op: str
    table: str
    key: tuple[Any, ...]
    body: bytes = b""
    vector: bytes = b""  # memories: the float32 row, stored in the pgvector column
    model: str = ""
    values: tuple[Any, ...] = ()  # job_state: the job's (key, kind, state, attempts, accepted now)


def _b(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def row_ops(mutation: Any) -> list[RowOp]:
    """The row operations one committed mutation makes, in order (the module's rule)."""
    if isinstance(mutation, PutMemory):
        return _memory_put(mutation)
    if isinstance(mutation, PurgeMemory):
        key = (_b(mutation.id),)
        return [RowOp("delete", "memories", key), RowOp("delete", "memory_versions", key)]
    if isinstance(mutation, PutRecord):
        return [RowOp("put", "persistent", (_b(mutation.record.key),), encoder.encode(mutation))]
    if isinstance(mutation, DeleteKey):
        return [RowOp("delete", "persistent", (_b(mutation.key),))]
    if isinstance(mutation, PutNode):
        return [RowOp("put", "graph_nodes", (_b(mutation.node.node_id),), encoder.encode(mutation))]
    if isinstance(mutation, PutEdge):
        edge = (_b(mutation.from_id), _b(mutation.to_id), _b(mutation.relation))
        return [RowOp("put", "graph_edges", edge, encoder.encode(mutation))]
    if isinstance(mutation, PutReview):
        review = RowOp("put", "reviews", (_b(mutation.item.id),), encoder.encode(PutReview(mutation.item)))
        return [*(_memory_put(mutation.memory) if mutation.memory is not None else []), review]
    if isinstance(mutation, MaintenanceRecord):
        return [RowOp("put", "maintenance", (_b(mutation.job_id),), encoder.encode(mutation))]
    if isinstance(mutation, PutSkill):
        return [RowOp("put", "skills", (_b(mutation.skill.name),), encoder.encode(mutation))]
    if isinstance(mutation, RemoveSkill):
        return [RowOp("delete", "skills", (_b(mutation.name),))]
    if isinstance(mutation, PutMessages):
        return [
            RowOp("put", "messages", (_b(m.group), m.seq), encoder.encode(PutMessages([m]))) for m in mutation.messages
        ]
    if isinstance(mutation, DropMessages):
        return [RowOp("delete", "messages", (_b(mutation.group), seq)) for seq in mutation.seqs]
    if isinstance(mutation, MoveMark):
        return [RowOp("put", "conversation_marks", (_b(mutation.group),), encoder.encode(mutation))]
    if isinstance(mutation, PutSummary):
        return [RowOp("put", "conversation_summaries", (_b(mutation.group),), encoder.encode(mutation))]
    if isinstance(mutation, AcceptJob):
        job = _b(mutation.job.id)
        return [
            RowOp("delete", "jobs", (job,)),  # an id accepted again (after a purge) starts afresh
            RowOp("put", "jobs", (job, b"accept"), encoder.encode(mutation)),
            job_state(mutation.job, accepted=True),
        ]
    if isinstance(mutation, PutJob):
        return [RowOp("put", "jobs", (_b(mutation.job.id), b"last"), encoder.encode(mutation)), job_state(mutation.job)]
    if isinstance(mutation, PurgeJob):
        return [RowOp("delete", "jobs", (_b(mutation.id),)), RowOp("delete", "job_queue", (_b(mutation.id),))]
    if isinstance(mutation, CommitJob):
        ops = [op for part in mutation.parts for op in row_ops(part)]
        done = mutation.job
        return [*ops, RowOp("put", "jobs", (_b(done.id), b"last"), encoder.encode(PutJob(done))), job_state(done)]
    raise TypeError(f"no table holds a {type(mutation).__name__}")


def job_state(job: Any, *, accepted: bool = False) -> RowOp:
    """The job's row in job_queue (the module's rule): `accepted` places it at the queue's end."""
    return RowOp("job_state", "job_queue", (_b(job.id),), values=(_b(job.key), job.kind, job.state, job.attempts, accepted))


def _memory_put(mutation: PutMemory) -> list[RowOp]:
    key = (_b(mutation.memory.id),)
    body = encoder.encode(msgspec.structs.replace(mutation, vector=b""))
    current = RowOp("put", "memories", key, body, mutation.vector, mutation.model)
    if mutation.version > 0:
        # the state keeps the versions before this one (daemon/memory/state.py's _record_version)
        return [
            RowOp("delete_from_version", "memory_versions", (*key, mutation.version)),
            RowOp("put", "memory_versions", (*key, mutation.version), body),
            current,
        ]
    return [RowOp("version_tail", "memory_versions", key, body), current]

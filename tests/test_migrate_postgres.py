"""`eurekamem migrate --to postgres`: a journal root written by a real daemon, copied into a real
PostgreSQL (tests/pg_server.py), then served by a daemon on the database alone (a new data root).

What it checks: the printed table's counts, that every tier written comes back through the client
(records, the edge, memories and their versions, the purge, a conversation, search), that a second
migrate without --force is refused, and that migrate refuses while a daemon runs on the root.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from daemon_process import DaemonProcess
from eurekamem.client import Client, EurekamemError

pytestmark = pytest.mark.postgres

TIMEOUT = 30.0


def _migrate(root: Path, dsn: str, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "eurekamem.cli.main", "migrate", "--to", "postgres", "--postgres-dsn", dsn]
    return subprocess.run([*argv, "--data-dir", str(root), *extra], capture_output=True, text=True, timeout=300)


def _state_of(c: Client, memory_ids: list[str]) -> dict[str, Any]:
    return {
        "records": [msgspec.to_builtins(c.recall(k)) for k in ("k1", "k2", "k3")],
        "related": sorted(n.node_id for n in c.related(c.search_theorems("Azuma")[0].node_id)),
        "memories": [msgspec.to_builtins(c.get_memory(i)) for i in memory_ids],
        "history": [[v.version for v in c.memory_history(i)] for i in memory_ids],
        "messages": [(m["id"], m["text"]) for m in c.conversation_get("g1")],
        "search": [h.memory.id for h in c.search_memories("martingale concentration", k=3)],
    }


def _counts(output: str) -> dict[str, tuple[int, int]]:
    rows = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1].isdigit() and parts[2].isdigit():
            rows[parts[0]] = (int(parts[1]), int(parts[2]))
    return rows


def test_migrate_a_journal_root_into_postgres(tmp_path: Path, postgres_dsn: str) -> None:
    root = tmp_path / "journal"
    proc = DaemonProcess(root, tmp_path / "j.sock").start()
    try:
        with Client(proc.socket_path, timeout=TIMEOUT) as c:
            c.remember("k1", {"why": "loose"}, tags=["failed"])
            c.remember("k2", [1, 2, 3])
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
            c.promote_memory(m2.id, reason="true everywhere")  # a review request
            c.put_skill("azuma_trick", "# Azuma\n\nBound martingale differences, then apply Azuma.")
            job = c.wait_job(c.maintain(), timeout=TIMEOUT)  # a job and a maintenance run
            before = _state_of(c, [m1.id, m2.id])
            before["reviews"] = sorted((r.id, r.state) for r in c.reviews(state="any"))
            before["skill"] = c.skill("azuma_trick").body
            before["job"] = c.job(job.id).state
            # a daemon runs on the root: migrate refuses, writing nothing
            running = _migrate(root, postgres_dsn)
            assert running.returncode == 1, running.stdout
            assert "stop it first" in running.stderr
        assert proc.terminate() == 0
    finally:
        proc.kill()
    assert before["history"][0] == [1, 2, 3]

    done = _migrate(root, postgres_dsn)
    assert done.returncode == 0, done.stdout + done.stderr
    counts = _counts(done.stdout)
    assert counts["records"] == (2, 2)
    assert counts["nodes"] == (2, 2)
    assert counts["edges"] == (1, 1)
    assert counts["memories"] == (2, 2)
    assert counts["messages"] == (2, 2)
    assert counts["reviews"] == (1, 1)
    assert counts["skills"] == (1, 1)
    assert counts["maintenance"] == (1, 1)
    assert counts["jobs"][0] >= 1 and counts["jobs"][0] == counts["jobs"][1]
    assert "DIFFERS" not in done.stdout and "vectors: the largest difference" in done.stdout

    again = _migrate(root, postgres_dsn)
    assert again.returncode == 1
    assert "--force" in again.stderr
    forced = _migrate(root, postgres_dsn, "--force")  # the same records again: upserts, the same rows
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert _counts(forced.stdout) == counts

    fresh = DaemonProcess(tmp_path / "pg", tmp_path / "pg.sock", "--store", "postgres", "--postgres-dsn", postgres_dsn).start()
    try:
        with Client(fresh.socket_path, timeout=TIMEOUT) as c:
            after = _state_of(c, [m1.id, m2.id])
            after["reviews"] = sorted((r.id, r.state) for r in c.reviews(state="any"))
            after["skill"] = c.skill("azuma_trick").body
            after["job"] = c.job(job.id).state
            assert after == before
            with pytest.raises(EurekamemError):
                c.get_memory(m3.id)
    finally:
        fresh.kill()

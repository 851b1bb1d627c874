"""Several daemons on one PostgreSQL (issue 26): the change feed (daemon/postgres/feed.py).

What it checks: real daemons, each on its own data root, on one real database: what one node
writes (every durable tier) is what the others read; the same key written on two nodes at once
ends the same on every node and equal to the database; a follower whose connection is killed
misses nothing; a node stopped while others write catches up at its restart; a node the feed
was trimmed past stops saying so, and its restart loads the tables. And, without a database, the
re-apply rule for a node's own mutations (OwnCommits).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest
from test_postgres import _state_of as tier_state

from daemon_process import DaemonProcess
from eurekamem.client import Client

TIMEOUT = 30.0
DEADLINE = 20.0  # seconds a node may take to apply what another committed (it takes milliseconds)


def _daemon(root: Path, sock: Path, dsn: str, *extra: str) -> DaemonProcess:
    return DaemonProcess(root, sock, "--store", "postgres", "--postgres-dsn", dsn, "--snapshot-quiet", "0.2", *extra)


def _head(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return int(conn.execute("SELECT coalesce(max(seq), 0) FROM mutations").fetchone()[0])


def caught_up(procs: list[DaemonProcess], dsn: str) -> None:
    """Wait until every node applied the feed up to its head as it is now (across processes: a
    bounded wait on what sys.stats shows)."""
    head = _head(dsn)
    deadline = time.monotonic() + DEADLINE
    for proc in procs:
        with Client(proc.socket_path, timeout=TIMEOUT) as c:
            while (applied := c.stats()["store"]["feed"]["applied_seq"]) < head:
                assert time.monotonic() < deadline, f"{proc.data_dir.name} applied {applied} of {head}"
                time.sleep(0.01)


def _state_of(c: Client, memory_ids: list[str]) -> dict[str, Any]:
    """What a client reads of every shared tier the tests write (test_postgres's, and the skills)."""
    return {**tier_state(c, memory_ids), "skills": [msgspec.to_builtins(s) for s in c.list_skills()]}


@pytest.fixture(scope="module")
def team(postgres_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[DaemonProcess]]]:
    """Three nodes on one database, shared by the tests that do not stop them."""
    dsn = postgres_server.create_database()
    base = tmp_path_factory.mktemp("team")
    procs = [_daemon(base / name, base / f"{name}.sock", dsn, "--node-name", name) for name in ("a", "b", "c")]
    try:
        for proc in procs:
            proc.start()
        yield dsn, procs
    finally:
        for proc in procs:
            proc.kill()
        postgres_server.drop_database(dsn)


def test_what_one_node_writes_the_others_read(team: tuple[str, list[DaemonProcess]]) -> None:
    dsn, (a, b, c) = team
    with Client(a.socket_path, timeout=TIMEOUT) as ca:
        for key, value in (("k1", {"tried": "induction"}), ("k2", "kept"), ("k3", [0])):
            ca.remember(key, value)
        ca.forget("k2")
        x = ca.add_theorem("Azuma", "martingale bound", domain="prob")
        y = ca.add_theorem("Freedman", "variance-aware bound", domain="prob")
        ca.link(y.node_id, x.node_id, "specializes")
        m1 = ca.add_memory("prob", "proof_strategy", "Martingales", "Martingale concentration via Azuma's inequality.").memory
        m2 = ca.add_memory("prob", "fact", "Chernoff", "Chernoff bounds need independence.").memory
        ca.update_memory(m2.id, content="Chernoff bounds need independence, or negative association.")
        ca.append_messages("g1", [{"id": "q1", "role": "user", "text": "which bound?"}])
        ca.put_skill("union-bound", "Sum the probabilities.", description="bound a union")
        expected = _state_of(ca, [m1.id, m2.id])
    assert expected["search"][0] == m1.id and [s["name"] for s in expected["skills"]] == ["union-bound"]
    caught_up([a, b, c], dsn)
    for proc in (b, c):
        with Client(proc.socket_path, timeout=TIMEOUT) as other:
            assert _state_of(other, [m1.id, m2.id]) == expected
            feed = other.stats()["store"]["feed"]
            assert feed["mutations"] > 0 and feed["name"] == proc.data_dir.name
    memory_file = b.data_dir / "memories" / "prob"  # the local projection of what another node wrote
    deadline = time.monotonic() + DEADLINE
    while not any(memory_file.glob("*.md")):
        assert time.monotonic() < deadline, "node b never projected a's memories"
        time.sleep(0.05)

"""Several daemons on one PostgreSQL (issue 26): the change feed (daemon/postgres/feed.py).

What it checks: real daemons, each on its own data root, on one real database: what one node
writes (every durable tier) is what the others read; the same key written on two nodes at once
ends the same on every node and equal to the database; a follower whose connection is killed
misses nothing; a node stopped while others write catches up at its restart; a node the feed
was trimmed past stops saying so, and its restart loads the tables. And, without a database, the
re-apply rule for a node's own mutations (OwnCommits).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest
import trio
import trio.testing
from test_postgres import _state_of as tier_state

from daemon_process import DaemonProcess
from eurekamem.client import Client
from eurekamem.daemon.postgres.feed import OwnCommits
from eurekamem.daemon.recovery import decode_mutation

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


def database_view(dsn: str) -> dict[str, Any]:
    """The checksums of the tables loaded afresh (what a new node would hold), the jobs aside."""
    from eurekamem.daemon.postgres.migrate import checksums
    from eurekamem.daemon.postgres.store import PostgresStore
    from eurekamem.daemon.recovery import Recovered, load_from_store
    from eurekamem.daemon.retrieval.embed import make_embedder

    store = PostgresStore(dsn, pool_size=1)
    store.open()
    try:
        loaded = load_from_store(store, Recovered(make_embedder("e5-small")))  # not loaded: its name and dimension
    finally:
        store.close()
    return {kind: {"count": n, "sha256": digest} for kind, (n, digest) in checksums(loaded).items() if kind != "jobs"}


def assert_views_equal(procs: list[DaemonProcess], dsn: str, *, history_text: bool = True) -> None:
    """Once caught up, every node's own view (sys.digest) equals the database's, the jobs aside
    (each node runs its own queue until the team's). history_text=False: the memories' version
    histories are compared by count only (the known limit in daemon/postgres/feed.py: a node that
    made a new version of a memory while another node's older one was still to be applied keeps
    that version's text in its history as it saw it, until its restart)."""
    caught_up(procs, dsn)
    expected = database_view(dsn)
    for proc in procs:
        with Client(proc.socket_path, timeout=TIMEOUT) as client:
            kinds = client.digest()["kinds"]
        kinds.pop("jobs")
        if not history_text:
            assert kinds.pop("history")["count"] == expected["history"]["count"], proc.data_dir.name
            kinds["history"] = expected["history"]
        assert kinds == expected, proc.data_dir.name


def _state_of(c: Client, memory_ids: list[str]) -> dict[str, Any]:
    """What a client reads of every shared tier the tests write (test_postgres's, and the skills)."""
    return {**tier_state(c, memory_ids), "skills": [msgspec.to_builtins(s) for s in c.list_skills()]}


@pytest.fixture(scope="module")
def team(postgres_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[DaemonProcess]]]:
    """Three nodes on one database, shared by the tests that do not stop them."""
    yield from nodes(postgres_server, tmp_path_factory.mktemp("team"), ("a", "b", "c"))


def nodes(postgres_server: Any, base: Path, names: tuple[str, ...], *extra: str) -> Iterator[tuple[str, list[DaemonProcess]]]:
    """A fixture's nodes, one per name, started on a new database (dropped after)."""
    dsn = postgres_server.create_database()
    procs = [_daemon(base / name, base / f"{name}.sock", dsn, "--node-name", name, *extra) for name in names]
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
    assert_views_equal([a, b, c], dsn)
    with Client(b.socket_path, timeout=TIMEOUT) as cb:
        cb.snapshot()  # the local files of what another node wrote: as a local write's, at the next snapshot
    memory = b.data_dir / "memory"
    assert "k1" in (memory / "persistent.json").read_text() and "Freedman" in (memory / "knowledge_graph.json").read_text()
    folder = b.data_dir / "memories" / "prob"
    assert (folder / "MEMORY.md").exists() and len(list(folder.glob("*.md"))) == 3  # MEMORY.md and 2 memories
    assert (b.data_dir / "skills" / "union-bound" / "SKILL.md").exists()


def test_the_same_keys_written_on_two_nodes_at_once_end_the_same_everywhere(team: tuple[str, list[DaemonProcess]]) -> None:
    dsn, (a, b, c) = team
    with Client(a.socket_path, timeout=TIMEOUT) as ca:
        memory = ca.add_memory("race", "fact", "Contended", "Written by every node.").memory
    caught_up([b], dsn)

    def write(proc: DaemonProcess, tag: str) -> None:
        with Client(proc.socket_path, timeout=TIMEOUT) as client:
            for i in range(40):
                client.remember("contended", f"{tag}{i}")
                client.remember(f"contended-{i % 3}", {"by": tag, "i": i})
                if i % 10 == 0:
                    client.update_memory(memory.id, content=f"Written by {tag} at {i}.")

    threads = [threading.Thread(target=write, args=(proc, proc.data_dir.name)) for proc in (a, b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    caught_up([a, b, c], dsn)

    def seen(proc: DaemonProcess) -> dict[str, Any]:
        with Client(proc.socket_path, timeout=TIMEOUT) as client:
            return {
                "records": [msgspec.to_builtins(client.recall(k)) for k in ("contended", "contended-0", "contended-1", "contended-2")],
                "memory": msgspec.to_builtins(client.get_memory(memory.id)),
            }

    assert_views_equal([a, b, c], dsn, history_text=False)
    views = [seen(proc) for proc in (a, b, c)]
    assert views[0] == views[1] == views[2]
    with psycopg.connect(dsn) as conn:  # the database's: the last committed
        body = conn.execute("SELECT body FROM persistent WHERE key = %s", (b"contended",)).fetchone()[0]
    assert views[0]["records"][0]["value"] == decode_mutation(bytes(body)).record.value


def test_a_follower_whose_connection_is_killed_misses_nothing(team: tuple[str, list[DaemonProcess]]) -> None:
    dsn, (a, b, c) = team
    with Client(b.socket_path, timeout=TIMEOUT) as cb:
        node = cb.stats()["store"]["feed"]["node"]
        reconnects = cb.stats()["store"]["feed"]["reconnects"]
    with psycopg.connect(dsn, autocommit=True) as conn, Client(a.socket_path, timeout=TIMEOUT) as ca:
        for i in range(3):
            killed = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
                (f"eurekamem-feed-{node}",),
            ).fetchone()[0]
            assert killed == 1 or i > 0  # the first time it is surely connected
            for j in range(5):
                ca.remember(f"during-cut-{i}-{j}", j)
    caught_up([b], dsn)
    with Client(c.socket_path, timeout=TIMEOUT) as cc, psycopg.connect(dsn) as conn:
        # node c only ever read, in every test of the module: what it projected of the others'
        # writes (memories/, skills/) was not taken by its own scans for a write of another program
        quiet = cc.stats()["store"]["feed"]["node"]
        assert conn.execute("SELECT count(*) FROM mutations WHERE node = %s", (quiet,)).fetchone()[0] == 0
    with Client(b.socket_path, timeout=TIMEOUT) as cb:
        assert [cb.recall(f"during-cut-{i}-{j}").value for i in range(3) for j in range(5)] == [0, 1, 2, 3, 4] * 3
        assert cb.stats()["store"]["feed"]["reconnects"] > reconnects


def test_a_mixed_load_on_three_nodes_ends_with_every_view_equal_to_the_database(
    team: tuple[str, list[DaemonProcess]],
) -> None:
    """Each node writes, at once, a seeded random mix over a few shared keys of every tier (records
    put and forgotten, graph nodes and edges, memories added, updated and deleted, skills, messages);
    once quiet, every node's view equals the tables'."""
    import random

    dsn, procs = team
    with Client(procs[0].socket_path, timeout=TIMEOUT) as ca:
        shared = [ca.add_memory("mix", "fact", f"Shared {i}", f"Shared memory number {i}.").memory.id for i in range(3)]
        theorems = [ca.add_theorem(f"T{i}", f"statement {i}", domain="mix").node_id for i in range(3)]
    caught_up(procs, dsn)

    def load(proc: DaemonProcess, seed: int) -> None:
        rng = random.Random(seed)
        with Client(proc.socket_path, timeout=TIMEOUT) as client:
            for i in range(30):
                op = rng.randrange(7)
                key = f"mix-{rng.randrange(4)}"
                if op == 0:
                    client.remember(key, {"seed": seed, "i": i})
                elif op == 1:
                    client.forget(key)
                elif op == 2:
                    client.link(rng.choice(theorems), rng.choice(theorems), rng.choice(["uses", "generalizes"]))
                elif op == 3:
                    client.update_memory(rng.choice(shared), content=f"Rewritten by {seed} at {i}.")
                elif op == 4:
                    client.put_skill(f"mix-skill-{rng.randrange(2)}", f"Step {i} of {seed}.")
                elif op == 5:
                    client.append_messages("mix", [{"id": f"{seed}-{i}", "role": "user", "text": f"message {i}"}])
                else:
                    added = client.add_memory("mix", "fact", f"Added {seed}-{i}", f"Added by {seed} at step {i}.").memory
                    if rng.random() < 0.5:
                        client.delete_memory(added.id, purge=rng.random() < 0.5)

    threads = [threading.Thread(target=load, args=(proc, seed)) for seed, proc in enumerate(procs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    assert_views_equal(procs, dsn, history_text=False)


def _trimmed(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT seq FROM feed_trim").fetchone()
    return int(row[0]) if row else 0


def _wait_trimmed_past(dsn: str, seq: int) -> None:
    """Wait (bounded) until a node trimmed the feed past `seq` (it does so every retention/4 s)."""
    deadline = time.monotonic() + DEADLINE
    while _trimmed(dsn) <= seq:
        assert time.monotonic() < deadline, f"the feed was not trimmed past {seq}"
        time.sleep(0.1)


def test_a_stopped_node_catches_up_and_one_the_feed_was_trimmed_past_reloads(tmp_path: Path, postgres_dsn: str) -> None:
    """With a short retention: a node stopped while another writes is trimmed past (it is not seen),
    and its restart loads the tables; a node suspended (SIGSTOP) while the feed is trimmed past
    what it applied stops when it wakes, saying so (exit status 1), and its restart loads the tables."""
    dsn = postgres_dsn
    retention = ("--feed-retention", "2")
    a = _daemon(tmp_path / "a", tmp_path / "a.sock", dsn, *retention).start()
    b = _daemon(tmp_path / "b", tmp_path / "b.sock", dsn, *retention).start()
    try:
        with Client(a.socket_path, timeout=TIMEOUT) as ca:
            ca.remember("before", 1)
            caught_up([b], dsn)
            assert b.terminate() == 0
            for i in range(20):
                ca.remember(f"while-stopped-{i}", i)
            _wait_trimmed_past(dsn, _head(dsn) - 1)
            b.start()
            with Client(b.socket_path, timeout=TIMEOUT) as cb:
                assert [cb.recall(f"while-stopped-{i}").value for i in range(20)] == list(range(20))  # type: ignore[union-attr]
            assert_views_equal([a, b], dsn)

            assert b.proc is not None
            os.kill(b.proc.pid, signal.SIGSTOP)
            try:
                for i in range(20):
                    ca.remember(f"while-suspended-{i}", i)
                _wait_trimmed_past(dsn, _head(dsn) - 1)
            finally:
                os.kill(b.proc.pid, signal.SIGCONT)
            assert b.wait_exit() == 1
            assert "the feed was trimmed to seq" in b.output
            b.start()
            assert_views_equal([a, b], dsn)
    finally:
        a.kill()
        b.kill()


def test_a_version_2_database_gets_the_feed_and_keeps_its_rows(postgres_dsn: str) -> None:
    """Schema 3 adds the feed's columns and tables to a version 2 database (the rows written before
    name no node: every node applies them like another node's), and start-up's load reads the
    feed's head in its snapshot."""
    from eurekamem.daemon.postgres.store import SCHEMA_VERSION, PostgresStore
    from eurekamem.daemon.recovery import Recovered, load_from_store
    from eurekamem.daemon.retrieval.embed import make_embedder

    store = PostgresStore(postgres_dsn, pool_size=1)
    store.open()
    store._commit_sync([record_put("old")])
    store.close()
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:  # as version 2 was
        conn.execute("ALTER TABLE mutations DROP COLUMN node, DROP COLUMN txn")
        conn.execute("DROP TABLE nodes, feed_trim")
        conn.execute("UPDATE schema_version SET version = 2")
    store = PostgresStore(postgres_dsn, pool_size=1)
    store.open()
    try:
        store.identify("n1")
        store._commit_sync([record_put("new")], 7)
        loaded = load_from_store(store, Recovered(make_embedder("e5-small")))
        assert sorted(loaded.persistent.records) == ["new", "old"]
        assert store.loaded_seq == 2
    finally:
        store.close()
    with psycopg.connect(postgres_dsn) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("SELECT seq, node, txn FROM mutations ORDER BY seq").fetchall() == [(1, "", 0), (2, "n1", 7)]


def record_put(key: str) -> Any:
    from eurekamem.daemon.tiers.persistent import PutRecord
    from eurekamem.protocol import CrossRunRecord

    at = "2026-01-01T00:00:00Z"
    return PutRecord(CrossRunRecord(record_id=key, key=key, value=key, created_at=at, updated_at=at))


async def test_batches_committed_at_once_share_a_transaction_and_a_refused_one_fails_alone(postgres_dsn: str) -> None:
    """PostgresStore.commit: batches that arrive while a transaction commits go together in the next
    one (one flush: the feed's lock lets one commit at a time); a batch the server refuses fails
    alone, the others of its group commit."""
    from test_postgres import _memory

    from eurekamem.daemon.memory.records import PutMemory
    from eurekamem.daemon.postgres.store import PostgresStore
    from eurekamem.daemon.storage.store import StoreUnavailable

    store = PostgresStore(postgres_dsn, pool_size=4)
    await trio.to_thread.run_sync(store.open)
    failed: list[str] = []
    try:
        async def commit(key: str) -> None:
            if key == "refused":  # a version beyond the integer column: the server refuses the row
                batch: list[Any] = [PutMemory(_memory("m-refused", "text"), "", b"", version=2**40)]
            else:
                batch = [record_put(key)]
            try:
                await store.commit(batch)
            except StoreUnavailable as exc:
                failed.append(f"{key}: {exc.code}")

        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(commit, f"r{i}")
        with psycopg.connect(postgres_dsn) as conn:
            transactions = conn.execute("SELECT count(DISTINCT xmin::text) FROM mutations").fetchone()[0]
        async with trio.open_nursery() as nursery:
            for i in range(20, 25):
                nursery.start_soon(commit, f"r{i}")
            nursery.start_soon(commit, "refused")
    finally:
        await trio.to_thread.run_sync(store.close)
    assert failed == ["refused: read_only"]
    with psycopg.connect(postgres_dsn) as conn:
        keys = {bytes(k).decode() for (k,) in conn.execute("SELECT key FROM persistent").fetchall()}
    assert keys == {f"r{i}" for i in range(25)}
    assert transactions < 20  # grouped (the first alone, then what waited meanwhile)


# --- the re-apply rule, without a database --------------------------------------------------------


async def test_a_node_converges_to_the_feeds_order_whatever_the_interleaving() -> None:
    """A simulated node (one tier: key -> value) writes keys itself, applied at once and committed
    later (the feed gets them then; a commit of unknown outcome is rolled back here), while other
    nodes commit the same keys and the follower decides on the feed's rows one at a time and
    applies them between the node's batches (the actor's rule: not while a commit is in flight).
    Whatever the interleaving, once the follower reached the head the state is the feed replayed
    in order; and a node alone (nothing foreign, every commit kept) skips every own row. And at
    every step between the node's batches, it reads its own writes: each key holds what the feed
    holds through the seq the follower applied, but where a commit the node kept is past it, the
    latest such (an own row applied again must not hide a newer own write: issue 26, the
    kill-and-promote test's archived memory read back active, with its old title)."""
    for seed in range(400):
        await _simulate(seed)


async def _simulate(seed: int) -> None:
    import random

    rng = random.Random(seed)
    own = OwnCommits(parts=lambda mutation: [("t", mutation)])  # one tier, of (key, value)
    log: list[tuple[int, bool, int, str, int]] = []  # (seq, own, txn, key, value)
    kept_txns: dict[int, bool] = {}
    state: dict[str, int] = {}
    batch: tuple[int, str, int, int | None, bool] | None = None  # the commit in flight: txn, key, value, before, kept
    decided: list[tuple[int, str, int]] = []  # rows the follower decided to apply, not applied yet
    followed = skipped = 0
    alone = seed % 5 == 0

    def flush() -> None:
        if not decided:
            return
        for _seq, k, v in decided:
            state[k] = v
        for k, v in own.unreached("t"):  # the hand-off's own commits past the chunk, again (the rule)
            state[k] = v
        own.applied = decided[-1][0]
        decided.clear()

    def reads_its_own_writes() -> None:
        seen = _replayed([row for row in log if row[0] <= own.applied])
        for seq, is_own, txn, k, value in log:
            if is_own and seq > own.applied and kept_txns.get(txn):
                seen[k] = value
        assert state == seen, (seed, step)

    for step in range(80):
        event = rng.random()
        key = rng.choice("ab")
        if event < 0.25 and batch is None:  # the node writes: applied now, its commit begins
            flush()  # the feed's applies run between batches
            batch = (own.begin(), key, step, state.get(key), alone or rng.random() < 0.85)
            state[key] = step
        elif event < 0.45 and batch is not None:  # the commit ends: kept, or of unknown outcome (rolled back)
            txn, k, value, before, kept = batch
            log.append((len(log) + 1, True, txn, k, value))
            if not kept:
                if before is None:
                    del state[k]
                else:
                    state[k] = before
            own.end(txn, kept, [(k, value)])
            kept_txns[txn] = kept
            batch = None
        elif event < 0.65 and not alone:  # another node commits
            log.append((len(log) + 1, False, 0, key, 1000 + step))
        elif followed < len(log):  # the follower decides on the next row
            seq, is_own, txn, k, value = log[followed]
            if await own.wanted(seq, is_own, txn):
                decided.append((seq, k, value))
            else:
                skipped += 1
            followed += 1
            if batch is None and rng.random() < 0.5:
                flush()
        if batch is None:
            reads_its_own_writes()
    if batch is not None:
        txn, k, value, _before, _kept = batch
        log.append((len(log) + 1, True, txn, k, value))
        own.end(txn, True, [(k, value)])
    for seq, is_own, txn, k, value in log[followed:]:
        if await own.wanted(seq, is_own, txn):
            decided.append((seq, k, value))
    flush()
    assert state == _replayed(log), seed
    if alone:
        assert skipped == sum(1 for row in log[:followed] if row[1]), seed


def _replayed(log: list[tuple[int, bool, int, str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for _seq, _own, _txn, key, value in log:
        out[key] = value
    return out


async def test_an_own_row_waits_for_its_commit_to_end() -> None:
    """The follower may read a commit's rows before the committing node heard its COMMIT return:
    it waits for that, then skips the rows (kept, nothing applied since) or applies them (not kept)."""
    own = OwnCommits()
    decided: list[bool] = []
    for kept in (True, False):
        txn = own.begin()
        async with trio.open_nursery() as nursery:

            async def ask(txn: int = txn) -> None:
                decided.append(await own.wanted(own.applied + 1, True, txn))

            nursery.start_soon(ask)
            await trio.testing.wait_all_tasks_blocked()
            assert len(decided) == (0 if kept else 1)
            own.end(txn, kept)
        own.applied += 1
    assert decided == [False, True]


def test_status_shows_the_node_its_lag_and_the_other_nodes() -> None:
    from eurekamem.cli.calls import feed_lines

    feed = {
        "node": "9f3c", "name": "lab-1", "applied_seq": 90, "head_seq": 100, "lag_seqs": 10, "lag_seconds": 0.25,
        "nodes": [{"node": "77aa", "name": "lab-2", "applied_seq": 100, "seen_seconds_ago": 1.5}],
    }
    assert feed_lines(feed) == [
        "  node     lab-1 (9f3c): applied seq 90 of 100, 10 behind (0.25 s)",
        "    node lab-2 (77aa): applied seq 100, seen 1.5 s ago",
    ]
    assert feed_lines(None) == []  # the journal, or the durable tiers not serving yet

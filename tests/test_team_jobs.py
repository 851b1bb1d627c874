"""The team's job queue (store = postgres, daemon/postgres/jobqueue.py): several real daemons on one
real PostgreSQL, their LLM the loopback stub, run by this process, which counts each job's calls.

What it checks: jobs accepted on any node run once across the nodes; a node killed -9 mid-job
loses its lease and another node runs the job, whose result is committed once; a node that lost
its lease (stopped while another took the job over) commits nothing; jobs.* answers alike on every
node and cancels a job another node runs; the claim, the lease and the guarded commit themselves,
on the database alone.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest
import trio
from test_extraction import THEORY_STATE

from daemon_process import DaemonProcess
from eurekamem.client import Client
from eurekamem.daemon.jobs.state import CommitJob, JobRecord, SessionInput, StaleAttempt
from eurekamem.daemon.llm.loopback import LoopbackLLM
from eurekamem.daemon.postgres.jobqueue import TeamQueue
from eurekamem.daemon.postgres.store import PostgresStore
from eurekamem.daemon.recovery import decode_mutation
from eurekamem.daemon.storage.store import StoreUnavailable

pytestmark = pytest.mark.postgres

TIMEOUT = 30.0
# short where a test waits out an expired lease; longer where none should expire (a node starved of
# CPU on a loaded machine may renew late: another node would then take its job over, rightly)
SHORT_LEASE = ["--jobs-lease", "3", "--jobs-lease-renew", "0.5"]
LEASE = ["--jobs-lease", "15", "--jobs-lease-renew", "0.5"]
MARKER = re.compile(r"Domain: (team-[a-z]+-\d+)")


class CountingLLM(LoopbackLLM):
    """The loopback LLM, counting its calls per marker: a session extraction's session (the domain
    its prompt names), else the tool asked for (`conversation_memories`: a conversation group's
    extraction); a call whose marker is in `holds` is held until that event is set (or the server
    closes). `peak` is the most calls of one marker ever in flight at once."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.arrived: dict[str, threading.Event] = {}
        self.holds: dict[str, threading.Event] = {}
        self.in_flight: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.most_in_flight = 0
        self.counting = threading.Condition()
        super().__init__()

    def respond(self, path: str, headers: dict[str, str], body: Any) -> Any:
        found = MARKER.search(json.dumps(body).replace("\\n", "\n"))
        tools = body.get("tools") if isinstance(body, dict) else None
        marker = found.group(1) if found else str(tools[0].get("name", "")) if tools else ""
        with self.counting:
            self.calls[marker] += 1
            self.in_flight[marker] += 1
            self.peak[marker] = max(self.peak[marker], self.in_flight[marker])
            self.most_in_flight = max(self.most_in_flight, sum(self.in_flight.values()))
            self.arrived.setdefault(marker, threading.Event()).set()
            self.counting.notify_all()
        try:
            hold = self.holds.get(marker)
            if hold is not None:
                hold.wait(TIMEOUT)
            return super().respond(path, headers, body)
        finally:
            with self.counting:
                self.in_flight[marker] -= 1

    def wait_for(self, marker: str) -> None:
        assert self.arrived.setdefault(marker, threading.Event()).wait(TIMEOUT), f"no LLM call for {marker}"

    def wait_calls(self, count: int) -> None:
        with self.counting:
            assert self.counting.wait_for(lambda: sum(self.calls.values()) >= count, TIMEOUT), dict(self.calls)


@pytest.fixture
def llm() -> Iterator[CountingLLM]:
    server = CountingLLM()
    yield server
    server.close()


def node(tmp_path: Path, name: str, dsn: str, llm: CountingLLM, *extra: str, lease: list[str] = LEASE) -> DaemonProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "EUREKACLAW_FAST_MODEL")}
    env.update(ANTHROPIC_BASE_URL=llm.url("anthropic"), ANTHROPIC_API_KEY="sk-test-team")
    return DaemonProcess(
        tmp_path / name, tmp_path / f"{name}.sock", "--store", "postgres", "--postgres-dsn", dsn, *lease, *extra, env=env
    )


def started(*procs: DaemonProcess) -> tuple[DaemonProcess, ...]:
    """The daemons started at once, each waited for until it serves."""
    for proc in procs:
        proc.start(expect_ready=False)
    for proc in procs:
        proc.wait_for_line("serving on")
    return procs


def close_session(proc: DaemonProcess, marker: str, theory: bool = False) -> str:
    """A session closed on `proc`: its extraction job's id (the job's prompt names `marker`)."""
    with Client(proc.socket_path, timeout=TIMEOUT) as c:
        c.call("episodic.log", {"session_id": marker, "agent_role": "theory", "content": f"worked on {marker}"})
        params: dict[str, Any] = {"session_id": marker, "domain": marker}
        if theory:
            params["theory_state"] = THEORY_STATE
        closed = c.call("session.close", params)
    assert isinstance(closed["job_id"], str)
    return str(closed["job_id"])


def commits_of(dsn: str) -> Counter[str]:
    """How many CommitJob mutations (a job's result with its completion) the database holds, per job."""
    counted: Counter[str] = Counter()
    with psycopg.connect(dsn) as conn:
        for (body,) in conn.execute("SELECT body FROM mutations ORDER BY seq"):
            mutation = decode_mutation(bytes(body))
            if isinstance(mutation, CommitJob):
                counted[mutation.job.id] += 1
    return counted


def listed(proc: DaemonProcess) -> list[dict[str, Any]]:
    with Client(proc.socket_path, timeout=TIMEOUT) as c:
        return [dict(job) for job in c.call("jobs.list", {"limit": 100})]


def stop(*procs: DaemonProcess) -> None:
    for proc in procs:
        proc.kill()
        if os.environ.get("DEBUG_TEAM"):
            print(proc.output)


def test_jobs_accepted_on_two_nodes_each_run_once(tmp_path: Path, postgres_dsn: str, llm: CountingLLM) -> None:
    a, b = started(*(node(tmp_path, n, postgres_dsn, llm, "--jobs-concurrency", "1") for n in "ab"))
    try:
        # the first session's call is held until another node calls too: both nodes run jobs at once
        first = "team-each-0"
        llm.holds[first] = threading.Event()
        ids = {first: close_session(a, first)}
        llm.wait_for(first)
        for i in range(1, 7):
            marker = f"team-each-{i}"
            ids[marker] = close_session(a if i % 2 else b, marker)
        llm.wait_calls(2)
        assert llm.most_in_flight == 2  # one node runs one job at a time (concurrency 1): the other runs one too
        llm.holds[first].set()
        for marker, job_id in ids.items():
            with Client((a if marker[-1] in "02468" else b).socket_path, timeout=TIMEOUT) as c:
                job = c.wait_job(job_id, timeout=TIMEOUT)
            assert job["state"] == "done" and job["attempts"] == 1, job
        assert {marker: llm.calls[marker] for marker in ids} == {marker: 1 for marker in ids}
        assert commits_of(postgres_dsn) == Counter({job_id: 1 for job_id in ids.values()})
        on_a, on_b = listed(a), listed(b)
        assert on_a == on_b and {job["id"] for job in on_a} == set(ids.values())
        assert all(job["state"] == "done" and job["waiting_reason"] is None for job in on_a)
        with Client(a.socket_path, timeout=TIMEOUT) as ca, Client(b.socket_path, timeout=TIMEOUT) as cb:
            stats_a, stats_b = ca.stats()["jobs"]["team"], cb.stats()["jobs"]["team"]
        assert stats_a["node"] != stats_b["node"] and stats_a["claims"] >= 1 and stats_b["claims"] >= 1
        assert stats_a["claims"] + stats_b["claims"] == len(ids)
        # a result delivered through the node that does not run the job completes it once; the
        # running node's attempt finds its lease lost and commits nothing
        delivered = "team-learned-1"
        held = llm.holds[delivered] = threading.Event()
        learned_id = close_session(a, delivered)
        llm.wait_for(delivered)
        runner, other = running_node(postgres_dsn, learned_id, a, b)
        item = {"category": "pitfalls", "title": "Bernstein needs a variance bound", "content": "Check the variance first."}
        with Client(other.socket_path, timeout=TIMEOUT) as c:
            assert c.call("session.learned", {"job_id": learned_id, "items": [item]})["state"] == "done"
        runner.wait_for_line(f"job {learned_id}: this node's lease on it is lost")
        held.set()
        # an orderly shutdown gives its running job back at once (queued, not a counted failure)
        given = "team-given-1"
        llm.holds[given] = threading.Event()
        given_id = close_session(a, given)
        llm.wait_for(given)
        runner, other = running_node(postgres_dsn, given_id, a, b)
        del llm.holds[given]
        assert runner.terminate() == 0
        with Client(other.socket_path, timeout=TIMEOUT) as c:
            job = c.wait_job(given_id, timeout=TIMEOUT)
        assert job["state"] == "done" and job["attempts"] == 2 and llm.calls[given] == 2
        assert commits_of(postgres_dsn)[learned_id] == 1 and commits_of(postgres_dsn)[given_id] == 1
        with psycopg.connect(postgres_dsn) as conn:
            failures = [decode_mutation(bytes(body)).job.failures for (body,) in conn.execute(
                "SELECT body FROM jobs WHERE id = %s AND slot = 'last'", (given_id.encode(),))]
        assert failures == [0]
    finally:
        stop(a, b)


def running_node(dsn: str, job_id: str, a: DaemonProcess, b: DaemonProcess) -> tuple[DaemonProcess, DaemonProcess]:
    """(the node that holds the running job, the other): the database's job_queue names it."""
    with psycopg.connect(dsn) as conn:
        state, holder = conn.execute("SELECT state, node FROM job_queue WHERE id = %s", (job_id.encode(),)).fetchone()
    assert state == "running"
    with Client(a.socket_path, timeout=TIMEOUT) as c:
        return (a, b) if c.stats()["jobs"]["team"]["node"] == holder else (b, a)


def test_a_node_killed_mid_job_loses_it_to_another(tmp_path: Path, postgres_dsn: str, llm: CountingLLM) -> None:
    a = node(tmp_path, "a", postgres_dsn, llm, lease=SHORT_LEASE).start()
    b: DaemonProcess | None = None
    try:
        marker = "team-killed-1"
        llm.holds[marker] = threading.Event()  # a's call never comes back: a is killed meanwhile
        job_id = close_session(a, marker, theory=True)
        llm.wait_for(marker)
        b = node(tmp_path, "b", postgres_dsn, llm, lease=SHORT_LEASE).start()
        with Client(b.socket_path, timeout=TIMEOUT) as c:
            assert c.call("jobs.get", {"id": job_id})["state"] == "running"  # a holds it, on b's word too
            del llm.holds[marker]  # the next call (b's) is answered at once
            a.kill()
            job = c.wait_job(job_id, timeout=TIMEOUT)
        assert job["state"] == "done" and job["attempts"] == 2, job
        assert llm.calls[marker] == 2 and commits_of(postgres_dsn)[job_id] == 1
        with psycopg.connect(postgres_dsn) as conn:
            row = conn.execute("SELECT state, node FROM job_queue WHERE id = %s", (job_id.encode(),)).fetchone()
        with Client(b.socket_path, timeout=TIMEOUT) as c:
            assert row == ("done", c.stats()["jobs"]["team"]["node"])
            memories = c.call("memory.list", {"domain": marker})
            assert memories["total"] > 0 and len({m["fingerprint"] for m in memories["memories"]}) == memories["total"]
    finally:
        stop(a, *([b] if b else []))


def test_a_node_that_lost_its_lease_commits_nothing(tmp_path: Path, postgres_dsn: str, llm: CountingLLM) -> None:
    """a is stopped (SIGSTOP) mid-job past its lease; b takes the job over and completes it; a, resumed
    and answered, commits nothing. A job a runs is cancelled through b: a finds out and stops it."""
    a, b = started(
        node(tmp_path, "a", postgres_dsn, llm, lease=SHORT_LEASE),
        node(tmp_path, "b", postgres_dsn, llm, "--jobs-concurrency", "1", lease=SHORT_LEASE),
    )
    assert a.proc is not None
    try:
        with Client(b.socket_path, timeout=TIMEOUT) as c:  # b is busy with a held job: it claims nothing more
            busy = "team-busy-1"
            llm.holds[busy] = threading.Event()
            busy_id = close_session(b, busy)
            llm.wait_for(busy)
            marker = "team-stopped-1"
            held = llm.holds[marker] = threading.Event()
            job_id = close_session(a, marker)
            llm.wait_for(marker)
            a.proc.send_signal(signal.SIGSTOP)
            try:
                del llm.holds[marker]  # b's call will be answered at once
                llm.holds[busy].set()  # b is free: it takes the job over once a's lease expired
                job = c.wait_job(job_id, timeout=TIMEOUT)
                assert job["state"] == "done" and job["attempts"] == 2, job
                assert c.wait_job(busy_id, timeout=TIMEOUT)["state"] == "done"
            finally:
                a.proc.send_signal(signal.SIGCONT)
            held.set()  # a's held call is answered now: its attempt ends, and writes nothing
            a.wait_for_line(f"job {job_id}: ")
        assert commits_of(postgres_dsn)[job_id] == 1 and llm.calls[marker] == 2
        with Client(a.socket_path, timeout=TIMEOUT) as c:
            assert c.call("jobs.get", {"id": job_id})["state"] == "done"  # a's own view, from the database
            # cancel a job through the node that does not run it: the runner's attempt stops at its
            # renewal, nothing of it is committed
            cancelled = "team-cancelled-1"
            llm.holds[cancelled] = threading.Event()
            cancelled_id = close_session(a, cancelled)
            llm.wait_for(cancelled)
            runner, other = running_node(postgres_dsn, cancelled_id, a, b)
            with Client(other.socket_path, timeout=TIMEOUT) as co:
                assert co.call("jobs.cancel", {"id": cancelled_id})["state"] == "cancelled"
            runner.wait_for_line(f"job {cancelled_id}: this node's lease on it is lost")
            llm.holds[cancelled].set()
            assert c.call("jobs.get", {"id": cancelled_id})["state"] == "cancelled"
            assert commits_of(postgres_dsn)[cancelled_id] == 0
            # retried through a, it runs again (on either node) and completes once
            assert c.call("jobs.retry", {"id": cancelled_id})["state"] == "queued"
            with Client(b.socket_path, timeout=TIMEOUT) as cb:
                assert cb.wait_job(cancelled_id, timeout=TIMEOUT)["state"] == "done"
        assert listed(a) == listed(b)
        assert commits_of(postgres_dsn)[cancelled_id] == 1 and llm.calls[cancelled] == 2
    finally:
        a.proc.send_signal(signal.SIGCONT)
        stop(a, b)


def test_lanes_and_debounce_hold_across_nodes(tmp_path: Path, postgres_dsn: str, llm: CountingLLM) -> None:
    """One conversation group on two nodes: a flush on each while a job of the group is queued makes
    one job; a second job of the group waits, on both nodes, while the first runs; never two
    extractions of the group at once."""
    group, tool = "team-lane", "conversation_memories"

    def said(first: int, last: int) -> list[dict[str, Any]]:
        return [{"id": f"m{i}", "role": "user", "sender": "Lena", "text": f"I keep notebook {i} of the proof"} for i in range(first, last)]

    a = node(tmp_path, "a", postgres_dsn, llm).start()
    b: DaemonProcess | None = None
    try:
        with Client(a.socket_path, timeout=TIMEOUT) as ca:
            ca.append_messages(group, said(0, 3))
            held = llm.holds[tool] = threading.Event()
            first = ca.flush(group)
            assert first is not None
            llm.wait_for(tool)  # a runs the first job; its call is held
            del llm.holds[tool]  # later calls are answered at once
            b = node(tmp_path, "b", postgres_dsn, llm).start()  # b loads the group from the database
            with Client(b.socket_path, timeout=TIMEOUT) as cb:
                for c in (ca, cb):  # the same messages on both nodes (the change feed will spare this)
                    c.append_messages(group, said(3, 5))
                second = ca.flush(group)  # the first job's window does not cover m3, m4: a new job
                assert second is not None and second != first
                assert cb.flush(group) == second  # b's flush joins it: decided on the database's rows
                assert [j["id"] for j in cb.call("jobs.list", {"kind": "conversation.extract"})] == [second, first]
                b.wait_for_line(f"job {second}: waiting for job {first}")  # b looked, and left it to its lane
                assert cb.call("jobs.get", {"id": second})["state"] == "queued"
                held.set()
                for c in (ca, cb):
                    assert c.wait_job(second, timeout=TIMEOUT)["state"] == "done"
                    assert c.wait_job(first, timeout=TIMEOUT)["state"] == "done"
        assert llm.calls[tool] == 2 and llm.peak[tool] == 1
        assert commits_of(postgres_dsn) == Counter({first: 1, second: 1})
    finally:
        stop(a, *([b] if b else []))


# --- the queue on the database alone ----------------------------------------------------------------


def session_input(name: str) -> SessionInput:
    return SessionInput(session_id=name, domain=name)


async def test_the_commit_of_a_lost_lease_writes_nothing(postgres_dsn: str) -> None:
    store = PostgresStore(postgres_dsn, pool_size=2)
    store.open()
    try:
        first = TeamQueue(store, "node-one", lease=30.0, renew=5.0)
        second = TeamQueue(store, "node-two", lease=30.0, renew=5.0)
        with trio.fail_after(TIMEOUT):
            found, created = await first.accept("session.extract", "k1", session_input("s1"), "job-1", lambda r: True, 5)
            assert created and found is not None and found[0].state == "queued"
            lane = lambda kind, job_input: None  # noqa: E731
            claim = await first.claim(2, ["session.extract"], 5, lane)
            [(started, _, token)] = claim.claimed
            assert started.state == "running" and started.attempts == 1 and claim.ended == []
            assert (await second.claim(2, ["session.extract"], 5, lane)).claimed == []  # leased: not claimable
            with psycopg.connect(postgres_dsn) as conn:  # the lease expires (its node stopped renewing)
                conn.execute("UPDATE job_queue SET lease_until = now() - interval '1 second'")
            [(again, _, token2)] = (await second.claim(2, ["session.extract"], 5, lane)).claimed
            assert again.attempts == 2 and again.failures == 1 and "lease expired" in (again.last_failure or "")
            assert await first.renew_leases({"job-1": token}) == {"job-1"}  # the first node finds out
            done = msgspec.structs.replace(started, state="done", result={"by": "one"})
            with pytest.raises(StaleAttempt):
                await first.commit([CommitJob(done)], "job-1", token)
            assert commits_of(postgres_dsn)["job-1"] == 0
            done2 = msgspec.structs.replace(again, state="done", result={"by": "two"})
            await second.commit([CommitJob(done2)], "job-1", token2)
            assert commits_of(postgres_dsn)["job-1"] == 1
            now = await first.get("job-1")
            assert now is not None and isinstance(now[0], JobRecord) and now[0].result == {"by": "two"}
    finally:
        store.close()


async def test_a_node_stopped_holding_the_feed_lock_holds_the_team_only_briefly(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction holding the feed's lock (a node stopped mid-claim: SIGSTOP, a paused VM) is
    ended by the server once idle for FEED_HOLD_LIMIT, so the other nodes' claims and commits go on;
    reads and lease renewals never wait for that lock at all."""
    from eurekamem.daemon.postgres import store as store_module

    store = PostgresStore(postgres_dsn, pool_size=2)
    store.open()
    try:
        queue = TeamQueue(store, "node-one", lease=30.0, renew=5.0)
        for limit, then in (("15s", "read"), ("1s", "write")):
            monkeypatch.setattr(store_module, "FEED_HOLD_LIMIT", limit)
            stuck = psycopg.connect(postgres_dsn)  # the stopped node's connection, in its transaction
            stuck.execute("SET idle_in_transaction_session_timeout = '20s'")  # this test never hangs
            store_module.take_feed_lock(stuck.cursor())
            try:
                if then == "read":
                    with trio.fail_after(5):  # well within the holder's 15 s
                        assert await queue.get("job-x") is None
                        assert await queue.jobs(None, None, 10) == []
                        assert await queue.renew_leases({}) == set()
                    stuck.rollback()  # the node wakes and ends its transaction
                else:
                    with trio.fail_after(TIMEOUT):  # goes through once the server ended the idle holder
                        _, created = await queue.accept("session.extract", "k", session_input("s"), "job-x", lambda r: True, 5)
                    assert created
                    with pytest.raises(psycopg.Error) as ended:  # the woken node finds its session ended
                        stuck.execute("SELECT 1")
                    answer = store_module.classify(ended.value)  # rolled back: its writes answer retryable
                    assert answer.code == "unavailable", answer
            finally:
                stuck.close()
        # stopped mid-renewal: its row lock would keep the job (its lease expired) from the other nodes
        lane = lambda kind, job_input: None  # noqa: E731
        [(_, _, token)] = (await queue.claim(1, ["session.extract"], 5, lane)).claimed
        with psycopg.connect(postgres_dsn) as conn:
            conn.execute("UPDATE job_queue SET lease_until = now() - interval '1 second'")
        renewed, woken, outcome = threading.Event(), threading.Event(), []
        held: list[Any] = []

        def renew_then_stop(conn: Any, leases: dict[str, str]) -> set[str]:
            kept = queue._renew(conn, leases)
            held.append(conn)
            renewed.set()
            woken.wait(TIMEOUT)  # the node stops here, its transaction open
            return kept

        def renewal() -> None:
            try:
                queue._transaction(renew_then_stop, ({"job-x": token},), False)
            except Exception as exc:  # what the woken node's renewal answers: checked below
                outcome.append(exc)

        thread = threading.Thread(target=renewal)
        thread.start()
        try:
            assert renewed.wait(TIMEOUT)
            other = TeamQueue(store, "node-two", lease=30.0, renew=5.0)
            assert (await other.claim(1, ["session.extract"], 5, lane)).claimed == []  # the row is locked
            ended, _, _ = select.select([held[0].fileno()], [], [], 20)  # the server ends the session (1 s)
            assert ended, "the stopped node's transaction was not ended"
            [(again, _, _)] = (await other.claim(1, ["session.extract"], 5, lane)).claimed
            assert again.attempts == 2
        finally:
            woken.set()
            thread.join(TIMEOUT)
        [failed] = outcome  # its renewal was rolled back, and says so
        assert isinstance(failed, StoreUnavailable) and failed.code == "unavailable", failed
    finally:
        store.close()


async def test_old_finished_jobs_are_purged_for_the_team(postgres_dsn: str) -> None:
    """TeamQueue.purge keeps the newest finished jobs; a queued one is never purged."""
    store = PostgresStore(postgres_dsn, pool_size=2)
    store.open()
    try:
        queue = TeamQueue(store, "node-one", lease=30.0, renew=5.0)
        with trio.fail_after(TIMEOUT):
            for i in range(4):
                await queue.accept("session.extract", f"k{i}", session_input(f"s{i}"), f"job-{i}", lambda r: True, 5)
            for _ in range(3):
                [(record, _, token)] = (await queue.claim(1, ["session.extract"], 5, lambda kind, job_input: None)).claimed
                await queue.commit([CommitJob(msgspec.structs.replace(record, state="done"))], record.id, token)
            assert sorted(await queue.purge(keep=1)) == ["job-0", "job-1"]
            assert await queue.purge(keep=1) == []
            assert await queue.get("job-0") is None and await queue.get("job-2") is not None
            assert [record.id for record, _ in await queue.jobs(None, None, 10)] == ["job-3", "job-2"]
    finally:
        store.close()


def test_a_lease_is_renewed_before_it_expires() -> None:
    from eurekamem.daemon import Config

    with pytest.raises(ValueError, match="jobs_lease_renew"):
        Config(data_dir=Path("/tmp/x"), socket_path=Path("/tmp/x.sock"), jobs_lease=5.0, jobs_lease_renew=5.0)
    config = Config(data_dir=Path("/tmp/x"), socket_path=Path("/tmp/x.sock"))
    assert (config.jobs_lease, config.jobs_lease_renew) == (30.0, 5.0)


def test_a_version_2_database_gets_its_job_queue(postgres_dsn: str) -> None:
    """Schema 3 adds job_queue: the jobs a version 2 database holds get their rows, in queue order."""
    from eurekamem.daemon.jobs.state import AcceptJob, PutJob
    from eurekamem.daemon.postgres.store import SCHEMA_VERSION

    store = PostgresStore(postgres_dsn, pool_size=1)
    store.open()
    try:
        queued = JobRecord(id="j1", kind="session.extract", key="k1", state="queued", created_at="2026-01-01T00:00:00Z")
        done = msgspec.structs.replace(queued, id="j2", key="k2")
        store._commit_sync([AcceptJob(queued, session_input("s1")), AcceptJob(done, session_input("s2"))])
        store._commit_sync([PutJob(msgspec.structs.replace(done, state="done", attempts=1))])
    finally:
        store.close()
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE job_queue")  # as a version 2 database was
        conn.execute("UPDATE schema_version SET version = 2")
    store = PostgresStore(postgres_dsn, pool_size=1)
    store.open()
    store.close()
    with psycopg.connect(postgres_dsn) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == SCHEMA_VERSION == 3
        rows = conn.execute("SELECT id, key, state, attempts FROM job_queue ORDER BY created").fetchall()
    assert [(bytes(i), bytes(k), s, a) for i, k, s, a in rows] == [(b"j1", b"k1", "queued", 0), (b"j2", b"k2", "done", 1)]

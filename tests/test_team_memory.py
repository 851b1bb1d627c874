"""Several daemons on one PostgreSQL (issue 26 §2): tier 4's decisions made once for the team.

What it checks: two real daemons on one real database. Two nodes adding the same memory, or a
near duplicate of it, at once make one memory (one created, the other merged or skipped), on
every node and in the tables, round after round (seeded texts); feedback sent to both nodes at
once counts every signal once, on the committed record (no update lost); two nodes approving one
review request at once approve it once (the other answers that it is approved already);
maintenance asked for on both nodes at once runs once, and never on two nodes at a time (daemon/memory/concurrency.py,
daemon/memory/maintenance.py). The clients of the two nodes are lined up with a barrier; what is
asserted holds whatever the interleaving, so a run cannot pass by luck of timing (a node that
decided on its own state alone makes two memories in most rounds).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import psycopg
import pytest
from test_feed import TIMEOUT, assert_views_equal, caught_up, nodes

from daemon_process import DaemonProcess
from eurekamem.client import Client
from eurekamem.daemon.recovery import decode_mutation

ROUNDS = 12
WORDS = "martingale concentration bound variance freedman azuma increments bounded filtration".split()


@pytest.fixture(scope="module")
def pair(postgres_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[DaemonProcess]]]:
    """Two nodes on one database, shared by the module's tests (each writes its own domains)."""
    # the team's queue looked at twice a second (its default, 5 s, would make the maintenance test wait)
    yield from nodes(postgres_server, tmp_path_factory.mktemp("team-memory"), ("a", "b"), "--jobs-lease-renew", "0.5")


def at_once(procs: list[DaemonProcess], calls: list[Callable[[Client], Any]]) -> list[Any]:
    """calls[i] on a client of procs[i], all released together (a barrier); their answers."""
    clients = [Client(proc.socket_path, timeout=TIMEOUT) for proc in procs]
    barrier = threading.Barrier(len(procs))
    answers: list[Any] = [None] * len(procs)

    def run(i: int) -> None:
        barrier.wait(TIMEOUT)
        try:
            answers[i] = calls[i](clients[i])
        except Exception as exc:  # the answer, checked by the test
            answers[i] = exc

    try:
        for client in clients:
            client.connect()
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(procs))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(TIMEOUT)
    finally:
        for client in clients:
            client.close()
    return answers


def table_memories(dsn: str) -> list[Any]:
    """The memories in the database's table (what a node loading it would hold)."""
    with psycopg.connect(dsn) as conn:
        return [decode_mutation(bytes(body)).memory for (body,) in conn.execute("SELECT body FROM memories").fetchall()]


def test_two_nodes_adding_one_memory_at_once_make_one(pair: tuple[str, list[DaemonProcess]]) -> None:
    dsn, (a, b) = pair
    rng = random.Random(2026)
    domains = []
    for round_ in range(ROUNDS):
        domain = f"race-{round_}"
        domains.append(domain)
        words = rng.sample(WORDS, 7)
        title = " ".join(words[:3]).capitalize()
        content = " ".join(words) + "."
        if round_ % 2:  # a near duplicate: the same words and one more (keyword overlap, EurekaClaw's rule)
            other = content[:-1] + " " + rng.choice(["holds", "applies", "works"]) + "."
        else:  # the same text: an exact duplicate
            other = content
        answers = at_once(
            [a, b],
            [
                lambda c, d=domain, t=title, x=content: c.add_memory(d, "proof_strategy", t, x),
                lambda c, d=domain, t=title, x=other: c.add_memory(d, "proof_strategy", t, x),
            ],
        )
        decisions = sorted(answer.decision for answer in answers)
        assert decisions[0] == "created" and decisions[1] in ("merged", "skipped"), (round_, answers)
        assert answers[0].memory.id == answers[1].memory.id, round_
    caught_up([a, b], dsn)
    for proc in (a, b):
        with Client(proc.socket_path, timeout=TIMEOUT) as client:
            for domain in domains:
                assert client.list_memories(domain).total == 1, (proc.data_dir.name, domain)
    in_tables = [memory.domain for memory in table_memories(dsn) if memory.domain.startswith("race-")]
    assert sorted(in_tables) == sorted(domains)
    assert_views_equal([a, b], dsn, history_text=False)


def test_feedback_on_two_nodes_at_once_counts_each_signal_once(pair: tuple[str, list[DaemonProcess]]) -> None:
    dsn, (a, b) = pair
    with Client(a.socket_path, timeout=TIMEOUT) as client:
        memory = client.add_memory("feedback", "fact", "Used often", "A memory both nodes reinforce.").memory
    caught_up([b], dsn)
    rounds = 10
    for _ in range(rounds):
        answers = at_once([a, b], [lambda c: c.memory_feedback([memory.id], "used")] * 2)
        assert [answer.updated for answer in answers] == [1, 1]
    caught_up([a, b], dsn)
    for proc in (a, b):
        with Client(proc.socket_path, timeout=TIMEOUT) as client:
            assert client.get_memory(memory.id).used_count == 2 * rounds, proc.data_dir.name
    (stored,) = [m for m in table_memories(dsn) if m.id == memory.id]
    assert stored.used_count == 2 * rounds
    assert_views_equal([a, b], dsn, history_text=False)


def test_two_nodes_approving_one_request_at_once_approve_it_once(pair: tuple[str, list[DaemonProcess]]) -> None:
    dsn, (a, b) = pair
    for round_ in range(4):
        with Client(a.socket_path, timeout=TIMEOUT) as client:
            memory = client.add_memory(f"review-{round_}", "fact", "Worth sharing", f"A general fact number {round_}.").memory
            request = client.promote_memory(memory.id, "general")
        assert request.state == "pending"
        caught_up([b], dsn)
        answers = at_once([a, b], [lambda c, r=request.review_id: c.approve_review(r)] * 2)
        approved = [answer for answer in answers if not isinstance(answer, Exception)]
        refused = [answer for answer in answers if isinstance(answer, Exception)]
        assert len(approved) == 1 and len(refused) == 1, answers
        assert "approved already" in str(refused[0])
        caught_up([a, b], dsn)
        for proc in (a, b):
            with Client(proc.socket_path, timeout=TIMEOUT) as client:
                views = [msgspec.to_builtins(v) for v in client.reviews("any", f"review-{round_}")]
                assert [v["state"] for v in views] == ["approved"], proc.data_dir.name
                assert client.get_memory(memory.id).scope == "global"
    assert_views_equal([a, b], dsn, history_text=False)


def test_maintenance_asked_on_two_nodes_at_once_runs_once(pair: tuple[str, list[DaemonProcess]]) -> None:
    dsn, (a, b) = pair

    def runs() -> int:
        with psycopg.connect(dsn) as conn:
            return int(conn.execute("SELECT count(*) FROM maintenance").fetchone()[0])

    before = runs()
    jobs: dict[str, Any] = {}
    for _ in range(3):
        answers = at_once([a, b], [lambda c: c.maintain()] * 2)
        with Client(b.socket_path, timeout=TIMEOUT) as client:
            ran = sorted((client.wait_job(job_id, timeout=TIMEOUT) for job_id in set(answers)), key=lambda job: job.created_at)
        assert all(job.state == "done" for job in ran), ran
        # one job for both requests, unless the later request came once the first run had started
        # (then it is a run of its own, after: the rule, whatever the timing)
        assert len(ran) == 1 or ran[1].created_at >= (ran[0].started_at or ""), ran
        jobs.update((job.id, job) for job in ran)
    assert runs() == before + len(jobs)  # each job ran (its MaintenanceRecord), none twice
    spans = sorted((job.started_at or "", job.finished_at or "") for job in jobs.values())
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:]))  # one at a time
    caught_up([a, b], dsn)
    for proc in (a, b):
        with Client(proc.socket_path, timeout=TIMEOUT) as client:
            assert len(client.jobs(kind="memory.maintain")) == len(jobs), proc.data_dir.name

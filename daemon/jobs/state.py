"""The job queue's durable state: job records, their captured inputs, and the mutations that change them.

Rules kept here:
- A job is journaled when accepted (AcceptJob carries its whole input: a session's events and its
  TheoryState, copied at session.close, never read later from state that may have moved on).
- Every later change carries the whole job record (PutJob), so replay is idempotent like every tier.
- A job's result is journaled in ONE record with its completion: CommitJob holds the finished job
  and every other tier's mutations (memories, graph nodes and edges, persistent records). At run
  time each tier's actor applies its own part (daemon/tier.py: staging); at replay recovery hands
  each part to the tier that MUTATION_TIER names. So a crash either finds the job unfinished (it
  runs again; nothing of it was applied) or finds it done with all of its result: never twice,
  never half.
- A job found `running` at start was interrupted (a crash, a kill -9: an orderly shutdown journals
  its running jobs `queued` again): it is queued again (`load_finished`), and the interruption is a
  counted failure.
- The attempt cap: an attempt that fails in a way that may be the job's own (interrupted, an LLM
  timeout, a server error) is counted (`failures`); at `max_attempts` counted failures the job is
  `failed` with the reason and is not started again until jobs.retry, which re-arms it (the count
  starts over). What is not the job's doing (no provider, no key, a refused key, a connection
  refused, a rate limit) is never counted: those jobs wait as long as it takes.
- A session.extract job may also be completed by what its client extracted with its own LLM
  (session.learned): the delivered items go through the job's own rules and its one-record commit,
  which completes the job whatever its state but done or cancelled (a running attempt is stopped
  and finds itself stale at its commit), so a session's memories are made exactly once.
- The input of a done job is dropped (its result is what counts); a failed or cancelled job keeps
  its input for jobs.retry. At most MAX_FINISHED finished jobs are kept, the oldest purged first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

import msgspec

from ...protocol import EpisodicEntry, Job, JobTokens, ProtocolError, TheoryState, now_rfc3339
from ...protocol import methods as m
from ..conversation.state import MoveMark, PutSummary
from ..memory.records import MaintenanceRecord, PutMemory
from ..memory.review import PutReview
from ..skills.state import PutSkill
from ..tier import TierState, Undo, handles
from ..tiers.graph import PutEdge, PutNode
from ..tiers.persistent import PutRecord

ACTIVE = ("queued", "running")
FINISHED = ("done", "failed", "cancelled")
MAX_FINISHED = 10_000


class StaleAttempt(Exception):
    """The attempt is no longer the job's current one (jobs.cancel got in first, or a restart)."""


class JobRecord(msgspec.Struct, kw_only=True):
    """A job as journaled: the wire's Job without waiting_reason (not durable), plus its key."""

    id: str
    kind: str
    key: str  # what makes two requests the same job (session.close twice: one job)
    state: str
    created_at: str
    started_at: str | None = None
    finished_at: str | None = None
    attempts: int = 0
    error: str | None = None
    result: Any = None
    input_tokens: int = 0
    output_tokens: int = 0
    failures: int = 0  # counted failed attempts since the job was accepted or retried (the attempt cap)
    last_failure: str | None = None  # the latest counted failure's reason


class SessionInput(msgspec.Struct, tag="session.extract", kw_only=True):
    """What a session extraction reads, captured at session.close."""

    session_id: str
    domain: str  # as given ("" = none given: memories go to "general")
    theory_state: TheoryState | None = None
    events: list[EpisodicEntry] = []
    events_dropped: int = 0  # older events not captured (the capture is bounded)


class MaintainInput(msgspec.Struct, tag="memory.maintain", kw_only=True):
    """Tier 4's maintenance (daemon/memory/maintenance.py): it reads the memories when it runs, so its
    input says only what asked for it."""

    trigger: str  # sys.maintain | nightly | catch-up
    requested_at: str


class ConversationInput(msgspec.Struct, tag="conversation.extract", kw_only=True):
    """A conversation group's extraction (daemon/jobs/conversation.py): it reads the group's messages
    past the high-water mark when it runs (they are journaled already, and the mark moves only with
    the job's result), so its input names the group and what asked."""

    group: str
    trigger: str  # conversation.flush | periodic
    requested_at: str


JobInput = SessionInput | MaintainInput | ConversationInput  # tagged: the journal and the snapshot say which


class AcceptJob(msgspec.Struct, tag="jobs.accept"):
    job: JobRecord
    input: JobInput


class PutJob(msgspec.Struct, tag="jobs.put"):
    job: JobRecord


class PurgeJob(msgspec.Struct, tag="jobs.purge"):
    id: str


Part: TypeAlias = (
    PutMemory | PutReview | MaintenanceRecord | PutNode | PutEdge | PutRecord | PutSkill | MoveMark | PutSummary
)


class CommitJob(msgspec.Struct, tag="jobs.commit"):
    """A finished job and everything it changed in the other tiers: one journal record."""

    job: JobRecord
    parts: list[Part] = []


class JobsState(TierState):
    """Jobs by id in creation order, their inputs, and the key index."""

    name = "jobs"

    def __init__(self, max_attempts: int) -> None:
        """`max_attempts`: counted failures before a job fails (Config.jobs_max_attempts; recovery
        builds the state with Config's default, and the JobsActor, its owner, sets the configured one)."""
        super().__init__()
        self.jobs: dict[str, JobRecord] = {}
        self.inputs: dict[str, JobInput] = {}
        self.by_key: dict[str, str] = {}
        self._by_state = {state: 0 for state in ACTIVE + FINISHED}
        # why a queued or running job waits (not durable): the JobsActor, which owns this state, sets the hook
        self.why_waiting: Callable[[str], str | None] = lambda job_id: None
        self.cancelled_running: list[str] = []  # running jobs jobs.cancel cancelled in the batch in progress
        self.max_attempts = max_attempts
        self.purging = True  # purge_old keeps MAX_FINISHED; False where the team's queue owns the jobs (jobqueue.py)

    def now(self) -> str:
        """Jobs change through internal calls as well as batches: always the current time."""
        return now_rfc3339()

    # --- reading -----------------------------------------------------------------------------------

    def view(self, record: JobRecord) -> Job:
        waiting = self.why_waiting(record.id) if record.state in ACTIVE else None
        return Job(
            id=record.id,
            kind=record.kind,
            state=record.state,
            created_at=record.created_at,
            started_at=record.started_at,
            finished_at=record.finished_at,
            attempts=record.attempts,
            error=record.error,
            result=record.result,
            tokens=JobTokens(input=record.input_tokens, output=record.output_tokens),
            waiting_reason=waiting,
        )

    def record(self, job_id: str) -> JobRecord:
        record = self.jobs.get(job_id)
        if record is None:
            raise ProtocolError("not_found", f"no job with id {job_id!r}", id=job_id)
        return record

    @handles("jobs.get")
    def do_get(self, p: m.JobRef) -> Job:
        return self.view(self.record(p.id))

    @handles("jobs.list")
    def do_list(self, p: m.JobsList) -> list[Job]:
        out: list[Job] = []
        for record in reversed(self.jobs.values()):  # newest first
            if (p.state is None or record.state == p.state) and (p.kind is None or record.kind == p.kind):
                out.append(self.view(record))
                if len(out) >= p.limit:
                    break
        return out

    def counts(self) -> dict[str, int]:
        """Jobs by state (kept by _set: O(1))."""
        return dict(self._by_state)

    def queued(self) -> list[tuple[str, str, bool]]:
        """(id, kind, has its input) of every queued job, oldest first."""
        return [(r.id, r.kind, r.id in self.inputs) for r in self.jobs.values() if r.state == "queued"]

    # --- changing ----------------------------------------------------------------------------------

    @handles("jobs.cancel")
    def do_cancel(self, p: m.JobRef) -> Job:
        record = self.record(p.id)
        if record.state not in ACTIVE:
            return self.view(record)  # finished already: nothing to cancel
        if record.state == "running":
            self.cancelled_running.append(record.id)
        return self.view(self.finish(record, "cancelled", error="cancelled by jobs.cancel"))

    @handles("jobs.retry")
    def do_retry(self, p: m.JobRef) -> Job:
        record = self.record(p.id)
        if record.state not in ("failed", "cancelled"):
            return self.view(record)  # queued, running or done: nothing to retry
        if record.id not in self.inputs:
            raise ProtocolError("invalid_params", f"job {record.id} has no input left to run again", id=record.id)
        retried = msgspec.structs.replace(
            record, state="queued", error=None, finished_at=None, failures=0, last_failure=None
        )
        self.commit(PutJob(retried))
        return self.view(retried)

    def accept(self, kind: str, key: str, job_input: JobInput, job_id: str) -> tuple[JobRecord, bool]:
        """A new job (journaled by the caller's batch), or the job that already has this key."""
        existing = self.by_key.get(key)
        if existing is not None and existing in self.jobs:
            return self.jobs[existing], False
        record = JobRecord(id=job_id, kind=kind, key=key, state="queued", created_at=self.now())
        self.commit(AcceptJob(record, job_input))
        return record, True

    def accept_coalesced(
        self, kind: str, key: str, job_input: JobInput | None, job_id: str, covers: Callable[[JobRecord], bool]
    ) -> tuple[JobRecord | None, bool]:
        """Debounce: the newest job with this key if it is queued, or if `covers(it)` (it will read,
        or has read, everything the request is about); else a new job (journaled by the caller's
        batch: `by_key` then names it), or (None, False) when `job_input` is None (nothing to do)."""
        existing = self.jobs.get(self.by_key.get(key, ""))
        if existing is not None and (existing.state == "queued" or covers(existing)):
            return existing, False
        if job_input is None:
            return None, False
        record = JobRecord(id=job_id, kind=kind, key=key, state="queued", created_at=self.now())
        self.commit(AcceptJob(record, job_input))
        return record, True

    def queued_inputs(self) -> list[tuple[str, str, JobInput | None]]:
        """(id, kind, its input or None) of every queued job, oldest first."""
        return [(r.id, r.kind, self.inputs.get(r.id)) for r in self.jobs.values() if r.state == "queued"]

    def start(self, job_id: str) -> tuple[JobRecord, JobInput] | None:
        """Mark a queued job running (one more attempt); None if it is no longer queued, or if it has
        failed max_attempts times already (it is failed now, with the reason: the module's rule)."""
        record = self.jobs.get(job_id)
        if record is None or record.state != "queued" or job_id not in self.inputs:
            return None
        if record.failures >= self.max_attempts:
            self.finish(record, "failed", error=self.gave_up(record.failures, record.last_failure))
            return None
        started = msgspec.structs.replace(record, state="running", started_at=self.now(), attempts=record.attempts + 1)
        self.commit(PutJob(started))
        return started, self.inputs[job_id]

    def is_current(self, job_id: str, attempt: int) -> bool:
        """Is this attempt of the job still the one running (not cancelled, not restarted)?"""
        record = self.jobs.get(job_id)
        return record is not None and record.state == "running" and record.attempts == attempt

    def gave_up(self, failures: int, last: str | None) -> str:
        return f"gave up after {failures} failed attempts (jobs_max_attempts {self.max_attempts}); last: {last}"

    def requeue(
        self, job_id: str, attempt: int, tokens: tuple[int, int], failure: str | None = None
    ) -> JobRecord | None:
        """The attempt could not reach the LLM: queued again, with the tokens it spent. `failure`:
        the reason, when the failure counts towards the cap (then the job may be failed instead)."""
        if not self.is_current(job_id, attempt):
            return None
        record = self.jobs[job_id]
        spent = msgspec.structs.replace(
            record,
            input_tokens=record.input_tokens + tokens[0],
            output_tokens=record.output_tokens + tokens[1],
        )
        if failure is not None:
            spent = msgspec.structs.replace(spent, failures=spent.failures + 1, last_failure=failure)
            if spent.failures >= self.max_attempts:
                return self.finish(spent, "failed", error=self.gave_up(spent.failures, failure))
        queued = msgspec.structs.replace(spent, state="queued")
        self.commit(PutJob(queued))
        return queued

    def requeue_stopped(self, job_ids: list[str]) -> int:
        """An orderly shutdown: the jobs whose attempts it stopped, still running, queued again (not
        counted as failures). Returns how many."""
        count = 0
        for job_id in job_ids:
            record = self.jobs.get(job_id)
            if record is not None and record.state == "running":
                self.commit(PutJob(msgspec.structs.replace(record, state="queued")))
                count += 1
        return count

    def requeue_in_memory(self, job_id: str) -> None:
        """Queued again without a journal record: what recovery makes of the `running` the journal
        holds (the journal refused the attempt's own write)."""
        record = self.jobs[job_id]
        self._set(job_id, msgspec.structs.replace(record, state="queued"), self.inputs.get(job_id))

    def fail(self, job_id: str, attempt: int, error: str, tokens: tuple[int, int]) -> JobRecord | None:
        if not self.is_current(job_id, attempt):
            return None
        record = self.jobs[job_id]
        spent = msgspec.structs.replace(
            record, input_tokens=record.input_tokens + tokens[0], output_tokens=record.output_tokens + tokens[1]
        )
        return self.finish(spent, "failed", error=error)

    def finish(self, record: JobRecord, state: str, *, error: str | None = None, result: Any = None) -> JobRecord:
        finished = msgspec.structs.replace(record, state=state, error=error, result=result, finished_at=self.now())
        self.commit(PutJob(finished))
        self.purge_old()
        return finished

    def completed(self, job_id: str, attempt: int, result: Any, tokens: tuple[int, int]) -> JobRecord:
        """The done record of a job's attempt (for a CommitJob); StaleAttempt if it is not current."""
        if not self.is_current(job_id, attempt):
            raise StaleAttempt(job_id)
        record = self.jobs[job_id]
        return msgspec.structs.replace(
            record,
            state="done",
            error=None,
            result=result,
            finished_at=self.now(),
            input_tokens=record.input_tokens + tokens[0],
            output_tokens=record.output_tokens + tokens[1],
        )

    def deliverable(self, job_id: str) -> tuple[JobRecord, JobInput | None]:
        """A job that results delivered by a client may complete (session.learned): the record, and
        its input while it may (queued, running or failed; None once done or cancelled)."""
        record = self.record(job_id)
        if record.state in ("done", "cancelled"):
            return record, None
        job_input = self.inputs.get(job_id)
        if job_input is None:
            raise ProtocolError("invalid_params", f"job {job_id} has no input left to complete", id=job_id)
        return record, job_input

    def completed_delivered(self, job_id: str, result: Any, tokens: tuple[int, int]) -> JobRecord:
        """The done record of a job whose result a client delivered (queued, running or failed:
        a running attempt is stopped and its own commit finds itself stale); StaleAttempt once it is
        done or cancelled (the daemon's own attempt, or jobs.cancel, got in first)."""
        record = self.jobs.get(job_id)
        if record is None or record.state in ("done", "cancelled"):
            raise StaleAttempt(job_id)
        if record.state == "running":
            self.cancelled_running.append(job_id)
        return msgspec.structs.replace(
            record,
            state="done",
            error=None,
            result=result,
            finished_at=self.now(),
            input_tokens=record.input_tokens + tokens[0],
            output_tokens=record.output_tokens + tokens[1],
        )

    def purge_old(self) -> None:
        if not self.purging:
            return
        if sum(self._by_state[state] for state in FINISHED) <= MAX_FINISHED:
            return
        finished = [record.id for record in self.jobs.values() if record.state in FINISHED]
        for job_id in finished[: max(0, len(finished) - MAX_FINISHED)]:
            self.commit(PurgeJob(job_id))

    def load_finished(self) -> int:
        """After recovery: jobs left running by a crash are queued again, each interruption a counted
        failure (journaled with the next attempt's start). Returns how many."""
        interrupted = [record for record in self.jobs.values() if record.state == "running"]
        for record in interrupted:
            self.interrupted(record, f"the daemon stopped during attempt {record.attempts} (a crash or a kill)")
        return len(interrupted)

    def interrupted(self, record: JobRecord, why: str) -> None:
        """A running job whose attempt ended without a word (a crash, a kill, a lost lease): queued
        again, the interruption a counted failure (journaled with the next attempt's start)."""
        queued = msgspec.structs.replace(
            record, state="queued", failures=record.failures + 1, last_failure=f"interrupted: {why}"
        )
        self._set(record.id, queued, self.inputs.get(record.id))

    def adopt(self, record: JobRecord, job_input: JobInput | None) -> None:
        """The job as the team's queue committed it (daemon/postgres/jobqueue.py decided it): this
        state, a cache of it then, takes it without journaling anything (its input kept if known)."""
        self._set(record.id, record, job_input if job_input is not None else self.inputs.get(record.id))

    # --- mutations ---------------------------------------------------------------------------------

    def apply(self, mutation: Any) -> Undo:
        if isinstance(mutation, AcceptJob):
            return self._change(mutation.job.id, mutation.job, mutation.input)
        if isinstance(mutation, (PutJob, CommitJob)):
            return self._change(mutation.job.id, mutation.job, self.inputs.get(mutation.job.id))
        if isinstance(mutation, PurgeJob):
            return self._change(mutation.id, None, None)
        raise TypeError(f"not a jobs mutation: {mutation!r}")

    def _change(self, job_id: str, record: JobRecord | None, job_input: JobInput | None) -> Undo:
        before = (self.jobs.get(job_id), self.inputs.get(job_id))
        self._set(job_id, record, job_input)
        return lambda: self._set(job_id, *before)

    def _set(self, job_id: str, record: JobRecord | None, job_input: JobInput | None) -> None:
        """Replace (in place: the dict keeps creation order), add, or (record None) remove a job."""
        old = self.jobs.get(job_id)
        if old is not None:
            self._by_state[old.state] -= 1
            if self.by_key.get(old.key) == job_id:
                del self.by_key[old.key]
        if record is None:
            self.jobs.pop(job_id, None)
            self.inputs.pop(job_id, None)
            return
        self.jobs[job_id] = record
        self._by_state[record.state] += 1
        self.by_key[record.key] = job_id
        if job_input is not None and record.state != "done":
            self.inputs[job_id] = job_input
        else:
            self.inputs.pop(job_id, None)


class JobsSnapshot(msgspec.Struct):
    """memory/jobs.snapshot: every job and the inputs still kept."""

    jobs: list[JobRecord]
    inputs: dict[str, JobInput]


def snapshot_of(state: JobsState) -> bytes:
    return msgspec.msgpack.encode(JobsSnapshot(list(state.jobs.values()), dict(state.inputs)))


def load_snapshot(state: JobsState, data: bytes) -> None:
    doc = msgspec.msgpack.decode(data, type=JobsSnapshot)
    for record in doc.jobs:
        state._set(record.id, record, doc.inputs.get(record.id))

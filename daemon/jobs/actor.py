"""The jobs actor: owns the queue's state, schedules jobs, runs them off-actor, commits their results.

Rules kept here:
- The JobsState is read and written only by this actor (its batches, its internal calls, the
  fast path of jobs.get / jobs.list). A job runs in a task of its own that holds no tier's state:
  it asks the LLM, embeds in a worker thread, and reads other tiers through their actors'
  internal calls, so no tier actor ever waits for an LLM.
- A result is applied exactly once, with the job's completion, in ONE journal record (CommitJob).
  The commit first stages this actor (checking that the attempt is still the job's current one: a
  jobs.cancel that got in first ends the commit before anything is applied; one that comes later
  finds the job done), then each tier's part on its own actor, all at once (daemon/tier.py: a
  staged actor applies its part and holds, answering nobody, until released), then completes the
  job on the held jobs state; it journals the one record, then releases every stage: kept if the
  write succeeded, undone otherwise. One commit runs at a time (a lock; nothing else stages), so
  two commits never wait for each other in a cycle, and a tier is held only from its part to the
  journal's answer (one fsync). The commit is shielded from cancellation, so a stage is always
  released.
- At most `concurrency` jobs run at once. A job that cannot reach the LLM (LLMUnavailable, an
  oversized answer included) goes back to `queued` and backs off (the provider's Retry-After, else
  5 s doubling to 5 min, with jitter); with no usable provider at all (none configured, no key)
  nothing is started and every queued job says why in `waiting_reason`. `nudge()` (sys.resume)
  takes a freshly resolved LLM, which counts on from the one it replaces (sys.stats keeps its
  statistics), forgets every back-off and starts what can start; the daemon's restart does the
  same. A job whose answer is unusable (LLMFailed, a judge answer naming unknown ids) fails with
  the reason; it can be run again with jobs.retry. Nothing is ever dropped.
- Every wait says why (`waiting_reason`): a queued job the whole queue's reason (no LLM, read-only,
  every slot taken), its back-off's, or the job of its lane it waits for; a running job what its LLM
  call waits for (the per-minute budget, a back-off before a retry: daemon/llm's report_waits), with
  until when; null only while it is working.
- What an error holds (an LLM error body, a refusal's text) is redacted with the daemon's redaction
  before it is journaled, shown or logged: a job's `error`, its counted failures, `waiting_reason`.
- Shutdown (`stop`) cancels the running attempts before their commit (a commit under way
  finishes): they stay `running` in the journal and recovery queues them again. jobs.wait
  callers are answered at once with the job as it is.
- Lanes: a kind may name a lane for a job's input (`lane(input)`: a conversation group); two jobs
  of one lane never run at once (the scheduler starts a job only while no other job of its lane
  runs; the queue's order is kept within the lane).
- Delivered results (session.learned): a kind with `deliver(ctx, items)` lets a client hand in
  what its own LLM extracted for a job; it is made an Outcome by the kind's own rules and committed
  by the same one-record commit, which completes the job (queued, running or failed; a running
  attempt is stopped and finds itself stale at its commit). A job done or cancelled first is
  answered as it is and nothing is applied: exactly once either way. A queued job waiting for an
  LLM that none is configured for says so from the first look (`no LLM: ...`), so that a client
  can tell at once that it should extract itself.
- The team's queue (store = postgres, `queue` given: daemon/postgres/jobqueue.py): the database
  decides, this actor's state is a cache of it. Jobs are accepted (key, debounce) and claimed there
  (any node may run a job any node accepted: the claim reads its input from the database); every
  write of an attempt (its CommitJob, a requeue, a failure, the requeue at shutdown) is staged on
  this actor and committed only while this node's lease on the job holds (else StaleAttempt:
  nothing of it is applied); leases are renewed every `queue.renew` seconds and a lost one stops
  its attempt; the scheduler also looks at the queue that often (other nodes' jobs, expired
  leases). jobs.get / list / wait read the database; jobs.cancel / retry decide on it (a job
  another node runs finds out at its renewal or its commit). Lanes are the database's (the claim's
  rule); this actor's own lane table only keeps its `waiting_reason`s.
- Test hook: EUREKAMEM_JOBS_PAUSE_AT=answered (after the LLM's last answer, before the commit) or
  committed (after the commit's journal write) makes each job log "jobs: paused at <point>" and
  wait there forever, so that a test can kill -9 the daemon at that point.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import numpy as np
import trio

from ...protocol import Call, Job, ProtocolError, new_id
from ..llm import LLMError, LLMFailed, LLMUnavailable, report_waits
from ..redact import Redactor
from ..storage.store import Store, StoreUnavailable
from ..tier import Internal, Stage, TierActor, Work, handles
from .outcome import COMMIT_ORDER, JobFailed, Outcome
from .state import (
    ACTIVE,
    FINISHED,
    MAX_FINISHED,
    CommitJob,
    JobInput,
    JobRecord,
    JobsState,
    PurgeJob,
    PutJob,
    StaleAttempt,
)

log = logging.getLogger("eurekamem.jobs")
R = TypeVar("R")

PAUSE_VARIABLE = "EUREKAMEM_JOBS_PAUSE_AT"
PAUSE_POINTS = ("answered", "committed")
BACKOFF_BASE = 5.0
BACKOFF_MAX = 300.0
NEEDS_A_PERSON = ("not_configured", "no_key", "auth", "not_found")  # back off the longest
COUNTED = ("timeout", "server_error", "oversized")  # LLMUnavailable kinds counted towards the attempt cap (state.py)


class LLMHandle(Protocol):
    """What jobs need of an LLM client (daemon/llm's LLM is one)."""

    @property
    def available(self) -> bool: ...

    @property
    def unavailable_reason(self) -> str: ...

    async def complete_structured(self, system: str, prompt: str, output_type: Any, *, name: str) -> Any: ...

    def statistics(self) -> dict[str, Any]: ...

    async def aclose(self) -> None: ...


class Tokens:
    def __init__(self) -> None:
        self.input = 0
        self.output = 0

    def add(self, usage: Any) -> None:
        self.input += int(getattr(usage, "input_tokens", 0))
        self.output += int(getattr(usage, "output_tokens", 0))

    def pair(self) -> tuple[int, int]:
        return self.input, self.output


class JobContext:
    """What a running job may use: its input, the LLM (tokens counted), the embedder, other tiers' reads."""

    def __init__(self, actor: JobsActor, record: JobRecord, job_input: JobInput, llm: LLMHandle) -> None:
        self.actor = actor
        self.record = record
        self.input = job_input
        self.llm = llm
        self.tokens = Tokens()
        self.llm_calls = 0

    async def ask(self, system: str, prompt: str, output_type: Any, *, name: str) -> Any:
        """The LLM's validated answer (its value); tokens are counted also when the call fails."""
        self.llm_calls += 1
        try:
            result = await self.llm.complete_structured(system, prompt, output_type, name=name)
        except LLMError as exc:
            self.tokens.add(exc.usage)
            raise
        self.tokens.add(result.usage)
        return result.value

    def redact(self, value: Any, domain: str | None) -> Any:
        """An LLM's answer with secrets (and what the domain's policy names) redacted, before anything
        of it is stored: what daemon/redact.py does to every request's text at dispatch."""
        redactor = self.actor.redactor
        return redactor.value(value, domain) if redactor is not None else value

    async def embed(self, texts: list[str]) -> np.ndarray:
        """Passage embeddings under tier 4's model, in a worker thread (the embedder is thread-safe)."""
        if not texts:
            return np.zeros((0, self.actor.embedder.dim), dtype=np.float32)
        return await trio.to_thread.run_sync(self.actor.embedder.embed_passages, texts)

    async def read(self, tier: str, fn: Callable[[Any], Any]) -> Any:
        """fn(state) run by the tier's own actor, between its batches; fn must not change the state."""
        return await self.actor.tiers[tier].run_internal(fn)


class JobKind(Protocol):
    kind: str
    needs_llm: bool  # False: runs while no LLM is usable too (ctx.llm.available says whether one is)

    async def run(self, ctx: JobContext) -> Outcome: ...


class Delivering(Protocol):
    """A kind whose results a client may deliver (session.learned): `deliver` makes them an Outcome."""

    async def deliver(self, ctx: JobContext, items: list[Any]) -> Outcome: ...


def lane_of(kind: Any, job_input: Any) -> str | None:
    """The job's lane (see the module's rule), or None: a kind without lanes."""
    lane = getattr(kind, "lane", None)
    return lane(job_input) if lane is not None and job_input is not None else None



STORE_RETRY = 5.0  # seconds: jobs paused by a store that could not be reached start again after this
PURGE_EVERY = 60.0  # seconds: team mode's purge of old finished jobs (state.py's purge_old, for the team)
TEAM_CALLS = ("jobs.get", "jobs.list", "jobs.cancel", "jobs.retry")  # answered from the database in team mode

class JobsActor(TierActor):
    ARRIVAL_ORDER = False  # jobs.wait is answered when its job finishes, after later requests

    state: JobsState
    store: Store

    def __init__(
        self,
        state: JobsState,
        store: Store,
        *,
        tiers: dict[str, TierActor],
        kinds: dict[str, JobKind],
        llm: LLMHandle | None = None,
        llm_factory: Callable[[], LLMHandle],
        embedder: Any,
        concurrency: int,
        max_attempts: int,
        rng: random.Random | None = None,
        environ: Any = None,
        redactor: Redactor | None = None,
        queue: Any = None,
    ) -> None:
        super().__init__(state, store, inline=True)
        self.queue = queue  # the team's queue (daemon/postgres/jobqueue.py's TeamQueue), None: this daemon's alone
        self._leases: dict[str, str] = {}  # team mode: job id -> the token of this node's lease on it
        self._clear_backoffs = False  # team mode: sys.resume asked to forget every node's back-offs
        self._lane_waits_logged: set[str] = set()  # team mode: jobs whose wait for their lane was logged
        if queue is not None:
            state.purging = False  # the database holds the jobs; a cache purges nothing
        self.tiers = tiers
        self.kinds = kinds
        self.llm_factory = llm_factory
        self.llm: LLMHandle | None = llm  # None: made by llm_factory when the actor starts
        self._old_llms: list[LLMHandle] = []
        self.embedder = embedder
        self.redactor = redactor  # daemon/redact.py's Redactor: what a job stores is redacted like a request
        self.concurrency = concurrency
        state.max_attempts = max_attempts
        self._rng = rng or random.Random()
        self._running: dict[str, trio.CancelScope] = {}
        self._lanes: dict[str, str] = {}  # lane -> the job of it running now
        self._backoff: dict[str, tuple[float, int, str]] = {}  # job id -> (not before, failures in a row, reason)
        self.waiting_all: str | None = None  # why no queued job can start now (None: they can)
        self._slots_full = False  # waiting_all is "every slot taken" (a back-off says more then)
        self._lane_waits: dict[str, str] = {}  # queued job id -> the job of its lane it waits for (last look)
        self._call_waits: dict[str, str] = {}  # running job id -> what its LLM call waits for now
        state.why_waiting = self._why_waiting
        self._watchers: dict[str, trio.Event] = {}
        self._wake = trio.Event()
        self._stopping = False
        self._nursery: trio.Nursery | None = None
        self._work_scope = trio.CancelScope()  # the scheduler and the running attempts
        self._commit_lock = trio.Lock()  # one commit at a time (the module's rule)
        environ = os.environ if environ is None else environ
        self.pause_at = environ.get(PAUSE_VARIABLE, "")
        if self.pause_at and self.pause_at not in PAUSE_POINTS:
            raise ValueError(f"{PAUSE_VARIABLE} must be one of {PAUSE_POINTS}, not {self.pause_at!r}")
        self.accepted = 0
        self.requeued = 0
        self.commit_time_us = 0.0
        self.tokens_since_start = Tokens()
        self.read_only: str | None = None  # the journal refused a job's write: wait for sys.resume
        # the store could not be reached (StoreUnavailable "unavailable": PostgreSQL away): when to try again by itself
        self._store_retry_at: float | None = None

    # --- the API of the daemon and of other actors ------------------------------------------------

    async def accept(self, kind: str, key: str, job_input: JobInput) -> str:
        """Journal a new job (or find the one with this key) and answer its id once durable."""
        if kind not in self.kinds:
            raise ValueError(f"no job kind {kind!r}")
        job_id = new_id()
        if self.queue is not None:
            found, created = await self._team_accept(kind, key, job_input, job_id, lambda record: True)
            assert found is not None
            record = found[0]
        else:
            record, created = await self.run_internal(lambda state: state.accept(kind, key, job_input, job_id))
        if created:
            self.accepted += 1
        self._wake.set()
        result: str = record.id
        return result

    async def accept_coalesced(
        self, kind: str, key: str, job_input: JobInput | None, covers: Callable[[JobRecord], bool]
    ) -> str | None:
        """The newest job with `key` if it is queued or covers the request, else a new job (journaled
        before this returns; JobsState.accept_coalesced), else None (job_input None: nothing to do).
        The check and the accept are one internal call: two requests never both make a job."""
        if kind not in self.kinds:
            raise ValueError(f"no job kind {kind!r}")
        job_id = new_id()
        if self.queue is not None:
            found, created = await self._team_accept(kind, key, job_input, job_id, covers)
            record = found[0] if found is not None else None
        else:
            record, created = await self.run_internal(
                lambda state: state.accept_coalesced(kind, key, job_input, job_id, covers)
            )
        if created:
            self.accepted += 1
            self._wake.set()
        return record.id if record is not None else None

    async def _team_accept(
        self, kind: str, key: str, job_input: JobInput | None, job_id: str, covers: Callable[[JobRecord], bool]
    ) -> tuple[tuple[JobRecord, JobInput | None] | None, bool]:
        """The team's accept (the queue's rule: decided on the database's rows), adopted by the cache."""
        lane = self._lane(kind, job_input)
        found, created = await self.queue.accept(kind, key, job_input, job_id, covers, self.state.max_attempts, lane)
        if found is not None:
            await self._adopt([found])
        return found, created

    async def _adopt(self, jobs: list[tuple[JobRecord, JobInput | None]]) -> None:
        """Team mode: the jobs as the database holds them, into this actor's state (a cache then)."""
        if jobs:
            await self.run_internal(lambda state: [state.adopt(record, job_input) for record, job_input in jobs])

    async def _team_get(self, job_id: str) -> Job:
        """Team mode: the job as committed, adopted, as this node sees it (ProtocolError not_found)."""
        found = await self.queue.get(job_id)
        if found is None:
            raise ProtocolError("not_found", f"no job with id {job_id!r}", id=job_id)
        await self._adopt([found])
        return await self.run_internal(lambda state: state.view(found[0]))

    def nudge(self, llm: LLMHandle | None = None) -> None:
        """Try again now: a new LLM client (a resolved configuration), back-offs forgotten."""
        if llm is not None:
            if self.llm is not None:
                self._old_llms.append(self.llm)  # running attempts may still use it; closed at stop()
                continue_from = getattr(llm, "continue_from", None)
                if continue_from is not None:
                    continue_from(self.llm)  # sys.stats keeps counting (the module's rule)
            self.llm = llm
        self._backoff.clear()
        self._clear_backoffs = self.queue is not None  # and every node's, in the database
        self.read_only = None
        self._store_retry_at = None
        self._wake.set()

    def _refused(self, exc: StoreUnavailable) -> None:
        """A job's write was refused: no job starts until sys.resume, or, when the store could only
        not be reached (its outcome retryable), until STORE_RETRY seconds have passed."""
        self.read_only = str(exc)
        self._store_retry_at = trio.current_time() + STORE_RETRY if exc.code == "unavailable" else None

    async def stop(self) -> None:
        """Shutdown: no new attempt starts; running ones are cancelled (a commit under way finishes)
        and stay `running` in the journal; every jobs.wait is answered now."""
        self._stopping = True
        stopped = list(self._running)
        leases = dict(self._leases)
        self._work_scope.cancel()
        for event in self._watchers.values():
            event.set()
        while self._running:  # the attempts end at their next checkpoint (a commit first finishes)
            await trio.sleep(0.01)
        if stopped and self.queue is not None:  # each under its lease (the module's rule)
            for job_id in stopped:
                try:
                    await self._write(functools.partial(JobsState.requeue_stopped, job_ids=[job_id]), job_id, leases.get(job_id))
                except (StaleAttempt, StoreUnavailable, trio.ClosedResourceError) as exc:
                    log.warning("jobs: stopped job %s not queued again by this node (%r)", job_id, exc)
        elif stopped:  # queued again in the journal: a shutdown is no failure of theirs (state.py's rule)
            try:
                await self.run_internal(lambda state: state.requeue_stopped(stopped))
            except (StoreUnavailable, trio.ClosedResourceError) as exc:
                log.warning("jobs: %d stopped jobs stay running in the journal (%s)", len(stopped), exc)
        for llm in [self.llm, *self._old_llms]:
            if llm is not None:
                try:
                    await llm.aclose()
                except Exception:
                    log.exception("closing an LLM client failed")

    def llm_status(self) -> str:
        """"available", or why no LLM can be used."""
        if self.llm is None:
            return "not started"
        return "available" if self.llm.available else self.llm.unavailable_reason

    def statistics(self) -> dict[str, Any]:
        """sys.stats' `jobs`: the counts this actor last published and its own counters (no state read)."""
        stats: dict[str, Any] = {
            **self._counts,
            "running_now": len(self._running),
            "concurrency": self.concurrency,
            "waiting_reason": self.waiting_all,
            "backing_off": len(self._backoff),
            "accepted": self.accepted,
            "requeued": self.requeued,
            "tokens": {"input": self.tokens_since_start.input, "output": self.tokens_since_start.output},
            "commit_time_us": round(self.commit_time_us, 1),
        }
        stats["llm"] = self.llm.statistics() if self.llm is not None else {}
        if self.queue is not None:
            stats["team"] = {**self.queue.statistics(), "leases_held": len(self._leases)}
        return stats

    # --- the actor --------------------------------------------------------------------------------

    def submit(self, work: Work) -> None:
        name = work.call.spec.name
        if name in ("jobs.wait", "session.learned") and self._nursery is not None:
            self._nursery.start_soon(self._answer_wait if name == "jobs.wait" else self._answer_learned, work)
            return
        if name in TEAM_CALLS and self.queue is not None and self._nursery is not None:
            self._nursery.start_soon(self._answer_team, work)
            return
        super().submit(work)

    def can_inline(self, call: Call) -> bool:
        if self.queue is not None and call.spec.name in TEAM_CALLS:
            return False  # the database answers (submit)
        return super().can_inline(call)

    async def _answer_team(self, work: Work) -> None:
        """Team mode: jobs.get / list from the database, jobs.cancel / retry decided on it (the module's rule)."""
        await self._answer(work, functools.partial(self._team_call, work.call.spec.name, work.call.params))

    async def _team_call(self, name: str, p: Any) -> Any:
        if name == "jobs.get":
            return await self._team_get(p.id)
        if name == "jobs.list":
            found = await self.queue.jobs(p.state, p.kind, p.limit)
            await self._adopt(found)
            return await self.run_internal(lambda state: [state.view(record) for record, _ in found])
        changed, was_running = await self.queue.change(p.id, name, p, self.state.max_attempts)
        await self._adopt([changed])
        scope = self._running.get(p.id)
        if was_running and scope is not None:
            scope.cancel()  # cancelled here; another node's attempt finds out at its renewal
        self._wake.set()
        return await self.run_internal(lambda state: state.view(changed[0]))

    async def _answer(self, work: Work, answer: Callable[[], Awaitable[Any]]) -> None:
        """Answer `work`, in a task of its own, with what answer() returns or the error it raised."""
        result: Any
        try:
            result = await answer()
        except ProtocolError as exc:
            result = exc
        except StoreUnavailable as exc:
            result = exc.error()
        except (trio.ClosedResourceError, trio.EndOfChannel):
            result = ProtocolError("unavailable", "the daemon is shutting down")
        work.reply.deliver(work.call, result, work.started_ns)
        work.reply.flush()

    async def run(self) -> None:
        if self.llm is None:
            self.llm = self.llm_factory()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._scheduler)
            await super().run()  # until close(): the batches and internal calls
            nursery.cancel_scope.cancel()

    async def _run_batch(self, batch: list[Work]) -> None:
        await super()._run_batch(batch)
        self._after_change()
        if any(work.call.spec.writes for work in batch):  # jobs.retry queued one, jobs.cancel freed a slot
            self._wake.set()

    async def _run_internal_item(self, item: Any) -> None:
        await super()._run_internal_item(item)
        self._after_change()

    async def _run_internals(self, items: list[Internal]) -> None:
        """Consecutive internal calls (accepts, starts, ends of attempts) with ONE journal write
        between them and their answers: concurrent jobs share an fsync instead of queueing for one
        each. A call that raises changed nothing (JobsState's functions check before they commit)."""
        if len(items) == 1:
            await self._run_internal_item(items[0])
            return
        outcomes: list[tuple[Internal, bool, Any]] = []
        for item in items:
            try:
                outcomes.append((item, True, item.fn(self.state)))
            except Exception as exc:
                outcomes.append((item, False, exc))
        mutations = self.state.take_pending()
        if mutations:
            try:
                await self.store.commit(mutations)
            except StoreUnavailable as exc:
                self.state.rollback()
                for item, _, _ in outcomes:
                    item.waiter.fail(exc)
                self._after_change()
                return
            self.state.forget_undo()
        self._publish()
        for item, ok, value in outcomes:
            if ok:
                item.waiter.set(value)
            else:
                item.waiter.fail(value)
        self._after_change()

    def _after_change(self) -> None:
        """After each batch or internal call: cancel the attempts jobs.cancel stopped, answer waits."""
        state: JobsState = self.state
        for job_id in state.cancelled_running:
            record = state.jobs.get(job_id)
            scope = self._running.get(job_id)
            if record is not None and record.state in FINISHED and scope is not None:
                scope.cancel()  # cancelled, or completed by a client's delivered result
        state.cancelled_running.clear()
        for job_id, event in list(self._watchers.items()):
            record = state.jobs.get(job_id)
            if record is None or record.state not in ACTIVE:
                event.set()
                del self._watchers[job_id]

    async def _answer_wait(self, work: Work) -> None:
        p = work.call.params
        await self._answer(work, functools.partial(self._team_wait if self.queue is not None else self._wait, p.id, p.timeout))

    async def _wait(self, job_id: str, timeout: float) -> Job:
        event = await self.run_internal(lambda state: self._watch(state, job_id))
        if event is not None and not self._stopping:
            with trio.move_on_after(timeout):
                await event.wait()
        return await self.run_internal(lambda state: state.view(state.record(job_id)))

    async def _team_wait(self, job_id: str, timeout: float) -> Job:
        """Team mode's jobs.wait: woken by this node's change of the job, and looking at the database
        every `queue.renew` seconds (another node's)."""
        deadline = trio.current_time() + timeout
        while True:
            job = await self._team_get(job_id)
            if job.state not in ACTIVE or self._stopping or trio.current_time() >= deadline:
                return job
            event = await self.run_internal(lambda state: self._watch(state, job_id))
            if event is not None:
                with trio.move_on_at(min(deadline, trio.current_time() + self.queue.renew)):
                    await event.wait()

    async def _answer_learned(self, work: Work) -> None:
        p = work.call.params
        result: Any
        try:
            result = await self.learned(p.job_id, list(p.items))
        except ProtocolError as exc:
            result = exc
        except StoreUnavailable as exc:
            self._refused(exc)
            result = exc.error()
        except (trio.ClosedResourceError, trio.EndOfChannel):
            result = ProtocolError("unavailable", "the daemon is shutting down")
        work.reply.deliver(work.call, result, work.started_ns)
        work.reply.flush()

    async def learned(self, job_id: str, items: list[Any]) -> Job:
        """session.learned: the items a client extracted complete the job, once (the module's rule);
        the job as it is afterwards."""
        if self._stopping:
            raise ProtocolError("unavailable", "the daemon is shutting down")
        if self.queue is not None:
            await self._team_get(job_id)  # the job as committed (another node may have accepted it)
        record, job_input = await self.run_internal(lambda state: state.deliverable(job_id))
        deliver = getattr(self.kinds.get(record.kind), "deliver", None)
        if deliver is None:
            raise ProtocolError(
                "invalid_params", f"job {job_id} is a {record.kind} job: no result can be delivered for it", id=job_id
            )
        if job_input is not None:
            llm = self.llm
            assert llm is not None
            ctx = JobContext(self, record, job_input, llm)
            try:
                outcome = await deliver(ctx, items)
                await self._commit(job_id, record.attempts, outcome, ctx.tokens, delivered=True)
            except StaleAttempt:
                log.info("job %s finished before the delivered result's commit; nothing of it applied", job_id)
            else:
                self._backoff.pop(job_id, None)
                log.info("job %s completed by the result its client delivered (%d items)", job_id, len(items))
            finally:
                self.tokens_since_start.input += ctx.tokens.input
                self.tokens_since_start.output += ctx.tokens.output
                self._wake.set()
        return await self.run_internal(lambda state: state.view(state.record(job_id)))

    @handles("session.learned", "actor")
    async def do_learned(self, call: Call) -> Any:
        """Never run in a batch (its commit stages this actor): submit() hands it to _answer_learned."""
        raise AssertionError("session.learned is answered by _answer_learned, outside the actor's batches")

    @handles("jobs.wait", "actor")
    async def do_wait(self, call: Call) -> Any:
        """Never run in a batch (it would hold the actor while it waits): submit() hands every
        jobs.wait to a task of its own, _answer_wait, which calls this."""
        raise AssertionError("jobs.wait is answered by _answer_wait, outside the actor's batches")

    def _watch(self, state: JobsState, job_id: str) -> trio.Event | None:
        """Run by the actor: an event set when the job leaves queued/running (None: it has already)."""
        if state.record(job_id).state not in ACTIVE:
            return None
        return self._watchers.setdefault(job_id, trio.Event())

    def _why_waiting(self, job_id: str) -> str | None:
        """Why the job waits now (the module's rule), None while it works: state.view asks."""
        if job_id in self._running:
            return self._call_waits.get(job_id)
        record = self.state.jobs.get(job_id)
        if self.queue is not None and record is not None and record.state == "running":
            return None  # it works, on another node
        if self.waiting_all and not self._slots_full:  # read-only, no LLM: nothing starts before that ends
            return self.waiting_all
        llm = self.llm
        if not self.read_only and llm is not None and not llm.available and record is not None:
            if getattr(self.kinds.get(record.kind), "needs_llm", True):  # before the scheduler's first look too
                return f"no LLM: {llm.unavailable_reason}"
        backoff = self._backoff.get(job_id)
        if backoff is not None and backoff[0] > trio.current_time():
            return backoff[2]
        if self.waiting_all:
            return self.waiting_all
        return self._lane_waits.get(job_id, "queued: the scheduler starts it at its next look")

    def _scrubbed(self, text: str) -> str:
        """`text` redacted as a request's would be (every kind any policy redacts): for what an error holds."""
        redactor = self.redactor
        return redactor.text(text) if redactor is not None else text

    # --- scheduling ---------------------------------------------------------------------------------

    async def _scheduler(self) -> None:
        with self._work_scope:
            async with trio.open_nursery() as runners:
                if self.queue is not None:
                    await self._take_back()
                    runners.start_soon(self._renew_leases)
                while not self._stopping:
                    self._wake = trio.Event()
                    deadline = await self._start_ready(runners)
                    with trio.move_on_at(deadline):
                        await self._wake.wait()

    async def _start_ready(self, runners: trio.Nursery) -> float:
        """Start what may start; returns when to look again (inf: when woken)."""
        if self.queue is not None:
            return await self._claim_ready(runners)
        llm = self.llm
        assert llm is not None
        no_llm = None if llm.available else f"no LLM: {llm.unavailable_reason}"
        now = trio.current_time()
        if self.read_only and self._store_retry_at is not None and now >= self._store_retry_at:
            self.read_only = self._store_retry_at = None  # the store may be back: the next write says
        next_look = float("inf")
        self._lane_waits = {}
        for job_id, kind, job_input in await self.run_internal(lambda state: state.queued_inputs()):
            has_input = job_input is not None
            if self.read_only:
                break
            waited = self._backoff.get(job_id)
            if waited is not None and waited[0] > now:
                next_look = min(next_look, waited[0])
                continue
            if len(self._running) >= self.concurrency:
                break
            if no_llm is not None and getattr(self.kinds.get(kind), "needs_llm", True):
                continue  # waits for an LLM; a kind that needs none (memory.maintain) may still start
            if kind not in self.kinds or not has_input:
                await self._fail_now(
                    job_id, f"no job kind {kind!r} in this daemon" if kind not in self.kinds else "its input is missing"
                )
                continue
            lane = lane_of(self.kinds[kind], job_input)
            if lane is not None and lane in self._lanes:
                self._lane_waits[job_id] = (
                    f"waiting for job {self._lanes[lane]} of the same lane ({self._scrubbed(lane)}) to finish"
                )
                continue  # its lane's job runs: it starts after it (the module's rule)
            try:
                started = await self.run_internal(functools.partial(JobsState.start, job_id=job_id))
            except StoreUnavailable as exc:
                self._refused(exc)
                break
            if started is not None:
                record, job_input = started
                if lane is not None:
                    self._lanes[lane] = record.id
                self._running[record.id] = scope = trio.CancelScope()
                runners.start_soon(self._run, record, job_input, scope)
        return self._waiting(no_llm, next_look)

    def _waiting(self, no_llm: str | None, next_look: float) -> float:
        """After a look at the queue: why nothing more starts (waiting_all), and when to look again."""
        self._slots_full = False
        if self.read_only and self._store_retry_at is not None:
            self.waiting_all = f"the store cannot be reached ({self.read_only}); trying again in {STORE_RETRY:.0f} s"
            return self._store_retry_at
        if self.read_only:
            self.waiting_all = f"the daemon is read-only ({self.read_only}); sys.resume lets jobs run again"
            return float("inf")
        if no_llm is not None:
            self.waiting_all = no_llm
            return next_look
        running = len(self._running)
        self._slots_full = running >= self.concurrency
        self.waiting_all = (
            f"waiting for a free slot ({running} running, concurrency {self.concurrency})"
            if running >= self.concurrency
            else None
        )
        return next_look

    def _lane(self, kind: str, job_input: Any) -> str | None:
        return lane_of(self.kinds[kind], job_input) if kind in self.kinds else None

    async def _claim_ready(self, runners: trio.Nursery) -> float:
        """Team mode's look at the queue: claim in the database what this node may run now."""
        llm = self.llm
        assert llm is not None and self.queue is not None
        no_llm = None if llm.available else f"no LLM: {llm.unavailable_reason}"
        now = trio.current_time()
        if self.read_only and self._store_retry_at is not None and now >= self._store_retry_at:
            self.read_only = self._store_retry_at = None
        self._lane_waits = {}
        free = self.concurrency - len(self._running)
        kinds = [name for name, kind in self.kinds.items() if no_llm is None or not getattr(kind, "needs_llm", True)]
        if not self.read_only and free > 0 and kinds:
            try:
                if self._clear_backoffs:
                    await self.queue.clear_backoffs()
                    self._clear_backoffs = False
                claim = await self.queue.claim(free, kinds, self.state.max_attempts, self._lane, list(self._running))
            except StoreUnavailable as exc:
                self._refused(exc)
            else:
                await self._adopt([*claim.ended, *((record, job_input) for record, job_input, _ in claim.claimed)])
                for job_id, why in claim.lane_waits.items():
                    if job_id not in self._lane_waits_logged:
                        log.info("job %s: %s", job_id, self._scrubbed(why))
                self._lane_waits_logged = set(claim.lane_waits)
                self._lane_waits = {job_id: self._scrubbed(why) for job_id, why in claim.lane_waits.items()}
                for record, job_input, token in claim.claimed:
                    lane = self._lane(record.kind, job_input)
                    if lane is not None:
                        self._lanes[lane] = record.id
                    self._leases[record.id] = token
                    self._running[record.id] = scope = trio.CancelScope()
                    runners.start_soon(self._run, record, job_input, scope)
        return self._waiting(no_llm, now + self.queue.renew)  # other nodes' jobs, expired leases: looked for this often

    async def _take_back(self) -> None:
        """Team mode, at start: this node's leases from before its restart are given up (nothing of
        them runs), so that its interrupted jobs run at once, here or on another node."""
        assert self.queue is not None
        try:
            taken = await self.queue.take_back()
        except StoreUnavailable as exc:
            log.warning("jobs: this node's leases from before its start could not be given up (%s); they expire", exc)
            return
        if taken:
            log.info("jobs: %d jobs this node ran before its restart are claimable again", taken)

    async def _renew_leases(self) -> None:
        """Team mode: this node's leases renewed every `queue.renew` seconds; a lost one stops its
        attempt. Every PURGE_EVERY seconds, the old finished jobs purged (MAX_FINISHED are kept)."""
        assert self.queue is not None
        purge_at = trio.current_time()
        while True:
            await trio.sleep(self.queue.renew)
            if trio.current_time() >= purge_at:
                purge_at = trio.current_time() + PURGE_EVERY
                await self._purge()
            held = dict(self._leases)
            if not held:
                continue
            try:
                lost = await self.queue.renew_leases(held)
            except StoreUnavailable as exc:
                log.warning("jobs: the leases on %d jobs could not be renewed (%s)", len(held), exc)
                continue
            for job_id in lost:
                scope = self._running.get(job_id)
                if scope is not None and self._leases.get(job_id) == held[job_id]:
                    log.warning(
                        "job %s: this node's lease on it is lost (cancelled, completed elsewhere, or taken over "
                        "after it expired); its attempt stops, nothing of it is committed", job_id,
                    )
                    scope.cancel()
            for job_id in lost:
                await self._refresh(job_id)

    async def _purge(self) -> None:
        """Team mode: the team's finished jobs past the MAX_FINISHED newest purged, and forgotten here."""
        assert self.queue is not None
        try:
            purged = await self.queue.purge(MAX_FINISHED)
        except StoreUnavailable as exc:
            log.warning("jobs: old finished jobs could not be purged now (%s)", exc)
            return
        if purged:
            await self.run_internal(lambda state: [state.apply(PurgeJob(job_id)) for job_id in purged])
            log.info("jobs: %d old finished jobs purged (the %d newest are kept)", len(purged), MAX_FINISHED)

    async def _refresh(self, job_id: str) -> None:
        """Team mode: the cache takes the job as committed (after a lost lease)."""
        assert self.queue is not None
        try:
            found = await self.queue.get(job_id)
        except StoreUnavailable as exc:
            log.warning("jobs: job %s could not be read again (%s)", job_id, exc)
            return
        if found is not None:
            await self._adopt([found])

    async def _write(self, fn: Callable[[Any], R], job_id: str, token: str | None, not_before: float | None = None) -> R:
        """fn(state)'s change to a job this node runs: committed at once (the journal), or, in team mode,
        staged and committed only while this node's lease on the job holds (StaleAttempt when not)."""
        if self.queue is None:
            return await self.run_internal(fn)
        if token is None:
            raise StaleAttempt(job_id)
        stage = await self.stage(fn)
        try:
            if stage.mutations:
                await self.queue.commit(stage.mutations, job_id, token, not_before=not_before)
        except BaseException:
            stage.release(False)
            raise
        stage.release(True)
        result: R = stage.result
        return result

    async def _fail_now(self, job_id: str, error: str) -> None:
        try:
            await self.run_internal(lambda state: state.finish(state.jobs[job_id], "failed", error=error))
        except StoreUnavailable as exc:
            self._refused(exc)

    # --- one attempt --------------------------------------------------------------------------------

    async def _run(self, record: JobRecord, job_input: JobInput, scope: trio.CancelScope) -> None:
        job_id, attempt = record.id, record.attempts
        llm = self.llm
        assert llm is not None
        ctx = JobContext(self, record, job_input, llm)

        def waiting(reason: str | None) -> None:
            if reason is None:
                self._call_waits.pop(job_id, None)
            else:
                self._call_waits[job_id] = self._scrubbed(reason)

        try:
            with scope, report_waits(waiting):
                try:
                    outcome = await self.kinds[record.kind].run(ctx)
                    await self._pause("answered", job_id)
                    await self._commit(job_id, attempt, outcome, ctx.tokens)
                except LLMUnavailable as exc:
                    await self._requeue(job_id, attempt, ctx.tokens, exc)
                except (LLMFailed, JobFailed) as exc:
                    await self._fail(
                        job_id, attempt, ctx.tokens, f"{'llm' if isinstance(exc, LLMFailed) else 'job'}: {exc}"
                    )
                except StaleAttempt:
                    log.info("job %s: attempt %d was cancelled before its commit; nothing applied", job_id, attempt)
                    if self.queue is not None:
                        await self._refresh(job_id)
                except StoreUnavailable as exc:
                    self._refused(exc)
                    await self.run_internal(lambda s: self._requeue_in_memory(s, job_id, attempt))
                except Exception as exc:
                    log.exception("job %s (%s) failed", job_id, record.kind)
                    await self._fail(job_id, attempt, ctx.tokens, f"internal: {type(exc).__name__}: {exc}")
                else:
                    self._backoff.pop(job_id, None)
                    await self._pause("committed", job_id)
        finally:
            self.tokens_since_start.input += ctx.tokens.input
            self.tokens_since_start.output += ctx.tokens.output
            self._running.pop(job_id, None)
            self._leases.pop(job_id, None)
            self._call_waits.pop(job_id, None)
            for lane, running in list(self._lanes.items()):
                if running == job_id:
                    del self._lanes[lane]
            self._wake.set()

    async def _requeue(self, job_id: str, attempt: int, tokens: Tokens, exc: LLMUnavailable) -> None:
        previous = self._backoff.get(job_id)
        failures = (previous[1] if previous else 0) + 1
        ceiling = BACKOFF_MAX if exc.kind in NEEDS_A_PERSON else min(BACKOFF_MAX, BACKOFF_BASE * 2 ** (failures - 1))
        delay = ceiling / 2 + self._rng.uniform(0, ceiling / 2)
        if exc.retry_after is not None:
            delay = max(delay, exc.retry_after)
        what = "the LLM's answer was refused" if exc.kind == "oversized" else "the LLM is unavailable"
        error = self._scrubbed(str(exc))
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + delay))
        reason = f"{what} ({error}); trying again in {delay:.0f} s, at {at} (sys.resume: now)"
        counted = f"llm: {error}" if exc.kind in COUNTED else None  # towards the attempt cap (state.py's rule)
        self._backoff[job_id] = (trio.current_time() + delay, failures, reason)  # before the job is queued
        try:
            after = await self._write(
                lambda s: s.requeue(job_id, attempt, tokens.pair(), counted), job_id, self._leases.get(job_id), delay
            )
        except StaleAttempt:
            await self._lost(job_id, attempt)
            return
        except StoreUnavailable as exc2:
            self._refused(exc2)
            await self.run_internal(lambda s: self._requeue_in_memory(s, job_id, attempt))
            return
        if after is not None and after.state == "failed":
            self._backoff.pop(job_id, None)
            log.warning("job %s failed: %s", job_id, after.error)
        else:
            self.requeued += 1
            log.warning("job %s: %s", job_id, reason)

    async def _lost(self, job_id: str, attempt: int) -> None:
        """Team mode: the attempt's end was not written (the lease was lost): the job as committed."""
        self._backoff.pop(job_id, None)
        log.info("job %s: attempt %d ended after this node's lease on it was lost; nothing of it written", job_id, attempt)
        await self._refresh(job_id)

    def _requeue_in_memory(self, state: JobsState, job_id: str, attempt: int) -> None:
        """The journal refused the job's write: queued in memory only, which is what recovery would
        make of the `running` the journal holds."""
        if state.is_current(job_id, attempt):
            state.requeue_in_memory(job_id)

    async def _fail(self, job_id: str, attempt: int, tokens: Tokens, error: str) -> None:
        error = self._scrubbed(error)
        log.warning("job %s failed: %s", job_id, error)
        self._backoff.pop(job_id, None)
        try:
            await self._write(lambda s: s.fail(job_id, attempt, error, tokens.pair()), job_id, self._leases.get(job_id))
        except StaleAttempt:
            await self._lost(job_id, attempt)
        except StoreUnavailable as exc:
            self._refused(exc)
            await self.run_internal(lambda s: self._requeue_in_memory(s, job_id, attempt))

    async def _commit(
        self, job_id: str, attempt: int, outcome: Outcome, tokens: Tokens, *, delivered: bool = False
    ) -> None:
        """Apply the outcome in every tier and complete the job with ONE journal record (module rule).
        `delivered`: a client's result (session.learned), for the job in any state but done or cancelled."""
        async with self._commit_lock:
            started = time.perf_counter()
            with trio.CancelScope(shield=True):
                await self._commit_locked(job_id, attempt, outcome, tokens, delivered)
            self.commit_time_us += (time.perf_counter() - started) * 1e6
        await self.run_internal(lambda state: state.purge_old())

    async def _commit_locked(
        self, job_id: str, attempt: int, outcome: Outcome, tokens: Tokens, delivered: bool = False
    ) -> None:
        taken: dict[str, Stage] = {}
        errors: list[Exception] = []

        async def take(tier: str, fn: Callable[[Any], Any]) -> None:
            try:
                taken[tier] = await self.tiers[tier].stage(fn)
            except Exception as exc:  # its actor undid its part; the others are released below
                errors.append(exc)

        def current(state: JobsState) -> None:
            if delivered:
                record = state.jobs.get(job_id)
                if record is None or record.state in ("done", "cancelled"):
                    raise StaleAttempt(job_id)
            elif not state.is_current(job_id, attempt):
                raise StaleAttempt(job_id)

        def complete(state: JobsState) -> JobRecord:
            result = outcome.result({tier: stage.result for tier, stage in taken.items()})
            if delivered:
                done = state.completed_delivered(job_id, result, tokens.pair())
            else:
                done = state.completed(job_id, attempt, result, tokens.pair())
            state.commit(PutJob(done))
            return done

        own = await self.stage(current)  # first: from here no jobs.cancel can get in
        stages: list[Stage] = [own]
        try:
            async with trio.open_nursery() as nursery:  # every tier at once (one commit at a time)
                for tier, fn in outcome.stages.items():
                    nursery.start_soon(take, tier, fn)
            stages += [taken[tier] for tier in COMMIT_ORDER if tier in taken]
            if errors:
                raise errors[0]
            done = own.extend(complete)
            record = CommitJob(done, [mutation for stage in stages[1:] for mutation in stage.mutations])
            if self.queue is None:
                await self.store.commit([record])
            elif delivered:
                await self.queue.commit([record], job_id, None)  # while the job is neither done nor cancelled
            elif job_id in self._leases:
                await self.queue.commit([record], job_id, self._leases[job_id])  # while this node's lease holds
            else:
                raise StaleAttempt(job_id)
        except BaseException:
            for stage in stages:
                stage.release(False)
            raise
        for stage in stages:
            stage.release(True)

    async def _pause(self, point: str, job_id: str) -> None:
        if self.pause_at == point:
            log.warning("jobs: paused at %s (job %s; %s)", point, job_id, PAUSE_VARIABLE)
            await trio.sleep_forever()

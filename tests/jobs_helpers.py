"""Helpers for the job queue's tests: a scripted LLM client, an in-memory journal, a small harness of
actors (persistent, graph, jobs) that runs under trio's MockClock, and a test job kind.

The fake LLM has the shape of daemon/llm's LLM (available, unavailable_reason, complete_structured
returning a StructuredResult, statistics, aclose) and returns values converted to the asked Struct
exactly as the real layer does; the tests of extraction itself go through the real layer instead.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import trio
import trio.testing

from eurekamem.daemon.config import config_default
from eurekamem.daemon.jobs import JobContext, JobsActor, JobsState, Outcome, SessionInput
from eurekamem.daemon.jobs.state import CommitJob
from eurekamem.daemon.llm import StructuredResult, Usage
from eurekamem.daemon.storage.journal_actor import JournalUnavailable
from eurekamem.daemon.storage.store import RTYPE_MUTATION, StoreUnavailable, mutation_encoder
from eurekamem.daemon.tier import TierActor, Work
from eurekamem.daemon.tiers.graph import GraphState
from eurekamem.daemon.tiers.persistent import PersistentState
from eurekamem.protocol import METHODS, Call, ProtocolError
from eurekamem.protocol import methods as m


class Gate:
    """A scripted answer that waits: `entered` is set when the call arrives, `release` lets it answer."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.entered = trio.Event()
        self.release = trio.Event()
        self.cancelled = False


class FakeLLM:
    """A scripted LLM client. Each call takes the next script entry: a dict (the answer's data), an
    exception (raised), or a Gate. Usage is 100 input and 20 output tokens a call."""

    def __init__(self, available: bool = True, reason: str = "") -> None:
        self.available = available
        self.unavailable_reason = reason
        self.script: deque[Any] = deque()
        self.calls: list[tuple[str, str, float]] = []  # (name, prompt, trio time)
        self.closed = False

    async def complete_structured(self, system: str, prompt: str, output_type: Any, *, name: str) -> Any:
        self.calls.append((name, prompt, trio.current_time()))
        action = self.script.popleft()
        if isinstance(action, Gate):
            action.entered.set()
            try:
                await action.release.wait()
            except trio.Cancelled:
                action.cancelled = True
                raise
            action = action.answer
        if isinstance(action, BaseException):
            raise action
        return StructuredResult(msgspec.convert(action, output_type), Usage(100, 20), 1, "fake", "fake-model")

    def statistics(self) -> dict[str, Any]:
        return {"fake": {"calls": len(self.calls)}}

    async def aclose(self) -> None:
        self.closed = True


class FakeJournal:
    """The journal actor's submit, in memory; `gate` holds writes, `fail` refuses them."""

    def __init__(self) -> None:
        self.records: list[tuple[int, bytes]] = []
        self.gate: trio.Event | None = None
        self.fail: str | None = None
        self.fail_code = "read_only"  # or "unavailable": a store that cannot be reached (PostgreSQL away)
        self.entered = trio.Event()

    store_name = "journal"

    async def commit(self, mutations: Any) -> None:
        """The Store seam (daemon/storage/store.py), as the journal actor makes it."""
        await self.submit([(RTYPE_MUTATION, mutation_encoder.encode(m)) for m in mutations])

    async def submit(self, payloads: list[tuple[int, bytes]]) -> int:
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            if self.fail_code != "read_only":
                raise StoreUnavailable(self.fail, self.fail_code)
            raise JournalUnavailable(self.fail)
        self.records.extend(payloads)
        return len(self.records)

    def mutations(self) -> list[Any]:
        from eurekamem.daemon.recovery import mutation_decoder

        return [mutation_decoder.decode(payload) for _, payload in self.records]

    def commits(self) -> list[CommitJob]:
        return [mutation for mutation in self.mutations() if isinstance(mutation, CommitJob)]


class Note(msgspec.Struct):
    text: str


class NoteKind:
    """A test job kind: asks the LLM for a note, writes it as a persistent record and a graph node."""

    kind = "test.note"

    async def run(self, ctx: JobContext) -> Outcome:
        note = await ctx.ask("You write notes.", f"a note on {ctx.input.session_id}", Note, name="note")
        key = f"test.note.{ctx.input.session_id}"

        def persistent(state: PersistentState) -> str:
            return state.do_remember(m.PersistentRemember(key=key, value=note.text)).record_id

        def graph(state: GraphState) -> str:
            return state.do_add_theorem(m.GraphAddTheorem(theorem_name=key, formal_statement=note.text)).node_id

        return Outcome(
            {"persistent": persistent, "graph": graph},
            lambda done: {"record": done["persistent"], "node": done["graph"]},
        )


def note_input(session_id: str) -> SessionInput:
    return SessionInput(session_id=session_id, domain="d")


class Captured:
    """A Reply that keeps what it was given."""

    def __init__(self) -> None:
        self.results: list[Any] = []
        self.arrived = trio.Event()

    def deliver(self, call: Call, result: Any, started_ns: int) -> None:
        self.results.append(result)
        self.arrived.set()

    def flush(self) -> None:
        pass


class Harness:
    def __init__(self, llm: FakeLLM, concurrency: int, kinds: dict[str, Any], max_attempts: int = 5) -> None:
        self.llm = llm
        self.journal = FakeJournal()
        self.persistent = TierActor(PersistentState(), self.journal, inline=True)  # type: ignore[arg-type]
        self.graph = TierActor(GraphState(), self.journal, inline=True)  # type: ignore[arg-type]
        self.jobs = JobsActor(
            JobsState(config_default("jobs_max_attempts")),
            self.journal,  # type: ignore[arg-type]
            tiers={"persistent": self.persistent, "graph": self.graph},
            kinds=kinds,
            llm_factory=lambda: self.llm,
            embedder=None,
            concurrency=concurrency,
            max_attempts=max_attempts,
            environ={},
        )

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        """A jobs.* call through the actor, as a connection would make it."""
        spec = METHODS[method]
        call = Call(1, spec, msgspec.convert(params, spec.params))
        reply = Captured()
        if self.jobs.can_inline(call):
            return self.jobs.handle_inline(call, 0)
        self.jobs.submit(Work(call, reply, 0))
        await reply.arrived.wait()
        return reply.results[0]

    async def hold_commit(self, answer: Gate) -> None:
        """Let the gated LLM answer and return once the commit's journal write is under way, held
        (open the journal's gate to let it finish)."""
        await answer.entered.wait()
        self.journal.gate = trio.Event()
        self.journal.entered = trio.Event()
        answer.release.set()
        await self.journal.entered.wait()

    async def job(self, job_id: str) -> Any:
        result = await self.call("jobs.get", {"id": job_id})
        assert not isinstance(result, ProtocolError), result
        return result

    async def wait_state(self, job_id: str, *states: str) -> Any:
        """The job once it is in one of `states` (woken by the actor, never polled)."""
        while True:
            job = await self.call("jobs.wait", {"id": job_id, "timeout": 3600})
            if job.state in states:
                return job
            if job.state not in ("queued", "running"):
                raise AssertionError(f"job {job_id} is {job.state}, not {states}: {job.error}")
            await trio.testing.wait_all_tasks_blocked()


@asynccontextmanager
async def harness(
    llm: FakeLLM | None = None,
    *,
    concurrency: int = 2,
    kinds: dict[str, Any] | None = None,
    max_attempts: int = 5,
) -> AsyncIterator[Harness]:
    h = Harness(llm or FakeLLM(), concurrency, kinds if kinds is not None else {"test.note": NoteKind()}, max_attempts)
    async with running_actors(h.jobs, [h.persistent, h.graph]):
        yield h


@asynccontextmanager
async def running_actors(jobs: JobsActor, tiers: list[TierActor]) -> AsyncIterator[None]:
    """The tier actors and the jobs actor running, until the block ends (the jobs stopped first)."""
    async with trio.open_nursery() as nursery:
        for actor in (*tiers, jobs):
            nursery.start_soon(actor.run)
        await trio.testing.wait_all_tasks_blocked()
        try:
            yield
        finally:
            await jobs.stop()
            for actor in (jobs, *reversed(tiers)):
                actor.close()

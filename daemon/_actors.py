"""Tier actors: one trio task per tier owns that tier's state; requests reach it on a channel.

Rule kept here: an actor takes everything waiting on its channel as one batch, runs the handlers
(which validate, then apply), sends the batch's mutations to the journal actor in one submit, and
answers nobody in the batch before that submit returned. While it waits nobody else can read its
state, so no client ever sees a write that is not durable; if the journal fails, the batch is
rolled back and its writes answer `read_only`.

Pipelined actors (pipeline=True: tiers whose handlers never wait) do not wait for the journal
before taking the next batch: a batch's mutations are submitted at once and its answers are held,
in order, by the actor's completer task until its journal write is durable; a batch that follows
one still waiting (it may have read that batch's writes) is answered only after it. So the journal
always has the next group ready when an fsync returns, and still nobody is answered before every
write they could have seen is durable. When a write fails, the completer rolls back every batch
applied so far (the failed one and all later ones still waiting) and answers the later ones
`read_only` entirely (their reads may have seen the lost writes). Internal items (snapshot
copies, heartbeats) run only when nothing is waiting, so they see durable state only.

Fast path (actors made with inline=True): a call that journals nothing (a read, or any tier-1 call
but session.close) may be run by the connection's reader itself, synchronously, but only while the
actor owes nothing: no item submitted and not yet answered (`_owed == 0`), so no batch is waiting
on the journal (no write that is not durable is visible) and nothing sent before it is still queued
(a pipelined read still sees the writes sent before it). Same handler, same errors as the actor.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from typing import Any, Callable, Protocol

import trio

from eurekamem.protocol import Call, ProtocolError

from ._journal_actor import JournalActor, JournalUnavailable
from ._state import RTYPE_MUTATION, TierState, mutation_encoder
from ._sync import Waiter

_DOOMED = "read-only: the journal failed while this request waited behind a write that is now undone; retry"

log = logging.getLogger("eurekamem.actor")

MAX_BATCH = 4096


class Reply(Protocol):
    def deliver(self, call: Call, result: Any, started_ns: int) -> None:
        """Hand a result (or a ProtocolError) for `call` back to whoever asked."""

    def flush(self) -> None:
        """Send what deliver() buffered (called once after a batch of deliveries)."""


class Work:
    __slots__ = ("call", "reply", "started_ns")

    def __init__(self, call: Call, reply: Reply, started_ns: int) -> None:
        self.call = call
        self.reply = reply
        self.started_ns = started_ns


class Internal:
    """A function to run against the state between batches (snapshots, statistics)."""

    __slots__ = ("fn", "waiter")

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn
        self.waiter = Waiter()


class _InFlight:
    """A pipelined batch that was applied and whose answers wait for its journal write (or an earlier one's)."""

    __slots__ = ("batch", "calls", "results", "waiter", "undo", "doomed")

    def __init__(self, batch: list[Work], calls: list[Call], results: list[Any], waiter: Waiter | None, undo: int) -> None:
        self.batch = batch
        self.calls = calls
        self.results = results
        self.waiter = waiter  # None: nothing to journal (it waits for the batches before it only)
        self.undo = undo  # undo entries this batch added to the state's log
        self.doomed = False  # an earlier batch's write failed: everything of this one was undone


class TierActor:
    NOT_INLINE: frozenset[str] = frozenset()  # non-journaled methods that still need the actor (I/O)

    def __init__(
        self, state: TierState, journal: JournalActor | None, *, inline: bool = False, pipeline: bool = False
    ) -> None:
        self.state = state
        self.journal = journal
        self._send, self._recv = trio.open_memory_channel[Any](math.inf)
        self.batches = 0
        self.requests = 0
        self.inline_requests = 0  # of `requests`, those the reader ran itself (fast path)
        self.busy_since: float | None = None  # trio time at which the batch in progress started
        self.inline = inline
        self._owed = 0  # items submitted and not yet finished by run() (journal wait and answers included)
        self._inline_stamp = -1  # the read (its started_ns) whose calls share one batch timestamp
        self.pipeline = pipeline and journal is not None
        self._inflight: deque[_InFlight] = deque()  # pipelined batches not answered yet, oldest first
        self._drained = trio.Event()
        self._completions: Any = None

    @property
    def name(self) -> str:
        return self.state.name

    def submit(self, work: Work) -> None:
        self._send.send_nowait(work)
        self._owed += 1

    async def run_internal(self, fn: Callable[[Any], Any]) -> Any:
        item = Internal(fn)
        self._send.send_nowait(item)
        self._owed += 1
        return await item.waiter.wait()

    def can_inline(self, call: Call) -> bool:
        """May the caller run `call` now, itself, with handle_inline (see the module's rule)?"""
        return self.inline and self._owed == 0 and not call.spec.writes and call.spec.name not in self.NOT_INLINE

    def handle_inline(self, call: Call, started_ns: int) -> Any:
        """Run a call that can_inline allowed, now; calls of one read (same started_ns) share a timestamp."""
        state = self.state
        if started_ns != self._inline_stamp:
            self._inline_stamp = started_ns
            state.begin_batch()
        self.requests += 1
        self.inline_requests += 1
        result = self._handle_now(call)
        if state.pending:  # a bug: a call that journals nothing changed durable state; undo it
            state.rollback()
            log.error("%s changed durable state on the fast path; rolled back", call.spec.name)
            return ProtocolError("internal", f"internal error in {call.spec.name}: changed state without the journal")
        return result

    def close(self) -> None:
        self._send.close()

    def queue_length(self) -> int:
        return self._recv.statistics().current_buffer_used

    async def run(self) -> None:
        if not self.pipeline:
            await self._serve()
            return
        self._completions, completions = trio.open_memory_channel[_InFlight](math.inf)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._complete_in_order, completions)
            try:
                await self._serve()
            finally:
                self._completions.close()  # the completer answers what is still waiting, then ends

    async def _serve(self) -> None:
        recv = self._recv
        run_batch = self._start_batch if self.pipeline else self._run_batch
        async for first in recv:
            batch = [first]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(recv.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            finished = 0  # items of `batch` answered here (pipelined work is answered by the completer)
            try:
                start = 0
                for index, item in enumerate(batch):
                    if isinstance(item, Internal):
                        await run_batch(batch[start:index])
                        if self._inflight:
                            await self._wait_drained()
                        await self._run_internal_item(item)
                        finished += 1
                        start = index + 1
                await run_batch(batch[start:])
            finally:
                self._owed -= len(batch) if not self.pipeline else finished

    async def _wait_drained(self) -> None:
        while self._inflight:
            self._drained = trio.Event()
            await self._drained.wait()

    async def _start_batch(self, batch: list[Work]) -> None:
        """Pipelined: apply a batch, submit its mutations without waiting; the completer answers it."""
        if not batch:
            return
        state = self.state
        undo_before = state.undo_depth()
        calls, results, mutations = await self._apply(batch)
        waiter = None
        if mutations:
            waiter = self.journal.submit_nowait([(RTYPE_MUTATION, mutation_encoder.encode(m)) for m in mutations])
        elif not self._inflight:  # reads only, nothing waiting before them: answer now
            self._owed -= len(batch)
            self._answer(batch, results)
            return
        entry = _InFlight(batch, calls, results, waiter, state.undo_depth() - undo_before)
        self._inflight.append(entry)
        self._completions.send_nowait(entry)

    async def _complete_in_order(self, completions: Any) -> None:
        state = self.state
        async for entry in completions:
            error: JournalUnavailable | None = None
            if entry.waiter is not None:
                try:
                    await entry.waiter.wait()
                except JournalUnavailable as exc:
                    error = exc
            head = self._inflight.popleft()
            assert head is entry
            results = entry.results
            if entry.doomed:
                results = [ProtocolError("read_only", _DOOMED)] * len(results)
            elif error is not None:
                state.rollback()  # this batch and every later one applied so far
                for later in self._inflight:
                    later.doomed = True
                _read_only_from_first_write(entry.calls, results, error)
            else:
                state.forget_undo(entry.undo)
            self._owed -= len(entry.batch)
            self._answer(entry.batch, results)
            if not self._inflight:
                self._drained.set()

    async def _run_internal_item(self, item: Internal) -> None:
        """Run an internal function; if it changed durable state, journal that before answering."""
        try:
            result = await self._call_on_state(item.fn)
        except Exception as exc:
            item.waiter.fail(exc)
            return
        mutations = self.state.take_pending()
        if mutations:
            try:
                await self.journal.submit([(RTYPE_MUTATION, mutation_encoder.encode(m)) for m in mutations])
            except JournalUnavailable as exc:
                await self._call_on_state(lambda state: state.rollback())
                item.waiter.fail(exc)
                return
            self.state.forget_undo()
        item.waiter.set(result)

    async def _call_on_state(self, fn: Callable[[Any], Any]) -> Any:
        """Run fn(state) as the state's owner (tiers with heavy work override: a worker thread)."""
        return fn(self.state)

    async def _apply(self, batch: list[Work]) -> tuple[list[Call], list[Any], list[Any]]:
        """Run a batch's handlers; its calls, their results and the mutations to journal."""
        self.batches += 1
        self.requests += len(batch)
        state = self.state
        state.begin_batch()
        calls = [work.call for work in batch]
        self.busy_since = trio.current_time()
        try:
            results = await self.handle_calls(calls)
        finally:
            self.busy_since = None
        return calls, results, state.take_pending()

    async def _run_batch(self, batch: list[Work]) -> None:
        if not batch:
            return
        calls, results, mutations = await self._apply(batch)
        if mutations:
            try:
                await self.journal.submit([(RTYPE_MUTATION, mutation_encoder.encode(m)) for m in mutations])
            except JournalUnavailable as exc:
                await self._call_on_state(lambda s: s.rollback())
                _read_only_from_first_write(calls, results, exc)
            else:
                self.state.forget_undo()
        self._answer(batch, results)

    @staticmethod
    def _answer(batch: list[Work], results: list[Any]) -> None:
        for work, result in zip(batch, results):
            work.reply.deliver(work.call, result, work.started_ns)
        flushed: set[int] = set()
        for work in batch:  # one send per connection for the whole batch
            if id(work.reply) not in flushed:
                flushed.add(id(work.reply))
                work.reply.flush()

    async def handle_calls(self, calls: list[Call]) -> list[Any]:
        return [await self.handle(call) for call in calls]

    async def handle(self, call: Call) -> Any:
        """Run one call against the state; a ProtocolError is a result too."""
        return self._handle_now(call)

    def _handle_now(self, call: Call) -> Any:
        try:
            return self.state.handle(call.spec.name, call.params)
        except ProtocolError as exc:
            return exc
        except Exception as exc:  # a bug: answer `internal`, keep serving, keep the state as it was
            log.exception("internal error in %s", call.spec.name)
            return ProtocolError("internal", f"internal error in {call.spec.name}: {type(exc).__name__}: {exc}")


def _read_only_from_first_write(calls: list[Call], results: list[Any], exc: Exception) -> None:
    """A batch's journal write failed: its calls from the first write on answer read_only."""
    error = ProtocolError("read_only", f"read-only: {exc}")
    first_write = next(i for i, call in enumerate(calls) if call.spec.writes)
    results[first_write:] = [error] * (len(results) - first_write)


def monotonic_ns() -> int:
    return time.perf_counter_ns()

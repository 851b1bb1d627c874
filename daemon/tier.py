"""A tier: the state it owns (TierState) and the trio task that owns it (TierActor).

Rules kept here:
- Durable state changes only through `apply(mutation)`, the same function at run time and at
  journal replay, and every mutation is state-based (it carries the whole resulting record), so
  applying one twice, or re-applying those already folded into a snapshot, gives the same state.
  `apply` returns an undo closure so that a batch whose journal write failed leaves no trace.
  Handlers validate first and raise ProtocolError before changing anything.
- An actor takes everything waiting on its channel as one batch, runs the handlers, hands the
  batch's mutations to its store in one commit (daemon/storage/store.py: the journal actor, or
  PostgreSQL), and answers nobody in the batch before that commit returned. While it waits nobody
  else can read its state, so no client ever sees a write that is not durable; if the commit fails,
  the batch is rolled back and its writes answer what the store said (`read_only`, `unavailable`).
- Fast path (actors made with inline=True): a call that journals nothing (a read, or any tier-1
  call but session.close) may be run by the connection's reader itself, synchronously, but only
  while the actor owes nothing: no item submitted and not yet answered (`_owed == 0`), so no batch
  is waiting on the journal (no write that is not durable is visible) and nothing sent before it is
  still queued (a pipelined read still sees the writes sent before it). Same handler, same errors
  as the actor.
- Ownership: nobody but the actor (its task, or the worker thread it hands a batch to) touches its
  TierState. Others read `stats()`: counters the actor keeps itself plus the state's counts as the
  actor last published them (`_publish`, after every batch and internal call; after fast-path calls
  that change counts, when `stats()` is next read while the actor owes nothing, the fast path's own
  condition, so not once per call); a state's `counts()` is O(1) and is called by its owner only.
- Handlers: HANDLERS is the one table from a method name to the function that answers it (tier
  handlers `fn(state, params)`, actor handlers `async fn(actor, call)` for calls that wait on I/O,
  sys handlers `fn(daemon, call, reply, started_ns)`); `@handles(method)` fills it at import, and a
  test checks that it names exactly the methods of protocol METHODS.
- Staging (one journal record across tiers, for the job queue): `stage(fn)` runs fn against the
  state between batches like an internal call, but hands the mutations it made to the caller
  instead of journaling them, and then holds the actor (no batch, no read, no fast path: the item
  is owed) until the caller says how the caller's single journal write went: `release(True)`
  keeps the change, `release(False)` undoes it. Whoever stages must release, also when cancelled.
  While it holds, `Stage.extend(fn)` runs more against the held state, on the event loop, as part
  of the same stage (for actors whose state lives on the event loop: not tier 4's).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Literal, NamedTuple, Protocol, TypeVar

import trio

from ..protocol import (
    METHODS,
    Call,
    ProtocolError,
    now_rfc3339,
)
from .primitives import Waiter
from .storage.store import Store, StoreUnavailable

log = logging.getLogger("eurekamem.actor")


MAX_BATCH = 4096


HandlerKind = Literal["state", "actor", "sys"]


class Handler(NamedTuple):
    """state: fn(state, params); actor: async fn(actor, call); sys: fn(daemon, call, reply, started_ns)."""

    fn: Callable[..., Any]
    kind: HandlerKind


HANDLERS: dict[str, Handler] = {}  # method name -> its handler; filled by @handles as the modules are imported

F = TypeVar("F", bound=Callable[..., Any])
R = TypeVar("R")


def handles(method: str, kind: HandlerKind = "state") -> Callable[[F], F]:
    """Register the decorated function as the one handler of `method` (a name in protocol METHODS)."""
    if method not in METHODS:
        raise KeyError(f"{method!r} is not a method of the protocol (protocol/methods.py METHODS)")

    def register(fn: F) -> F:
        if method in HANDLERS:
            raise ValueError(f"{method!r} has two handlers: {HANDLERS[method].fn.__qualname__} and {fn.__qualname__}")
        HANDLERS[method] = Handler(fn, kind)
        return fn

    return register


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


class Staged(Internal):
    """An internal call whose mutations the caller journals (see the module's rule on staging)."""

    __slots__ = ("decided", "keep")

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        super().__init__(fn)
        self.decided = trio.Event()
        self.keep = False


class Stage:
    """What `TierActor.stage` hands back: fn's result, the mutations it made, and the release."""

    __slots__ = ("result", "mutations", "_item", "_state")

    def __init__(self, item: Staged, result: Any, mutations: list[Any], state: TierState) -> None:
        self._item = item
        self._state = state
        self.result = result
        self.mutations = mutations

    def extend(self, fn: Callable[[Any], Any]) -> Any:
        """Run fn(state) now, as part of this stage (the actor is held: nobody else is on its state);
        its mutations join the stage's. Only for a state that lives on the event loop."""
        if self._item.decided.is_set():
            raise RuntimeError("the stage was released")
        result = fn(self._state)
        self.mutations.extend(self._state.take_pending())
        return result

    def release(self, keep: bool) -> None:
        """The caller's journal write succeeded (keep) or not: the actor forgets the undo or rolls back."""
        if not self._item.decided.is_set():
            self._item.keep = keep
            self._item.decided.set()


class TierActor:
    # True when the actor answers its channel in arrival order, batch by batch (TierActor.run, or a run
    # that wraps it): then a connection need not hold a request behind its own earlier ones for this tier.
    ARRIVAL_ORDER = True

    def __init__(self, state: TierState, store: Store | None, *, inline: bool = False) -> None:
        self.state = state
        self.store = store  # where durable mutations go (daemon/storage/store.py); None: tier 1
        self._counts: Mapping[str, int] = MappingProxyType(state.counts())  # published by the actor only
        self._send, self._recv = trio.open_memory_channel[Any](math.inf)
        self.batches = 0
        self.requests = 0
        self.inline_requests = 0  # of `requests`, those the reader ran itself (fast path)
        self.busy_since: float | None = None  # trio time at which the batch in progress started
        self.inline = inline
        # the methods the fast path may run: an inline actor's that write nothing and have a state handler
        # (the tier's handlers are registered by now: the module that defines its state was imported)
        self._inlinable = frozenset(
            name for name, handler in HANDLERS.items()
            if inline and handler.kind == "state" and not METHODS[name].writes
        )
        self._owed = 0  # items submitted and not yet finished by run() (journal wait and answers included)
        self._inline_stamp = -1  # the read (its started_ns) whose calls share one batch timestamp
        self._stale = False  # a fast-path call changed counts() since the last _publish

    @property
    def name(self) -> str:
        return self.state.name

    def submit(self, work: Work) -> None:
        self._send.send_nowait(work)
        self._owed += 1

    async def run_internal(self, fn: Callable[[Any], R]) -> R:
        item = Internal(fn)
        self._send.send_nowait(item)
        self._owed += 1
        result: R = await item.waiter.wait()  # the waiter carries fn's own result
        return result

    async def stage(self, fn: Callable[[Any], Any]) -> Stage:
        """Run fn(state) between batches and hold the actor until the Stage is released (module rule).

        If fn raises, nothing it did stays and the error is raised here (there is nothing to release)."""
        item = Staged(fn)
        self._send.send_nowait(item)
        self._owed += 1
        try:
            result, mutations = await item.waiter.wait()
        except BaseException:
            item.decided.set()  # a cancelled caller: the actor must not wait for a release (keep=False)
            raise
        return Stage(item, result, mutations, self.state)

    async def apply_feed(self, mutations: list[Any], again: Callable[[], list[Any]] = list) -> None:
        """Other nodes' committed mutations, from the change feed (daemon/postgres/feed.py): applied
        through the state's own `apply`, in order, between batches like an internal call; committed
        nowhere (they are in the database) and with no undo kept; the counts published after.
        Then `again()`'s, asked when they are applied (the node's own commits the feed has not
        reached yet: feed.py's re-apply rule), so no older row hides a newer write of the node's."""

        def apply(state: TierState) -> None:
            for mutation in [*mutations, *again()]:
                state.apply(mutation)

        await self.run_internal(apply)

    def can_inline(self, call: Call) -> bool:
        """May the caller run `call` now, itself, with handle_inline (see the module's rule)?
        Never a call whose handler waits on I/O (an actor handler: only the actor may wait)."""
        return self._owed == 0 and call.spec.name in self._inlinable

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
        if state.changes_counts_inline:
            self._stale = True  # published when next read (stats), not per call
        return result

    def close(self) -> None:
        self._send.close()

    def queue_length(self) -> int:
        return self._recv.statistics().current_buffer_used

    def _publish(self) -> None:
        """Publish the state's counts (the actor, as the state's owner, between batches)."""
        self._stale = False
        self._counts = MappingProxyType(self.state.counts())

    def stats(self) -> dict[str, Any]:
        """What sys.stats shows of this tier: the counts last published and the queue."""
        if self._stale and self._owed == 0:  # fast-path changes: publish them now, as the fast path could run
            self._publish()
        return {**self._counts, "queue": self.queue_length(), "batches": self.batches, "requests": self.requests}

    async def run(self) -> None:
        recv = self._recv
        async for first in recv:
            batch = [first]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(recv.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            try:
                start = 0
                internals: list[Internal] = []  # consecutive internal calls, run together
                for index, item in enumerate(batch):
                    if isinstance(item, Internal) and not isinstance(item, Staged):
                        if not internals:
                            await self._run_batch(batch[start:index])
                        internals.append(item)
                        start = index + 1
                        continue
                    if internals:
                        await self._run_internals(internals)
                        internals = []
                    if isinstance(item, Staged):
                        await self._run_batch(batch[start:index])
                        await self._run_internal_item(item)
                        start = index + 1
                if internals:
                    await self._run_internals(internals)
                await self._run_batch(batch[start:])
            finally:
                self._owed -= len(batch)
                self._publish()

    async def _run_internals(self, items: list[Internal]) -> None:
        """Consecutive internal calls, one after the other (an actor may group their journal writes)."""
        for item in items:
            await self._run_internal_item(item)

    async def _run_internal_item(self, item: Internal) -> None:
        """Run an internal function; if it changed durable state, journal that before answering."""
        if isinstance(item, Staged):
            await self._run_staged_item(item)
            return
        try:
            result = await self._call_on_state(item.fn)
        except Exception as exc:
            item.waiter.fail(exc)
            return
        mutations = self.state.take_pending()
        if mutations:
            assert self.store is not None, f"{self.name} is not journaled but changed durable state"
            try:
                await self.store.commit(mutations)
            except StoreUnavailable as exc:
                await self._call_on_state(lambda state: state.rollback())
                item.waiter.fail(exc)
                return
            self.state.forget_undo()
        self._publish()
        item.waiter.set(result)

    async def _run_staged_item(self, item: Staged) -> None:
        """Run a staged function, hand its mutations over, and wait for the release (module rule)."""
        self.state.begin_batch()
        try:
            result = await self._call_on_state(item.fn)
        except Exception as exc:
            await self._call_on_state(lambda state: state.rollback())
            item.waiter.fail(exc)
            return
        item.waiter.set((result, self.state.take_pending()))
        with trio.CancelScope(shield=True):  # the caller's journal write decides; it always releases
            await item.decided.wait()
        if item.keep:
            self.state.forget_undo()
        else:
            await self._call_on_state(lambda state: state.rollback())
        self._publish()

    async def _call_on_state(self, fn: Callable[[Any], Any]) -> Any:
        """Run fn(state) as the state's owner (tiers with heavy work override: a worker thread)."""
        return fn(self.state)

    async def _run_batch(self, batch: list[Work]) -> None:
        if not batch:
            return
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
        mutations = state.take_pending()
        if mutations:
            assert self.store is not None, f"{self.name} is not journaled but changed durable state"
            try:
                results = await self.commit_batch(calls, results, mutations)
            except StoreUnavailable as exc:
                await self._call_on_state(lambda s: s.rollback())
                error = exc.error()
                first_write = next(i for i, call in enumerate(calls) if call.spec.writes)
                results[first_write:] = [error] * (len(batch) - first_write)
            else:
                state.forget_undo()
        self._publish()  # before any answer: a request released by one of them sees this batch's counts
        for work, result in zip(batch, results):
            work.reply.deliver(work.call, result, work.started_ns)
        flushed: set[int] = set()
        for work in batch:  # one send per connection for the whole batch
            if id(work.reply) not in flushed:
                flushed.add(id(work.reply))
                work.reply.flush()

    async def commit_batch(self, calls: list[Call], results: list[Any], mutations: list[Any]) -> list[Any]:
        """Commit a batch's mutations (raises StoreUnavailable); what its calls answer. Tier 4 on
        several nodes decides again here when another node's commit contradicts what it decided on
        (daemon/memory/concurrency.py)."""
        assert self.store is not None, f"{self.name} is not journaled but changed durable state"
        await self.store.commit(mutations)
        return results

    async def handle_calls(self, calls: list[Call]) -> list[Any]:
        return [await self.handle(call) for call in calls]

    async def handle(self, call: Call) -> Any:
        """Run one call against the state (or, for an actor handler, as the actor); a ProtocolError is a result too."""
        handler = HANDLERS[call.spec.name]
        if handler.kind == "actor":
            return await handler.fn(self, call)
        return self._handle_now(call)

    def _handle_now(self, call: Call) -> Any:
        try:
            return self.state.handle(call.spec.name, call.params)
        except ProtocolError as exc:
            return exc
        except Exception as exc:  # a bug: answer `internal`, keep serving, keep the state as it was
            log.exception("internal error in %s", call.spec.name)
            return ProtocolError("internal", f"internal error in {call.spec.name}: {type(exc).__name__}: {exc}")


Undo = Callable[[], None]


BUSY_LIMIT = 900.0  # seconds one batch may take before the watchdog calls its actor stuck


async def stuck_actors(actors: Mapping[str, TierActor], timeout: float, busy_limit: float = BUSY_LIMIT) -> list[str]:
    """The names of the actors that did not answer within `timeout` (each runs a no-op between
    batches), for systemd's watchdog. An actor inside one long batch (a large memory.add_many
    embedding in its thread) is busy, not stuck, for up to `busy_limit` seconds."""
    missing = set(actors)

    async def beat(name: str, actor: TierActor) -> None:
        try:
            await actor.run_internal(lambda state: None)
        except Exception as exc:  # closed at shutdown, or failing: not an answer
            log.debug("heartbeat to %s failed: %s", name, exc)
            return
        missing.discard(name)

    with trio.move_on_after(timeout):
        async with trio.open_nursery() as nursery:
            for name, actor in actors.items():
                nursery.start_soon(beat, name, actor)
    now = trio.current_time()
    stuck = []
    for name in missing:
        busy_since = actors[name].busy_since
        if busy_since is None or now - busy_since > busy_limit:
            stuck.append(name)
    return sorted(stuck)


class TierState:
    """Base: a tier's state plus the undo log of the batch in progress."""

    name = "?"
    changes_counts_inline = False  # a fast-path call can change counts(): the actor publishes after it

    def __init__(self) -> None:
        self.pending: list[Any] = []  # mutations of the batch in progress, in order
        self._undo: list[Undo] = []
        self._now: str | None = None

    def begin_batch(self) -> None:
        self._now = None

    def now(self) -> str:
        """The time of the batch in progress: one timestamp for every record a batch writes."""
        if self._now is None:
            self._now = now_rfc3339()
        return self._now

    def commit(self, mutation: Any) -> None:
        """Apply a mutation now and remember it (and how to undo it) for the batch's journal write."""
        self._undo.append(self.apply(mutation))
        self.pending.append(mutation)

    def take_pending(self) -> list[Any]:
        out, self.pending = self.pending, []
        return out

    def forget_undo(self) -> None:
        self._undo.clear()

    def rollback(self) -> None:
        """Undo the batch in progress (its journal write failed)."""
        while self._undo:
            self._undo.pop()()
        self.pending.clear()

    def apply(self, mutation: Any) -> Undo:  # pragma: no cover - overridden
        raise NotImplementedError

    def counts(self) -> dict[str, int]:  # pragma: no cover - overridden
        """What sys.stats shows of the tier's size; O(1), called by the state's owner only."""
        return {}

    def handle(self, method: str, params: Any) -> Any:
        return HANDLERS[method].fn(self, params)



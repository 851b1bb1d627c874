"""The parts of tier 4's two write lanes that hold no state of the actor: the lanes' sizes, a bulk
write cut into slices, and the fast lane's `overloaded` answer. The lanes themselves (what waits in
each, per connection) are the memory actor's, on the event loop (daemon/memory/actor.py).

Rule kept here: no request holds up other clients' writes for long (each memory's embedded text is
bounded too: retrieval/text.py). The fast lane takes every write with at most FAST_LANE_CHARS
characters to embed (by its params alone: prepared.write_cost), in arrival order, in batches. The
bulk lane takes the larger ones and works through them a slice at a time (at most SLICE_ITEMS items
and SLICE_CHARS characters of a memory.add_many, each slice embedded, applied and journaled on its
own; the answer comes after the last), round robin between connections, while the fast lane goes
on beside it. Writes of one connection keep their order: once a connection has a write in the bulk
lane its later writes follow it there, and a bulk write waits for its connection's earlier
fast-lane writes. Writes of different connections that overlap in time may be applied in either
order.

The fast lane is bounded in time, not in requests (issue 30): every write waiting there is
embedded in the batch after the one in flight (one model call for all of them), so a write routed
there waits for what is ahead of it, and nothing else. The time that takes is the model's: e5-small
costs ~95 ms of CPU per 50-token passage whatever the batch (its C engine only spreads a batch over
the cores: bench/README.md, "memory.add under load"), so 2 cores embed ~20 memories a second and
32 clients adding one after the other would queue for seconds. The actor measures the model's
seconds per character on every write embedding (`seconds_per_char`, the wall time of the worker
thread's call, so a busy machine counts) and refuses a write whose embedding would wait longer
than `write_backlog` seconds (Config.memory_write_backlog) with `overloaded` and `retry_after_ms`
(`backlog_refusal`), before anything of it is stored; a write that needs no embedding, or one that
finds the lane empty, is never refused. The bulk lane answers each write after its last slice and
is not bounded here (a connection's max_inflight bounds what it may queue).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from ...protocol import Call, ProtocolError
from ...protocol import methods as m
from ..tier import MAX_BATCH, Work
from .prepared import add_cost

# a write with at most this many characters to embed goes the fast lane (a memory of a paragraph or
# two: e5-small embeds it in ~0.1-0.3 s on the shared 2-core machine); a larger one the bulk lane
FAST_LANE_CHARS = 1024


# the bulk lane's slice: at most this many items and characters to embed (~2-4 s of e5-small there;
# its apply holds the state for at most SLICE_ITEMS adds)
SLICE_ITEMS = 64


SLICE_CHARS = 8192


# the smoothing of the measured seconds per character (an exponential moving average over the
# write embeddings), and the shortest retry hint an `overloaded` answer gives
RATE_SMOOTHING = 0.3


MIN_RETRY_MS = 50


def connection_of(work: Work) -> int:
    """Which connection a request came from: its reply is the connection, or a JSON-RPC batch's
    collector that names it (`conn`)."""
    return id(getattr(work.reply, "conn", work.reply))


def smoothed(old: float | None, seconds_per_char: float) -> float:
    """One write embedding's seconds per character folded into the fast lane's estimate."""
    return seconds_per_char if old is None else old + RATE_SMOOTHING * (seconds_per_char - old)


def backlog_refusal(waiting_chars: int, cost: int, rate: float, budget: float) -> ProtocolError | None:
    """`overloaded` for a fast-lane write of `cost` characters behind `waiting_chars` whose
    embedding would wait past `budget` seconds at `rate` seconds per character (None: let it in)."""
    wait = (waiting_chars + cost) * rate
    if wait <= budget:
        return None
    # the hint: when the writes ahead should be embedded (not the first moment this one would
    # fit: clients that all came back then would find the lane full again, and again)
    retry_ms = max(MIN_RETRY_MS, math.ceil(waiting_chars * rate * 1000))
    return ProtocolError(
        "overloaded",
        f"tier 4 is embedding {waiting_chars} characters of earlier writes: this write would wait about "
        f"{wait:.1f} s for the model (memory_write_backlog is {budget:g} s); nothing was stored, try again "
        f"in {retry_ms} ms",
        retry_after_ms=retry_ms,
    )


class Collected:
    """The Reply of one bulk-lane slice: keeps the result for the job."""

    __slots__ = ("result",)

    def __init__(self) -> None:
        self.result: Any = None

    def deliver(self, call: Call, result: Any, started_ns: int) -> None:
        self.result = result

    def flush(self) -> None:
        pass


class BulkJob:
    """One write in the bulk lane: its slices (a memory.add_many's items cut into slices, any other
    write whole), the results so far, and the answer once the last slice ran."""

    def __init__(self, work: Work, limit: int) -> None:
        self.work = work
        call = work.call
        self.slices: list[Call] = [call]
        if call.spec.name == "memory.add_many":
            self.slices = [Call(call.id, call.spec, m.MemoryAddMany(items=part)) for part in slices(call.params.items, limit)]
        self.done = 0
        self.results: list[Any] = []

    async def step(self, run: Callable[[list[Work]], Awaitable[None]]) -> bool:
        """Embed, apply and journal the next slice (`run`: the actor's, for one batch of writes);
        True once the write is answered."""
        call = self.slices[self.done]
        collected = Collected()
        await run([Work(call, collected, self.work.started_ns)])
        self.done += 1
        result = collected.result
        if len(self.slices) == 1:
            return self._answer(result)
        if isinstance(result, ProtocolError):  # the journal failed (read_only), or a bug (internal)
            if not self.results:
                return self._answer(result)  # nothing was added: the request fails as a whole
            missing = sum(len(c.params.items) for c in self.slices[self.done - 1 :])
            error = {"decision": "error", "memory": None, "reason": result.message, "kind": result.kind}
            return self._answer(self.results + [dict(error) for _ in range(missing)])
        self.results.extend(result)
        return self._answer(self.results) if self.done == len(self.slices) else False

    def _answer(self, result: Any) -> bool:
        self.work.reply.deliver(self.work.call, result, self.work.started_ns)
        self.work.reply.flush()
        return True


def slices(items: list[m.MemoryAdd], limit: int) -> list[list[m.MemoryAdd]]:
    """Consecutive slices of at most SLICE_ITEMS items and SLICE_CHARS characters to embed (one
    item at least)."""
    out: list[list[m.MemoryAdd]] = []
    part: list[m.MemoryAdd] = []
    chars = 0
    for item in items:
        cost = add_cost(item, limit)
        if part and (len(part) >= SLICE_ITEMS or chars + cost > SLICE_CHARS):
            out.append(part)
            part, chars = [], 0
        part.append(item)
        chars += cost
    if part:
        out.append(part)
    return out


def with_waiting(first: list[Work], recv: Any) -> list[Work]:
    """`first` and the batches already waiting behind it on a pipeline, up to MAX_BATCH."""
    batch = list(first)
    while len(batch) < MAX_BATCH:
        try:
            batch.extend(recv.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            break
    return batch

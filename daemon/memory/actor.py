"""The tier 4 actor and its background work: the write lanes, the query pipeline, re-embedding and
the loops (projection, scans of memories/, maintenance).

Rule kept here: the memory state is touched only from inside this actor, one batch or one
internal call at a time (the state lock), and in a worker thread for anything heavier than a few
lookups (embedding, hnswlib and BM25 are heavy), so the event loop keeps serving every other tier
meanwhile.

Nothing waits for an embedding while holding the state: writes go through a pipeline that embeds
their passages without the state lock (the embedder touches no state), then takes the lock,
applies and journals them, in the order they arrived; reads that need a query embedded (search,
inject with a query) go through a second one that does the same (a memory.inject that asks for a
conversation's raw messages also gets them there, from the conversation actor's search, before the
lock: see `messages`). Other reads (get, list, lexical
search) and internal work run at once, in arrival order. Across connections a read may so be
answered before a write sent earlier on another connection and not yet answered (the two overlap
in time, so either order is a correct one, as in any database); on one connection the connection
itself holds a tier-4 request until that connection's earlier writes (and, for a write, its earlier
reads) are answered (protocol/_connection.py), so a client sees its own writes in order. Writes
never overtake each other.

Ownership: whoever holds the state lock owns the state (a trio task of this actor, or the worker
thread it awaits meanwhile). The embedding threads never touch it (daemon/memory/embedding.py).
sys.stats reads what `_publish` copied under the lock after each batch and internal call, never
the state itself.

Writes take one of two lanes, a fast one for small writes, bounded by the time its embedding
would wait (`overloaded` beyond Config.memory_write_backlog), and a bulk one that works through
large writes a slice at a time, round robin between connections: the rules and sizes are in
daemon/memory/lanes.py, the lanes' queues here. The files in memories/ (the projection, the scans
of what others wrote there) are MemoryFiles' (daemon/memory/files.py), the snapshot's files
daemon/memory/snapshot.py's; both touch the state only through this actor's internal calls.
"""

from __future__ import annotations

import collections
import functools
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import trio

from ...protocol import Call, Memory, ProtocolError, domain_slug
from ...protocol import methods as m
from ...protocol.readable import render_readable
from ..config import config_default
from ..primitives import Histogram
from ..redact import Redactor
from ..retrieval.text import pooled
from ..stats import EmbeddingProgress
from ..storage.store import Store, StoreConflict, StoreUnavailable
from ..tier import MAX_BATCH, Internal, TierActor, Work
from .concurrency import RETRIES, CaughtUp, Decisions, caught_up
from .data import own_abstract
from .embedding import Embeddings
from .files import MemoryFiles
from .lanes import FAST_LANE_CHARS, BulkJob, backlog_refusal, connection_of, smoothed, with_waiting
from .maintenance import JobQueue, Maintenance, schedule
from .prepared import GroupSummary, Prepared, messages_to_fetch, query_to_embed, wants_summary, write_cost
from .records import PutMemory
from .state import MemoryState
from .strength import StrengthSettings
from .watch import Watcher

log = logging.getLogger("eurekamem.memory")


REEMBED_BATCH = 64


# write batches of at most this many memories find what to embed on the event loop (fingerprints
# and dict lookups, ~2 us a memory), larger ones in a worker thread
INLINE_CHECK_ITEMS = 64


RunSync = Callable[..., Awaitable[Any]]


class ConversationReads(Protocol):
    """What tier 4 reads of the conversation tier (through its actor): MEMORY.md's group summaries,
    memory.inject's raw messages and its include_summary."""

    async def group_summaries(self, slugs: list[str]) -> dict[str, str]: ...

    async def search_messages(
        self, group: str, query: str, k: int, vector: np.ndarray | None, error: str | None
    ) -> list[dict[str, Any]]: ...

    async def summaries_and_intents(self, slugs: list[str]) -> dict[str, tuple[str, list[str]]]: ...


class CheckingStore(Protocol):
    """The team's store (store = postgres): a commit checks the batch's decisions in its transaction
    (daemon/memory/concurrency.py) and raises StoreConflict when another node's commit contradicts them."""

    own: Any  # the feed's OwnCommits: `applied`, the follower's applied seq

    async def commit(self, mutations: list[Any], check: Any = None) -> None: ...


@dataclass(frozen=True)
class MemoryLoops:
    """The settings of tier 4's background loops (from Config): the projection and re-embedding
    every projection_interval seconds, the scans of memories/ (watch_interval 0: none), the nightly
    maintenance schedule ("off": none; catchup 0: no catch-up run after a start)."""

    projection_interval: float
    watch_interval: float
    watch_full_interval: float
    maintenance_at: str
    maintenance_catchup: float


class MemoryActor(TierActor):
    ARRIVAL_ORDER = False  # reads run beside a write that is still embedding (see above)
    state: MemoryState

    def __init__(
        self,
        state: MemoryState,
        store: Store,
        root: Path,
        *,
        run_sync: RunSync | None = None,
        conversation: ConversationReads | None = None,
        jobs: JobQueue | None = None,
        redactor: Redactor | None = None,
        on_purge: Callable[[], None] | None = None,
        write_backlog: float | None = None,
        loops: MemoryLoops | None = None,
        wall: Callable[[], float] | None = None,
        share_policy: Callable[[str], str] | None = None,
        strength: StrengthSettings | None = None,
    ) -> None:
        # the state's settings, given before anything runs (replay at start does not read them):
        # the wall clock of its timestamps and strengths, memory.promote's policy per domain, strength's tables
        if wall is not None:
            state.wall = wall
        if share_policy is not None:
            state.share_policy = share_policy
        if strength is not None:
            state.settings = strength
        super().__init__(state, store)
        # fixed for the state's life, so the embedding threads need not read the state for them
        self.embedder = state.embedder
        self.model = state.model
        self.embed_window = state.embed_window  # fixed with the model: a job embeds a memory's windows as add does
        self._timings: dict[str, Histogram] = {}
        self._lexical_from = state.lexical_from
        self._publish()
        # how work leaves the event loop: a worker thread (tests on trio's virtual clock run it inline)
        self._run_sync: RunSync = run_sync or trio.to_thread.run_sync
        # the conversation tier's group summaries for MEMORY.md: slugs -> {slug: summary}; None
        # while there is no such tier (the heading is then left out)
        self.summaries: Callable[[list[str]], Awaitable[dict[str, str]]] | None = None
        # memory.inject's raw messages: (group, query, k, the query's vector or None, why none) ->
        # conversation.search's hits, through the conversation actor; None while there is no such tier
        self.messages: Callable[[str, str, int, np.ndarray | None, str | None], Awaitable[list[dict[str, Any]]]] | None = None
        # the same groups' summaries and intents for memory.inject's include_summary: slugs -> {slug: GroupSummary}
        self.group_summaries: Callable[[list[str]], Awaitable[dict[str, GroupSummary]]] | None = None
        if conversation is not None:
            self.summaries = conversation.group_summaries
            self.messages = conversation.search_messages
            self.group_summaries = functools.partial(_summaries_and_intents, conversation)
        # the texts embedded off the event loop, and the query cache (daemon/memory/embedding.py)
        self.embeddings = Embeddings(self.embedder, self.model, self._run_sync)
        # the background loops (run_loops) and their settings; None: none run (an actor of a test)
        self.loops = loops
        self._loops_scope = trio.CancelScope()  # cancelled by stop_loops, or when the actor ends
        self.watching = loops is not None and loops.watch_interval > 0  # memories/ is scanned
        # the memory files: the projector and the scans of memories/ (daemon/memory/files.py)
        self.files = MemoryFiles(
            root,
            run_internal=self.run_internal,
            run_sync=self._run_sync,
            summaries=self._summaries,
            embedder=self.embedder,
            redactor=redactor,
            # seconds between full scans (Config.watch_full_interval; an actor without loops, a test's,
            # scans when asked, with Config's default)
            watch_full_interval=loops.watch_full_interval if loops is not None else config_default("watch_full_interval"),
        )
        # tier 4's background embedding, as sys.stats → memory.embedding shows it; written only by
        # the background loop, read by sys.stats, both on the event loop
        self.embedding = EmbeddingProgress()
        # tier 4's maintenance: jobs of the queue, asked for by sys.maintain and the nightly schedule
        self.maintenance = Maintenance(jobs, self, wall=state.wall) if jobs is not None else None
        self.reembedded = 0
        self.conflicts = 0  # batches decided again after another node's commit (commit_batch)
        self.caught = CaughtUp()  # other nodes' mutations applied by _decide_again, not yet by the follower
        self._state_lock = trio.StrictFIFOLock()  # one batch or internal call on the state at a time
        self._embedded: tuple[Prepared, str | None] | None = None  # for the write batch about to run
        self.writes_waiting = 0  # write requests in the pipeline, not yet applied
        # the fast lane's bound (daemon/memory/lanes.py), on the event loop only: characters to
        # embed of the writes routed there and not yet answered (the batch in flight included), the
        # model's measured seconds per character (None until the first write embedding), the bound
        # in seconds (Config.memory_write_backlog, given at construction; None: unbounded), and the
        # writes refused
        self._fast_chars = 0
        self.seconds_per_char: float | None = None
        self.write_backlog: float | None = write_backlog
        self.writes_refused = 0
        # the lanes (daemon/memory/lanes.py); connections by lanes.connection_of
        self._fast_owed: dict[int, int] = {}  # connection -> its writes in the fast lane, not answered
        self._fast_changed = trio.Event()  # set (and replaced) whenever fast-lane writes were answered
        self._bulk: dict[int, collections.deque[BulkJob]] = {}  # connection -> its bulk-lane writes, in order
        self._bulk_turns: collections.deque[int] = collections.deque()  # connections with bulk work, round robin
        self._bulk_wakeup = trio.Event()
        self._closing = False
        self._nursery: trio.Nursery | None = None  # run()'s, once running: memory.list readable's tasks
        self.on_purge: Callable[[], None] | None = on_purge  # called (on the event loop) after a batch purged a memory
        self.redactor: Redactor | None = redactor  # the daemon's (daemon/redact.py), for text stored without a request

    def queue_length(self) -> int:
        return super().queue_length() + self.writes_waiting

    def _publish(self) -> None:
        """Copy what sys.stats shows of the state; called with the state lock held (or before run)."""
        super()._publish()
        self._timings = {mode: histogram.copy() for mode, histogram in self.state.search_time.items()}
        # while the model changes, the old model's embedder: the pipelines embed each query with it
        # too (outside the lock); None once every memory has a vector of the new model
        self._previous_embedder = self.state.previous[2] if self.state.previous is not None else None
        self._lexical_from = self.state.lexical_from

    async def run(self) -> None:
        write_send, write_recv = trio.open_memory_channel[list[Work]](math.inf)
        query_send, query_recv = trio.open_memory_channel[list[Work]](math.inf)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._write_pipeline, write_recv)
            nursery.start_soon(self._query_pipeline, query_recv)
            nursery.start_soon(self._bulk_lane)
            if self.loops is not None:
                nursery.start_soon(self._run_loops, self.loops)
            try:
                await self._dispatch(write_send, query_send)
            finally:
                self._loops_scope.cancel()
                self._closing = True  # the bulk lane finishes what it has, then ends
                self._bulk_wakeup.set()

    async def _dispatch(self, write_send: Any, query_send: Any) -> None:
        """Take what is waiting; run reads and internal work at once, hand writes and queries to their lanes."""
        async with write_send, query_send:
            async for first in self._recv:
                batch = [first]
                while len(batch) < MAX_BATCH:
                    try:
                        batch.append(self._recv.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                reads: list[Work] = []
                fast: list[Work] = []
                queries: list[Work] = []
                for item in batch:
                    if isinstance(item, Internal):
                        await self._locked_batch(reads)
                        reads = []
                        async with self._state_lock:
                            await self._run_internal_item(item)
                    elif item.call.spec.writes:  # checked and routed one by one: each counts for the next
                        refusal = self._refusal(item)
                        if refusal is not None:
                            item.reply.deliver(item.call, refusal, item.started_ns)
                            item.reply.flush()
                        elif not self._to_bulk(item):
                            fast.append(item)
                    elif query_to_embed(item.call) is not None or wants_summary(item.call):
                        queries.append(item)
                    else:
                        reads.append(item)
                if fast:
                    write_send.send_nowait(fast)
                if queries:
                    query_send.send_nowait(queries)
                await self._locked_batch(reads)

    async def _locked_batch(self, batch: list[Work]) -> None:
        if batch:
            async with self._state_lock:
                await self._run_batch(batch)

    def _refusal(self, work: Work) -> ProtocolError | None:
        """`overloaded` for a fast-lane write whose embedding would wait past write_backlog at the
        model's measured rate (None: let it in). Called before the write is routed: a refused
        write changes nothing."""
        budget, rate = self.write_backlog, self.seconds_per_char
        if not budget or rate is None or not self._fast_chars:
            return None
        cost = write_cost(work.call, self.state.embed_chars)
        if not cost or cost > FAST_LANE_CHARS or connection_of(work) in self._bulk:
            return None
        refusal = backlog_refusal(self._fast_chars, cost, rate, budget)
        if refusal is not None:
            self.writes_refused += 1
        return refusal

    def _to_bulk(self, work: Work) -> bool:
        """Route a write: True when it went to the bulk lane, False when it is for the fast lane."""
        self.writes_waiting += 1
        key = connection_of(work)
        queue = self._bulk.get(key)
        cost = write_cost(work.call, self.state.embed_chars)
        if queue is None and cost <= FAST_LANE_CHARS:
            self._fast_owed[key] = self._fast_owed.get(key, 0) + 1
            self._fast_chars += cost
            return False
        if queue is None:
            queue = self._bulk[key] = collections.deque()
            self._bulk_turns.append(key)
        queue.append(BulkJob(work, self.state.embed_chars))
        self._bulk_wakeup.set()
        return True

    async def _write_pipeline(self, recv: Any) -> None:
        """The fast lane: writes in arrival order, in batches: embed what they need (no lock held),
        then apply and journal."""
        async for first in recv:
            batch = with_waiting(first, recv)
            embedded = await self._embed_writes(batch)
            try:
                await self._run_embedded(batch, embedded)
            finally:
                self.writes_waiting -= len(batch)
                self._fast_chars -= sum(write_cost(work.call, self.state.embed_chars) for work in batch)
                for work in batch:
                    key = connection_of(work)
                    left = self._fast_owed[key] - 1
                    if left:
                        self._fast_owed[key] = left
                    else:
                        del self._fast_owed[key]
                self._fast_changed.set()
                self._fast_changed = trio.Event()

    async def _embed_writes(self, batch: list[Work]) -> tuple[Prepared, str | None]:
        """The passages a batch of writes needs, embedded (the state lock is held only to find them)."""
        calls = [work.call for work in batch]
        items = sum(len(call.params.items) if call.spec.name == "memory.add_many" else 1 for call in calls)
        async with self._state_lock:
            if items <= INLINE_CHECK_ITEMS:  # a few hashes and lookups: cheaper here than a thread hop
                passages, queries = self.state.texts_to_embed(calls)
            else:
                passages, queries = await self._call_on_state(lambda state: state.texts_to_embed(calls))
        if not (passages or queries):
            return Prepared(), None
        return await self._embedded_for(passages, queries)

    async def _bulk_lane(self) -> None:
        """Large writes, a slice at a time, round robin between connections (daemon/memory/lanes.py)."""
        while True:
            if not self._bulk_turns:
                if self._closing:
                    return
                await self._bulk_wakeup.wait()
                self._bulk_wakeup = trio.Event()
                continue
            key = self._bulk_turns.popleft()
            queue = self._bulk[key]
            while self._fast_owed.get(key):  # this connection's earlier writes in the fast lane go first
                await self._fast_changed.wait()
            job = queue[0]
            try:
                done = await job.step(self._embed_and_run)
            except BaseException:
                self.writes_waiting -= len(queue)
                del self._bulk[key]
                raise
            if done:
                queue.popleft()
                self.writes_waiting -= 1
            if queue:
                self._bulk_turns.append(key)
            else:
                del self._bulk[key]

    async def _query_pipeline(self, recv: Any) -> None:
        """Reads that need a query embedded (or, for an inject with include_summary, their domain's
        conversation summary read): embed and read (no lock held), then run with the state."""
        async for first in recv:
            batch = with_waiting(first, recv)
            queries = [q for q in dict.fromkeys(query_to_embed(work.call) for work in batch) if q is not None]
            embedded = await self._embedded_for([], queries)
            await self._fetch_messages(batch, embedded)
            slugs = list(dict.fromkeys(domain_slug(w.call.params.domain) for w in batch if wants_summary(w.call)))
            if slugs and self.group_summaries is not None:
                try:
                    embedded[0].summaries = await self.group_summaries(slugs)
                except Exception:  # the block goes without it (its `summary` says so)
                    log.exception("reading the conversation summaries for memory.inject failed")
            await self._run_embedded(batch, embedded)

    async def _fetch_messages(self, batch: list[Work], embedded: tuple[Prepared, str | None]) -> None:
        """The conversation messages the batch's injections ask for (no lock held: another tier's
        actor answers), into the batch's Prepared; a failure is kept as the injection's error."""
        prepared, error = embedded
        for key in dict.fromkeys(k for k in (messages_to_fetch(work.call) for work in batch) if k is not None):
            if self.messages is None:
                prepared.messages[key] = "the daemon has no conversation tier"
                continue
            group, query, count = key
            vector = prepared.queries.get(query)
            try:
                prepared.messages[key] = await self.messages(group, query, count, vector, error if vector is None else None)
            except ProtocolError as exc:
                prepared.messages[key] = exc.message
            except Exception as exc:  # a bug there: the memories still go in, and the answer says why no messages
                log.exception("tier 4: memory.inject could not read the conversation's messages")
                prepared.messages[key] = f"the conversation search failed: {type(exc).__name__}: {exc}"

    async def _embedded_for(self, passages: list[str], queries: list[str]) -> tuple[Prepared, str | None]:
        """Embed in a worker thread (daemon/memory/embedding.py); a write embedding's time feeds the
        fast lane's estimate of the model's rate (lanes.py)."""
        prepared, error, passages_s = await self.embeddings.embed(
            passages, queries, self._previous_embedder if queries else None
        )
        if passages_s is not None:
            self.seconds_per_char = smoothed(self.seconds_per_char, passages_s / max(1, sum(len(text) for text in passages)))
        return prepared, error

    async def warm_queries(self, queries: list[str]) -> int:
        """Embed the queries not in the query cache and keep them there (Embeddings.warm): a later
        search or inject with one of them as its query embeds nothing. How many were embedded."""
        return await self.embeddings.warm(queries)

    async def _embed_and_run(self, batch: list[Work]) -> None:
        """A bulk-lane slice: embed what the writes need (no lock held), then run them on the state."""
        await self._run_embedded(batch, await self._embed_writes(batch))

    async def _run_embedded(self, batch: list[Work], embedded: tuple[Prepared, str | None]) -> None:
        """Run a batch on the state with the embeddings a pipeline computed for it."""
        async with self._state_lock:
            self._embedded = embedded
            try:
                await self._run_batch(batch)
            finally:
                self._embedded = None

    async def commit_batch(self, calls: list[Call], results: list[Any], mutations: list[Any]) -> list[Any]:
        """On several nodes (store = postgres), the batch's decisions are checked in its transaction
        against what the other nodes committed; when they conflict, the batch is decided again on the
        committed state (daemon/memory/concurrency.py's rule). The journal store: the plain commit."""
        if self.store is None or self.store.store_name != "postgres":
            return await super().commit_batch(calls, results, mutations)
        store: CheckingStore = self.store  # type: ignore[assignment]  # PostgresStore
        after: int | None = None
        for _attempt in range(RETRIES):
            try:
                await store.commit(mutations, Decisions(mutations, self.state.deduplicated, after))
                return results
            except StoreConflict as conflict:
                self.conflicts += 1
                results, mutations = await self._run_sync(self._decide_again, calls, conflict.rows)
                after = conflict.head
                if not mutations:  # decided again: nothing to write (a skip, or an error)
                    return results
        raise StoreUnavailable(
            f"other nodes kept changing what this write decided on ({RETRIES} tries); try again", "unavailable", store="postgres"
        )

    def _decide_again(self, calls: list[Call], rows: list[tuple[int, str, bytes]]) -> tuple[list[Any], list[Any]]:
        """After a conflict: the batch rolled back, the feed it was checked against applied (committed
        already: no undo kept, nothing to commit), its calls run again; their results and mutations."""
        state = self.state
        state.rollback()
        node = self.store.node_id  # type: ignore[union-attr]  # PostgresStore
        for seq, writer, mutation in caught_up(rows):
            state.apply(mutation)
            if writer != node:
                self.caught.add(seq, mutation)
        state.begin_batch()
        results = self._process(calls, self._embedded)
        return results, state.take_pending()

    async def apply_feed(self, mutations: list[Any], again: Callable[[], list[Any]] = list) -> None:
        """Other nodes' committed mutations (TierActor.apply_feed), but those _decide_again applied
        already (CaughtUp), decided under the state lock, as the feed's own apply; then `again()`'s
        (the node's own commits the feed has not reached: feed.py's re-apply rule)."""
        def apply(state: MemoryState) -> None:
            applied = self.store.own.applied if self.store is not None and hasattr(self.store, "own") else 0
            for mutation in [*self.caught.unapplied(mutations, applied), *again()]:
                state.apply(mutation)

        await self.run_internal(apply)

    async def handle_calls(self, calls: list[Call]) -> list[Any]:
        results = await self._run_sync(self._process, calls, self._embedded)
        if self.on_purge is not None and any(
            call.spec.name == "memory.delete" and call.params.purge and isinstance(result, dict)
            for call, result in zip(calls, results)
        ):
            self.on_purge()  # the daemon snapshots soon: the journal segments with the text go
        result: list[Any] = results
        return result

    async def _call_on_state(self, fn: Callable[[Any], Any]) -> Any:
        return await self._run_sync(fn, self.state)

    def _process(self, calls: list[Call], embedded: tuple[Prepared, str | None] | None = None) -> list[Any]:
        state = self.state
        if embedded is None:
            try:
                prepared = state.prepare(calls)
                state.embed_error = None
            except Exception as exc:  # the embedder failed: calls that need it answer `unavailable`
                log.error("embedding failed: %s", exc)
                prepared = Prepared()
                state.embed_error = f"the embedder {state.model} failed: {exc}"
        else:
            prepared, state.embed_error = embedded
        results: list[Any] = []
        try:
            for call in calls:
                try:
                    results.append(state.run(call.spec.name, call.params, prepared))
                except ProtocolError as exc:
                    results.append(exc)
                except Exception as exc:
                    log.exception("internal error in %s", call.spec.name)
                    results.append(ProtocolError("internal", f"internal error in {call.spec.name}: {type(exc).__name__}: {exc}"))
        finally:
            state.forget_prepared()  # the batch's texts and vectors are not kept (a purge erases them)
        return results

    async def propose(self, memory_id: str, reason: str, by: str | None = None) -> dict[str, Any]:
        """The learning loop's proposal that a memory it judged general be shared: a review request of
        kind "proposal" under the domain's share policy and the automatic check (daemon/memory/review.py),
        journaled before this returns. `reason` is redacted here. Raises ProtocolError for bad input."""
        from .review import LEARNING_LOOP, propose

        text = self.redactor.text(reason) if self.redactor is not None else reason
        return await self.run_internal(lambda state: propose(state, memory_id, text, by or LEARNING_LOOP))

    async def list_readable(self, params: m.MemoryList) -> dict[str, Any]:
        """memory.list with `readable: true`: the page and, as `readable`, the text the readable
        projection would write now for the domain (its MEMORY.md; no domain: GLOBAL.md), the group
        summary included. One internal call reads both (one moment of the state); the summary is
        read after it, with the state let go, as the projector does. Raises ProtocolError for bad input."""
        slug = None if params.domain is None else domain_slug(params.domain)

        def read(state: MemoryState) -> tuple[dict[str, Any], tuple[str, str, list[Any], bool]]:
            page = state.do_list(params)  # validates the domain first
            return page, state.readable_document(slug, name=params.domain)

        page, (relative, domain, listed, has_global) = await self.run_internal(read)
        summary = (await self._summaries([slug])).get(slug) if slug is not None else None
        page["readable"] = render_readable(
            domain, listed, is_global=slug is None, has_global=has_global, summary=summary
        )
        return page

    # --- background work ---------------------------------------------------------------------------

    async def project_files(self, durable: bool = False) -> int:
        """Write the memory files that changed (MemoryFiles.project: durably when a snapshot asks); the number written."""
        return await self.files.project(durable)

    async def scan_files(self, full: bool = False) -> dict[str, int]:
        """One scan of memories/ (MemoryFiles.scan): the counts of what it found others wrote."""
        return await self.files.scan(full)

    async def wait_projected(self) -> None:
        """Return after the next projection that writes files (MemoryFiles.wait_projected)."""
        await self.files.wait_projected()

    @property
    def watcher(self) -> Watcher:
        """What the scans of memories/ know (MemoryFiles owns it)."""
        return self.files.watcher

    @property
    def first_scan(self) -> trio.Event:
        """Set once the scan at start is done (or failed)."""
        return self.files.first_scan

    async def _summaries(self, slugs: list[str]) -> dict[str, str]:
        """The group summaries of these domains (see `summaries`); none when that fails."""
        if self.summaries is None or not slugs:
            return {}
        try:
            return await self.summaries(slugs)
        except Exception:
            log.exception("tier 4: could not read group summaries for MEMORY.md; written without them")
            return {}

    async def reembed_some(self, limit: int = REEMBED_BATCH) -> int:
        """Embed up to `limit` memories that lack a vector of the current model."""
        def pick(s: MemoryState) -> tuple[list[Memory], list[list[str]]]:
            todo = [s.memories[i] for i in s.missing_vectors(limit)]
            return todo, [s.passage_texts(memory.title, memory.content, own_abstract(memory)) for memory in todo]

        todo: list[Memory]
        windows: list[list[str]]
        todo, windows = await self.run_internal(pick)  # the texts are found by the state's owner
        if not todo:
            return 0
        # abandoned when cancelled (a stop during the embedding): the thread's result is dropped, the
        # memories stay unembedded and are embedded again after the restart
        rows = await trio.to_thread.run_sync(
            self.embedder.embed_passages, [text for texts in windows for text in texts], abandon_on_cancel=True
        )
        vectors, at = [], 0
        for texts in windows:
            vectors.append(pooled(list(rows[at : at + len(texts)])))
            at += len(texts)

        def commit(s: MemoryState) -> int:
            done = 0
            for memory, vector in zip(todo, vectors):
                if s.memories.get(memory.id) is memory:  # unchanged meanwhile
                    s.commit(PutMemory(memory, s.model, vector.astype("float32").tobytes()))
                    done += 1
            return done

        done = await self.run_internal(commit)
        self.reembedded += done
        return done

    # --- memory.list with readable: true ------------------------------------------------------------

    def can_inline(self, call: Call) -> bool:
        return super().can_inline(call) and not _is_readable_list(call)

    def submit(self, work: Work) -> None:
        if self._nursery is not None and _is_readable_list(work.call):  # reads the conversation tier too
            self._nursery.start_soon(self._answer_readable, work)
            return
        super().submit(work)

    async def _answer_readable(self, work: Work) -> None:
        """memory.list with `readable: true`, in a task of its own: the page and the projection's text."""
        result: Any
        try:
            result = await self.list_readable(work.call.params)
        except ProtocolError as exc:
            result = exc
        except Exception as exc:
            log.exception("memory.list failed")
            result = ProtocolError("internal", f"memory.list failed: {exc}")
        work.reply.deliver(work.call, result, work.started_ns)
        work.reply.flush()

    # --- the background loops -----------------------------------------------------------------------

    def stop_loops(self) -> None:
        """At shutdown, before the final snapshot: no more projections, scans, embedding or
        maintenance requests (an embedding batch under way is abandoned: reembed_some)."""
        self._loops_scope.cancel()

    async def _run_loops(self, loops: MemoryLoops) -> None:
        with self._loops_scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._background, loops.projection_interval)
                if loops.watch_interval:
                    nursery.start_soon(self.files.watch, loops.watch_interval)
                if self.maintenance is not None:
                    nursery.start_soon(schedule, self.maintenance, loops.maintenance_at, loops.maintenance_catchup)

    async def _background(self, interval: float) -> None:
        """Write changed memory files about every `interval` seconds; embed memories that lack a
        vector, logging the progress (counts, rate, time left) every EMBED_LOG_EVERY seconds."""
        progress = self.embedding
        try:
            renamed = await self.run_internal(lambda state: state.separate_shared_files())
            if renamed:
                log.warning("tier 4: %d memories shared a file with another; each has its own now", len(renamed))
        except Exception:
            log.exception("tier 4: could not separate memories that share a file; will try at the next start")
        while True:
            await trio.sleep(interval)
            try:
                await self.project_files()
                while True:
                    pending = self.stats().get("unembedded", 0)
                    if pending and not progress.running:
                        progress.begin(trio.current_time(), pending)
                        log.info("tier 4: embedding %d memories in the background with %s", pending, self.model)
                    done = await self.reembed_some(progress.batch())
                    if not done:
                        break
                    now = trio.current_time()
                    progress.add(now, done, self.stats().get("unembedded", 0))
                    if progress.due(now):
                        log.info("tier 4: %s", progress.describe(now, self.model))
                    await self.project_files()
                if progress.running and not self.stats().get("unembedded", 0):
                    log.info("tier 4: %s", progress.finish(trio.current_time(), self.model))
            except trio.ClosedResourceError:
                return  # the actor closed: the daemon is stopping
            except Exception:
                log.exception("memory background work failed; will try again")

    def statistics(self) -> dict[str, Any]:
        """memory.* in sys.stats: the actor's counters and what _publish copied (never the state).
        `search` is memory.search's own time (index, BM25, fusion), `query_embedding` the query's
        embedding (per query, before the search runs), in microseconds; `watch` the scans of
        memories/ (files others wrote)."""
        return {
            "files_written": self.files.files_written,
            "watch": {"enabled": self.watching, **self.watcher.statistics()},
            "projection_errors": self.files.projection_errors,
            "reembedded": self.reembedded,
            "decided_again": self.conflicts,  # batches decided again after another node's commit (several nodes)
            "model": self.model,
            "writes_waiting": self.writes_waiting,
            # the fast lane's bound: the writes refused `overloaded`, the embedding waiting (ms, at
            # the measured rate) and that rate (us per character)
            "writes_refused": self.writes_refused,
            "write_backlog_ms": round(self._fast_chars * (self.seconds_per_char or 0.0) * 1000),
            "embed_us_per_char": None if self.seconds_per_char is None else round(self.seconds_per_char * 1e6, 2),
            "lexical_index_from": self._lexical_from,  # "snapshot", "rebuilt" (from the texts) or "new"
            "search": {mode: histogram.summary() for mode, histogram in self._timings.items()},
            **self.embeddings.statistics(),
        }


async def _summaries_and_intents(conversation: ConversationReads, slugs: list[str]) -> dict[str, GroupSummary]:
    """memory.inject's include_summary: each conversation group's summary and intents, as tier 4's GroupSummary."""
    found = await conversation.summaries_and_intents(slugs)
    return {slug: GroupSummary(summary, intents) for slug, (summary, intents) in found.items()}


def _is_readable_list(call: Call) -> bool:
    return call.spec.name == "memory.list" and bool(call.params.readable)



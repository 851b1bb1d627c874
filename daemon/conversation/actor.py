"""The conversation tier's actor: searches that embed their query first, the background embedder,
retention, and snapshots.

Rules kept here:
- The state is touched only by this actor, one batch or internal call at a time, in a worker
  thread (BM25, hnswlib and the snapshot's encoding are heavy); the event loop keeps serving the
  other tiers meanwhile. Cheap reads (get, groups, summary) may run on the connection's reader
  (the fast path of daemon/tier.py) while the actor owes nothing.
- Nothing waits for an embedding while holding the state. A search first has its query embedded
  by the query pipeline (no state involved), then enters the actor's queue like any call, so it
  sees every write sent before it. When the model is not loaded yet, or fails, the search answers
  from BM25 alone at once (the failure is named in `why.dense_error`).
- conversation.flush never holds the actor: it is answered by a task of its own that reads the
  group through an internal call (so it sees every write sent before it) and asks the job queue
  (daemon/jobs/conversation.py: ConversationTrigger.request; the actor makes its trigger at
  construction, and runs its periodic extraction as a loop of its own, stopped before the final
  snapshot by stop_loops).
- Message vectors are computed in the background, in batches: the texts to embed are taken from
  the state (an internal call), embedded without it, and stored by a second internal call only
  for messages whose dense text is still the one embedded. Vectors are not journaled (they are
  derived); snapshots save them beside the state.
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import re
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import msgspec
import numpy as np
import trio

from ...protocol import Call, ProtocolError
from ...protocol import methods as m
from ..retrieval.vector_files import remove_unnamed_vector_files
from ..retrieval.vectors import VectorStore
from ..storage.files import RealFiles, atomic_write
from ..storage.store import Store, StoreUnavailable
from ..tier import MAX_BATCH, TierActor, Work, handles
from .state import ConversationSnapshot, ConversationState, PutSummary, Window

log = logging.getLogger("eurekamem.conversation")


EMBED_BATCH = 64  # messages per background embedding call


EMBED_RETRY = 30.0  # seconds before the background embedder tries again after the model failed


RETENTION_INTERVAL = 3600.0  # seconds between retention passes (only when retention is configured)


SEARCH = "conversation.search"


FLUSH = "conversation.flush"


class ExtractionTrigger(Protocol):
    """Asks the job queue for conversation extractions (daemon/jobs/conversation.py's
    ConversationTrigger): conversation.flush's and the periodic one's."""

    async def request(self, group: str, trigger: str) -> str | None: ...

    async def periodic(self, interval: float, min_chars: int) -> None: ...

    def statistics(self) -> dict[str, Any]: ...


class ConversationActor(TierActor):
    state: ConversationState
    # a search enters the queue only once its query is embedded, so a write sent after it may run
    # first: the connection keeps one connection's order for this tier (protocol/_connection.py)
    ARRIVAL_ORDER = False

    def __init__(
        self,
        state: ConversationState,
        store: Store,
        *,
        retention_days: float = 0.0,
        session_gap: float | None = None,
        trigger: Callable[[ConversationActor], ExtractionTrigger] | None = None,
        extract_interval: float = 0.0,
        extract_min_chars: int = 0,
    ) -> None:
        if session_gap is not None:
            state.session_gap = session_gap  # before anything reads the state (Config.conversation_session_gap)
        self._work: dict[str, Any] = state.statistics()  # published by the actor only (_publish)
        super().__init__(state, store, inline=True)
        # the state's embedder, taken once here: the query pipeline and the background embedder run
        # beside the actor's batches, so they never read the state (the embedder is thread-safe)
        self.embedder = state.embedder
        self.retention_days = retention_days
        # the extraction's triggers (conversation.flush, the periodic one), made for this actor
        self.trigger = trigger(self) if trigger is not None else None
        self.extract_interval = extract_interval
        self.extract_min_chars = extract_min_chars
        self._loops_scope = trio.CancelScope()  # the periodic extraction: stop_loops, or the actor's end
        self._query_send, self._query_recv = trio.open_memory_channel[Work](math.inf)
        self._query_vectors: dict[int, tuple[np.ndarray | None, str | None]] = {}  # id(call) -> (vector, error)
        self._wake = trio.Event()  # set when messages may need vectors
        self.embed_errors = 0
        self.dropped = 0  # messages removed by retention since start
        self.flush: Callable[[str], Awaitable[str | None]] | None = None  # the trigger's request for conversation.flush
        if self.trigger is not None:
            trigger_of = self.trigger
            self.flush = lambda group: trigger_of.request(group, FLUSH)
        self._nursery: trio.Nursery | None = None

    # --- the queue -------------------------------------------------------------------------------

    def submit(self, work: Work) -> None:
        if work.call.spec.name == FLUSH and self._nursery is not None:
            self._nursery.start_soon(self._answer_flush, work)
            return
        if work.call.spec.name == SEARCH:
            self._owed += 1  # owed from now: reads sent after it no longer take the fast path
            self._query_send.send_nowait(work)
        else:
            super().submit(work)

    def close(self) -> None:
        self._query_send.close()
        super().close()

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._query_pipeline)
            nursery.start_soon(self._embed_loop)
            if self.retention_days > 0:
                nursery.start_soon(self._retention_loop)
            if self.trigger is not None:
                nursery.start_soon(self._periodic_extraction, self.trigger)
            await super().run()
            nursery.cancel_scope.cancel()

    def stop_loops(self) -> None:
        """At shutdown, before the final snapshot: the periodic extraction asks for no more jobs."""
        self._loops_scope.cancel()

    def trigger_statistics(self) -> dict[str, Any] | None:
        """jobs.conversation in sys.stats: what the trigger counted (None without one)."""
        return self.trigger.statistics() if self.trigger is not None else None

    async def _periodic_extraction(self, trigger: ExtractionTrigger) -> None:
        """The periodic conversation extraction (daemon/jobs/conversation.py), until shutdown."""
        with self._loops_scope:
            await trigger.periodic(self.extract_interval, self.extract_min_chars)

    # --- reads for tier 4 (MemoryActor's ConversationReads) ------------------------------------------

    async def group_summaries(self, slugs: list[str]) -> dict[str, str]:
        """The summary of each group whose domain slug is in `slugs` (a domain that is a
        conversation group), as an internal call, for tier 4's MEMORY.md."""
        wanted = set(slugs)

        def read(state: ConversationState) -> dict[str, str]:
            return {g.slug: g.summary.summary for g in state.groups.values() if g.slug in wanted and g.summary.summary}

        result: dict[str, str] = await self.run_internal(read)
        return result

    async def summaries_and_intents(self, slugs: list[str]) -> dict[str, tuple[str, list[str]]]:
        """The summary and intents of each group whose domain slug is in `slugs`, as an internal
        call (memory.inject's include_summary)."""
        wanted = set(slugs)

        def read(state: ConversationState) -> dict[str, tuple[str, list[str]]]:
            return {
                g.slug: (g.summary.summary, list(g.summary.intents))
                for g in state.groups.values()
                if g.slug in wanted and (g.summary.summary or g.summary.intents)
            }

        result: dict[str, tuple[str, list[str]]] = await self.run_internal(read)
        return result

    async def _query_pipeline(self) -> None:
        """Embed the queries of the searches waiting (one call for all), then queue the searches."""
        embedder = self.embedder
        async for first in self._query_recv:
            batch = [first]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._query_recv.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            queries = list(dict.fromkeys(work.call.params.query for work in batch))
            vectors: dict[str, np.ndarray] = {}
            error: str | None = None
            if embedder.loaded:  # still loading: BM25 answers now rather than after the model
                try:
                    rows = await trio.to_thread.run_sync(embedder.embed_queries, queries)
                    vectors = dict(zip(queries, rows))
                except Exception as exc:
                    log.error("conversation search: the query could not be embedded: %s", exc)
                    error = f"the embedder {embedder.name} failed: {exc}"
            for work in batch:
                self._query_vectors[id(work.call)] = (vectors.get(work.call.params.query), error)
                try:
                    self._send.send_nowait(work)
                except trio.ClosedResourceError:  # shutting down: the connection is gone already
                    self._query_vectors.pop(id(work.call), None)
                    self._owed -= 1

    async def _answer_flush(self, work: Work) -> None:
        result: Any
        try:
            if self.flush is None:
                raise ProtocolError("unavailable", "conversation extraction is not running in this daemon")
            result = {"job_id": await self.flush(work.call.params.group)}
        except ProtocolError as exc:
            result = exc
        except StoreUnavailable as exc:
            result = exc.error()
        except (trio.ClosedResourceError, trio.EndOfChannel):
            result = ProtocolError("unavailable", "the daemon is shutting down")
        except Exception as exc:  # a bug: answer `internal`, keep serving
            log.exception("internal error in %s", FLUSH)
            result = ProtocolError("internal", f"internal error in {FLUSH}: {type(exc).__name__}: {exc}")
        work.reply.deliver(work.call, result, work.started_ns)
        work.reply.flush()

    @handles(FLUSH, "actor")
    async def do_flush(self, call: Call) -> Any:
        """Never run in a batch (it waits for the job queue): submit() hands every conversation.flush
        to a task of its own, _answer_flush."""
        raise AssertionError("conversation.flush is answered by _answer_flush, outside the actor's batches")

    # --- batches (in a worker thread) ------------------------------------------------------------

    async def handle_calls(self, calls: list[Call]) -> list[Any]:
        dense = {id(c): self._query_vectors.pop(id(c), (None, None)) for c in calls if c.spec.name == SEARCH}
        results = await trio.to_thread.run_sync(self._process, calls, dense)
        if self.state.to_embed:
            self._wake.set()
        return results

    def _process(self, calls: list[Call], dense: dict[int, tuple[np.ndarray | None, str | None]]) -> list[Any]:
        return [
            self._search_now(call, *dense[id(call)]) if call.spec.name == SEARCH else self._handle_now(call)
            for call in calls
        ]

    def _search_now(self, call: Call, vector: np.ndarray | None, error: str | None) -> Any:
        try:
            return self.state.search(call.params, vector, error)
        except ProtocolError as exc:
            return exc
        except Exception as exc:  # a bug: answer `internal`, keep serving
            log.exception("internal error in %s", call.spec.name)
            return ProtocolError("internal", f"internal error in {call.spec.name}: {type(exc).__name__}: {exc}")

    @handles(SEARCH, "actor")  # an actor handler: never on the fast path (its query is embedded first)
    async def _search(self, call: Call) -> Any:
        """conversation.search outside a batch of handle_calls (which runs it in its thread with the rest)."""
        vector, error = self._query_vectors.pop(id(call), (None, None))
        return await trio.to_thread.run_sync(self._search_now, call, vector, error)

    async def search_messages(
        self, group: str, query: str, k: int, vector: np.ndarray | None, error: str | None
    ) -> list[dict[str, Any]]:
        """conversation.search for another tier (memory.inject), with the query's vector computed
        there (the same embedder object), as an internal call of this actor."""
        p = m.ConversationSearch(group=group, query=query, k=k)
        hits: list[dict[str, Any]] = await self.run_internal(lambda state: state.search(p, vector, error))
        return hits

    async def _call_on_state(self, fn: Callable[[Any], Any]) -> Any:
        return await trio.to_thread.run_sync(fn, self.state)

    # --- background embedding --------------------------------------------------------------------

    async def _embed_loop(self) -> None:
        while True:
            try:
                while await self.embed_some():
                    pass
            except Exception as exc:  # the model failed: the messages stay queued, and BM25 serves
                self.embed_errors += 1
                log.error("conversation: embedding messages failed (retrying in %.0f s): %s", EMBED_RETRY, exc)
                await trio.sleep(EMBED_RETRY)
                continue
            await self._wake.wait()
            self._wake = trio.Event()

    async def embed_some(self, limit: int = EMBED_BATCH) -> int:
        """Embed up to `limit` messages that need a vector; the number stored (0: none waiting)."""
        todo = await self.run_internal(lambda s: s.take_to_embed(limit))
        if not todo:
            return 0
        vectors = await trio.to_thread.run_sync(self.embedder.embed_passages, [text for _, text, _ in todo])
        stored = await self.run_internal(lambda s: s.put_vectors(todo, vectors))
        result: int = max(stored, 1)  # texts that changed meanwhile are taken again on the next call
        return result

    # --- the extraction hooks --------------------------------------------------------------------

    async def window(self, group: str, token_budget: int | None = None) -> Window:
        return await self.run_internal(lambda s: s.window(group, token_budget))

    async def move_mark(self, group: str, mark: int) -> None:
        """Set the group's high-water mark; journaled before this returns (StoreUnavailable if not)."""
        await self.run_internal(lambda s: s.move_mark(group, mark))

    async def set_summary(self, group: str, summary: str, intents: list[str]) -> PutSummary:
        return await self.run_internal(lambda s: s.put_summary(group, summary, intents))

    # --- retention -------------------------------------------------------------------------------

    async def _retention_loop(self) -> None:
        while True:
            try:
                await self.apply_retention()
            except Exception:
                log.exception("conversation retention failed; will try again")
            await trio.sleep(RETENTION_INTERVAL)

    async def apply_retention(self, now: _dt.datetime | None = None) -> int:
        """Drop the messages extracted more than retention_days ago (journaled); how many were dropped."""
        when = now or _dt.datetime.now(_dt.UTC)

        def prune(state: ConversationState) -> tuple[int, bool]:
            expired = state.expired(when, self.retention_days)
            for group, seqs in expired.items():
                state.drop(group, seqs)
            # read here, by the owner: the neighbours of what went have new documents to embed
            return sum(len(seqs) for seqs in expired.values()), bool(state.to_embed)

        dropped, to_embed = await self.run_internal(prune)
        self.dropped += dropped
        if to_embed:
            self._wake.set()
        return dropped

    # --- snapshots -------------------------------------------------------------------------------

    async def save_snapshot(self, snapshot_path: Path, vectors_dir: Path) -> None:
        await self.run_internal(lambda s: save_snapshot(s, snapshot_path, vectors_dir))

    def _publish(self) -> None:
        """Copy what sys.stats shows of the state (the actor, as the state's owner, between batches)."""
        super()._publish()
        self._work = self.state.statistics()

    def statistics(self) -> dict[str, Any]:
        """conversation.* in sys.stats: the actor's counters and what _publish copied (never the state)."""
        work = dict(self._work)
        return {
            **work,
            "search": work["search"].summary(),
            "embed_errors": self.embed_errors,
            "dropped": self.dropped,
            "searches_waiting": self._query_recv.statistics().current_buffer_used,
        }


def save_snapshot(state: ConversationState, snapshot_path: Path, vectors_dir: Path) -> None:
    """The vectors when they changed (under a new stem), then conversations.snapshot naming them,
    then the vector files no snapshot names any more. A crash at any point leaves a snapshot whose
    vector files exist (or none, and the vectors are computed again)."""
    vectors_dir.mkdir(parents=True, exist_ok=True)
    fingerprint = state.vectors.fingerprint()
    if not (
        state.vectors_stem
        and fingerprint == state.saved_fingerprint
        and (vectors_dir / f"{state.vectors_stem}.vectors").exists()
    ):
        stem = f"{re.sub(r'[^A-Za-z0-9_-]', '_', state.model)}.{secrets.token_hex(4)}"
        state.vectors.save(str(vectors_dir), stem)
        state.vectors_stem, state.saved_fingerprint = stem, fingerprint
    doc = state.snapshot_document()
    atomic_write(RealFiles(), str(snapshot_path), msgspec.msgpack.encode(doc))
    remove_unnamed_vector_files(vectors_dir, {state.vectors_stem})


def load_snapshot(state: ConversationState, snapshot_path: Path, vectors_dir: Path) -> bool:
    """Load conversations.snapshot (and its vectors) into a fresh state; False when there is none."""
    if not snapshot_path.exists():
        return False
    doc = msgspec.msgpack.decode(snapshot_path.read_bytes(), type=ConversationSnapshot)
    vectors = None
    if doc.vectors_stem and doc.model == state.model and vectors_dir.exists():
        vectors = VectorStore.load(
            str(vectors_dir),
            doc.vectors_stem,
            dim=state.embedder.dim,
            model=state.model,
            expected_fingerprint=doc.vectors_fingerprint,
        )
    state.load_snapshot(doc, vectors)
    return True

"""Tier 4's texts embedded off the event loop, and the query cache.

Rule kept here: the embedding threads touch neither the state nor the actor: they get the texts
and give back vectors and timings as the return value of the worker thread's call (the embedder is
thread-safe); what they hand back is recorded here, in trio. The query cache (query embeddings
recently computed or pre-warmed: the intents an extraction predicted) is read and written on the
event loop only, by the memory actor's pipelines and warm_queries, never by a worker thread; it
keeps at most QUERY_CACHE queries, the oldest dropped first.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..primitives import Histogram
from .prepared import Prepared

log = logging.getLogger("eurekamem.memory")


QUERY_CACHE = 256  # query embeddings kept (see Embeddings.query_cache)


class Embeddings:
    """Embeds passages and queries in a worker thread (`run_sync`) with the state's embedder,
    fixed for the state's life; held by the memory actor."""

    def __init__(self, embedder: Any, model: str, run_sync: Callable[..., Awaitable[Any]]) -> None:
        self.embedder = embedder
        self.model = model
        self._run_sync = run_sync
        self.query_cache: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self.query_cache_hits = 0
        self.warmed = 0
        self.query_embedding_time = Histogram()  # per query embedded, in microseconds

    async def embed(
        self, passages: list[str], queries: list[str], previous: Any = None
    ) -> tuple[Prepared, str | None, float | None]:
        """The passages and the queries embedded (queries in the cache are not embedded again; with
        `previous`, the old model's embedder while the model changes, every query by it too): the
        vectors, an error (the embedder failed) and the passages' embedding time (s; None when
        none were embedded)."""
        cached = {q: self.query_cache[q] for q in queries if q in self.query_cache}
        for q in cached:
            self.query_cache.move_to_end(q)
        self.query_cache_hits += len(cached)
        missing = [q for q in queries if q not in cached]
        if not (passages or missing or previous):
            prepared = Prepared()
            prepared.queries = cached
            return prepared, None, None
        prepared, error, each_query_us, passages_s = await self._run_sync(
            self._embed_texts, passages, missing, previous, queries
        )
        if each_query_us is not None:
            for _ in missing:
                self.query_embedding_time.add(each_query_us)
        if error is None:
            self._remember(prepared.queries)
            prepared.queries.update(cached)
        return prepared, error, passages_s

    async def warm(self, queries: list[str]) -> int:
        """Embed the queries not in the query cache (a worker thread) and keep them there: a later
        search or inject with one of them as its query embeds nothing. How many were embedded."""
        missing = [q for q in dict.fromkeys(queries) if q and q not in self.query_cache]
        if not missing:
            return 0
        prepared, error, _, _ = await self._run_sync(self._embed_texts, [], missing)
        if error is not None:
            raise RuntimeError(error)
        self._remember(prepared.queries)
        self.warmed += len(missing)
        return len(missing)

    def _remember(self, vectors: dict[str, Any]) -> None:
        for query, vector in vectors.items():
            self.query_cache[query] = vector
            self.query_cache.move_to_end(query)
        while len(self.query_cache) > QUERY_CACHE:
            self.query_cache.popitem(last=False)

    def _embed_texts(
        self, passages: list[str], queries: list[str], previous: Any = None, previous_queries: list[str] | None = None
    ) -> tuple[Prepared, str | None, float | None, float | None]:
        """Runs in a worker thread and touches nothing of this object but the embedder and the
        model's name (fixed): returns the vectors, an error, each query's embedding time (us) and
        the passages' (s, all of them: one model call). With `previous` (the old model's embedder
        while the model changes), `previous_queries` are embedded by it too; its failure costs only
        the old index's side of those searches."""
        prepared = Prepared()
        embedder = self.embedder
        each: float | None = None
        passages_s: float | None = None
        try:
            if passages:
                started = time.perf_counter()
                prepared.passages = dict(zip(passages, embedder.embed_passages(passages)))
                passages_s = time.perf_counter() - started
            if queries:
                started = time.perf_counter_ns()
                prepared.queries = dict(zip(queries, embedder.embed_queries(queries)))
                each = (time.perf_counter_ns() - started) / 1000 / len(queries)
        except Exception as exc:  # the embedder failed: calls that need it answer `unavailable`
            log.error("embedding failed: %s", exc)
            return Prepared(), f"the embedder {self.model} failed: {exc}", None, None
        if previous is not None and previous_queries:
            try:
                prepared.previous_queries = dict(zip(previous_queries, previous.embed_queries(previous_queries)))
            except Exception as exc:  # the new model's side still answers
                log.error("embedding with the previous model %s failed: %s", previous.name, exc)
        return prepared, None, each, passages_s

    def statistics(self) -> dict[str, Any]:
        """sys.stats' memory.query_embedding and memory.query_cache."""
        return {
            "query_embedding": self.query_embedding_time.summary(),
            "query_cache": {"size": len(self.query_cache), "hits": self.query_cache_hits, "warmed": self.warmed},
        }

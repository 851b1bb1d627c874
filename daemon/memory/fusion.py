"""Weighted reciprocal rank fusion of several rankings of the same labels.

Rule kept here: the fused order depends only on ranks and weights, never on the raw scores of
the lists (which are not comparable: cosine vs BM25), and it is fully deterministic:

    fused(label) = sum over lists L containing label of  weights[L] / (k + rank_L(label))

with 1-based ranks (a label's first occurrence in a list counts; later repeats are ignored) and
k = 60 as in Cormack et al. (2009). Order: fused score descending, then the best (smallest)
rank the label has in any list with a positive weight, then the label ascending. A list missing
from `weights` weighs 1.0; a list of weight 0 still reports its ranks but adds nothing (labels
only it contains are left out).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["fuse"]


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




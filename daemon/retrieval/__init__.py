"""The search library every tier uses: BM25 (`lexical`), dense vectors (`vectors`), their fusion
(`fusion`), calibrated scores (`calibration`), the embedders (`embed`) and what a model sees of a
text (`text`).

Rule kept here: nothing in this package imports a tier (daemon/memory/, daemon/conversation/,
daemon/skills/, daemon/jobs/, daemon/tiers/); the tiers import it. Its pieces own no daemon state:
each index is owned by the tier state that made it, and the embedders are thread-safe.
"""

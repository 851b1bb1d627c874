"""Tier 4, domain memories: state, actor, the Markdown format, vectors, BM25, fusion and embedders."""

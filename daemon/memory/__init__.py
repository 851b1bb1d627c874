"""Tier 4, domain memories: state, actor, records, the Markdown format, strength, review, the
scans of memories/ and the nightly maintenance; its search library is daemon/retrieval/."""

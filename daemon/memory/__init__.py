"""Tier 4, domain memories: its state (state.py's MemoryState, built of data, search, dedup and
projection), the actor, records, the Markdown format, strength, review, the scans of memories/
and the nightly maintenance; its search library is daemon/retrieval/, which every tier uses."""

"""Tiers 1-3: episodic events, persistent records, the knowledge graph (each a state and its actor)."""

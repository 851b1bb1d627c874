"""Durable storage: the file layer, the journal and its actor, EurekaClaw's snapshot formats."""

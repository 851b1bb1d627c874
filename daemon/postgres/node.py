"""This daemon's node id among the daemons sharing one PostgreSQL database.

Rule kept here: a data root has one node id for its whole life, made once (random) and kept in
memory/journal/NODE; one daemon holds a data root at a time (its LOCK), so one node id names at
most one running daemon, and a daemon restarted on its root is the same node (its leases on jobs,
daemon/postgres/jobqueue.py, are its own to take back at start).
"""

from __future__ import annotations

import secrets

from ..paths import Paths
from ..storage.files import RealFiles, atomic_write

NODE_FILE = "NODE"


def node_id(paths: Paths) -> str:
    """The data root's node id (made and written, atomically, on the first call)."""
    path = paths.journal / NODE_FILE
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        text = ""
    if text:
        return text
    made = f"node-{secrets.token_hex(6)}"
    paths.journal.mkdir(parents=True, exist_ok=True)
    atomic_write(RealFiles(), str(path), f"{made}\n".encode())
    return made

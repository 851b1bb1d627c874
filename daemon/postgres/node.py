"""This daemon's identity among the daemons sharing one PostgreSQL database (a node).

Rule kept here: a data root has one node id for its whole life, made once (random) and kept in
memory/journal/NODE; one daemon holds a data root at a time (its LOCK), so one node id names at
most one running daemon, and a daemon restarted on its root is the same node. Everything that
names the node uses this one id, read once at start (daemon/app.py): its commits' rows in the
change feed (`mutations.node`, daemon/postgres/feed.py), its row in `nodes`, its leases on jobs
(daemon/postgres/jobqueue.py: its own to take back at start). Its name (`node_name`, default the
hostname) is only shown.
"""

from __future__ import annotations

import secrets
import socket

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


def node_name(configured: str) -> str:
    """The node's name as sys.stats and `nodes` show it: the configured one, else the hostname."""
    return configured or socket.gethostname()

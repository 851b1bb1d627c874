"""Where the daemon keeps everything under the data root, and the LOCK that keeps a second daemon out."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from pathlib import Path

from .errors import StartupError
from .storage.files import unsafe_root_reason

log = logging.getLogger("eurekamem")


class Paths:
    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir
        self.memory = data_dir / "memory"
        self.persistent = self.memory / "persistent.json"
        self.graph = self.memory / "knowledge_graph.json"
        self.journal = self.memory / "journal"
        self.checkpoint = self.journal / "checkpoint.json"
        self.lock = self.journal / "LOCK"
        self.runs = data_dir / "runs"
        self.memories = data_dir / "memories"
        self.memory_snapshot = self.memory / "memories.snapshot"
        self.jobs_snapshot = self.memory / "jobs.snapshot"
        self.vectors = self.memory / "vectors"
        self.conversation_snapshot = self.memory / "conversations.snapshot"
        self.conversation_vectors = self.memory / "conversation"
        # written when the daemon makes the data root itself: only then is the root folder and
        # everything in it the daemon's to tighten (daemon/app.py); in a folder it found, only
        # OWN_FOLDERS are
        self.made_here = self.journal / "MADE_HERE"


# the folders of a data root that hold memories (the daemon's, or EurekaClaw's that it serves): made
# private at every start, also in a data root the daemon did not make
OWN_FOLDERS = ("memory", "memories", "runs", "skills", "run")


def claim_data_root(paths: Paths) -> bool:
    """Refuse a folder others share as the data root (StartupError, saying why and what to do);
    make the root when it is missing. True when this call made it (the daemon's to tighten whole)."""
    reason = unsafe_root_reason(paths.root)
    if reason is not None:
        raise StartupError(
            f"refusing {paths.root} as the data root: {reason}. A data root holds one user's memories and the "
            "daemon makes it private; give --data-dir (or EUREKACLAW_DIR) a folder of your own, e.g. ~/.eurekaclaw"
        )
    try:
        paths.root.mkdir(parents=True, mode=0o700)
    except FileExistsError:
        return False
    return True


def acquire_lock(paths: Paths) -> int:
    paths.journal.mkdir(parents=True, exist_ok=True)
    fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise StartupError(
                f"another eurekamem daemon (pid {holder}) is using the data root {paths.root}; "
                "stop it first, or give this one another --data-dir"
            ) from None
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd



"""Where the daemon keeps everything under the data root, and the LOCK that keeps a second daemon out."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from pathlib import Path

from eurekamem.daemon import systemd as systemd
from eurekamem.daemon.errors import StartupError
from eurekamem.daemon.storage import eurekaclaw as eurekaclaw

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



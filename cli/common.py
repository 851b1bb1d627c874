"""What the operator commands share: error output, the effective configuration, a client, a progress line.

Rule kept here: every command that changes or reads live data goes through the daemon's socket
(it owns the data while it runs); only `restore` (into an empty folder) and `verify` (which holds
the data root's LOCK, so the daemon cannot run meanwhile) read or write the files themselves.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Iterable
from typing import Any, TextIO

log = logging.getLogger("eurekamem.admin")


def _err(message: str) -> int:
    print(f"eurekamem: {message}", file=sys.stderr)
    return 1


def _effective(args: argparse.Namespace, names: Iterable[str] = ("data_dir", "socket")) -> Any:
    from eurekamem.daemon import config as _config

    flags = {name: getattr(args, name, None) for name in names}
    return _config.load(flags, getattr(args, "config", None))


def _client(args: argparse.Namespace) -> Any:
    """A Client for the daemon's socket, found as `serve` finds it, without importing the daemon."""
    from eurekamem.cli.main import client_socket
    from eurekamem.client import Client

    return Client(client_socket(args), timeout=getattr(args, "timeout", 60.0))


class Progress:
    """A one-line text progress bar on stderr, drawn only when stderr is a terminal."""

    def __init__(self, total: int, label: str, stream: TextIO | None = None, force: bool = False) -> None:
        self.stream = stream or sys.stderr
        try:
            tty = self.stream.isatty()
        except (AttributeError, ValueError):
            tty = False
        self.enabled = force or tty
        self.total = max(total, 0)
        self.label = label
        self.done = 0
        self._last = -1.0

    def add(self, n: int = 1) -> None:
        self.done += n
        self.draw()

    def draw(self, final: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not final and now - self._last < 0.1:
            return
        self._last = now
        fraction = min(1.0, self.done / self.total) if self.total else 1.0
        width = 30
        filled = int(fraction * width)
        bar = "#" * filled + "-" * (width - filled)
        self.stream.write(f"\r{self.label} [{bar}] {fraction * 100:5.1f}% ({self.done}/{self.total})")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.draw(final=True)
            self.stream.write("\n")
            self.stream.flush()



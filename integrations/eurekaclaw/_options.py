"""install()'s options, held for the routed classes (_routed.py reads them, __init__.py sets them):
a leaf module, so that the package and its routed classes do not import each other."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Options:
    """How routed objects reach the daemon (install()'s arguments)."""

    socket_path: str | None = None  # else $EUREKAMEM_SOCKET, else the data root's (client/_manager.py)
    timeout: float | None = None  # seconds a call may take; None: the MemoryManager drop-in's 10 s
    autostart: bool | None = None  # start the daemon on demand; None: unless $EUREKAMEM_NO_AUTOSTART=1


_current = Options()


def current() -> Options:
    """The options of the last install() (the defaults before one)."""
    return _current


def use(options: Options) -> None:
    """Set by install(), under its lock; read-only everywhere else (one writer)."""
    global _current
    _current = options

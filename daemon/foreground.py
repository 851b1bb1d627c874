"""`serve`: the daemon in the foreground from parsed flags, for `eurekamem serve` and `python -m eurekamem.daemon serve`.

Rule kept here: the daemon's side of the command line lives in the daemon (the CLI calls it, never
the other way round); the flags are daemon/config.py's, one per setting, flag > env > file > default.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import Any

import trio

from . import config as _config
from .app import Daemon
from .config import Config, ConfigError, build_config, setup_logging
from .errors import StartupError
from .storage.journal import JournalCorrupt


def _effective(args: argparse.Namespace) -> Any:
    """The effective configuration (flags > env > file > default); ConfigError says what is wrong."""
    return _config.load(_config.flags_from_args(None, args), getattr(args, "config", None))


def serve(args: argparse.Namespace) -> int:
    """Run the daemon in the foreground until SIGTERM or SIGINT; the exit status: 0 after a clean
    shutdown, 1 when the configuration or the start is refused, 2 when the journal is corrupt."""
    try:
        effective = _effective(args)
        config: Config = build_config(effective)
    except ConfigError as exc:
        print(f"eurekamem: {exc}", file=sys.stderr)
        return 1
    setup_logging(effective["log_level"], effective["log_format"])
    daemon = Daemon(config)

    async def main() -> None:
        async with trio.open_nursery() as nursery:

            async def watch_signals() -> None:
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for signum in signals:
                        logging.getLogger("eurekamem").info("signal %s received", signal.Signals(signum).name)
                        daemon.request_shutdown()
                        return

            nursery.start_soon(watch_signals)
            await daemon.serve()
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    except BaseException as exc:  # trio wraps task errors in exception groups; look inside
        leaf = _single_leaf(exc)
        if isinstance(leaf, StartupError):
            print(f"eurekamem: {leaf}", file=sys.stderr)
            return 1
        if isinstance(leaf, JournalCorrupt):
            print(f"eurekamem: {leaf}", file=sys.stderr)
            return 2
        raise
    if daemon.failed is not None:  # it stopped itself (the change feed was trimmed past it): a restart loads afresh
        print(f"eurekamem: {daemon.failed}", file=sys.stderr)
        return 1
    return 0


def _single_leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def main(argv: list[str]) -> int:
    """`python -m eurekamem.daemon serve [flags]`, parsed here: starting the daemon needs no CLI."""
    parser = argparse.ArgumentParser(prog="python -m eurekamem.daemon", description="The eurekamem daemon.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve_parser = sub.add_parser("serve", help="run the daemon in the foreground (Ctrl-C or SIGTERM stops it)")
    _config.add_serve_flags(serve_parser)  # a flag per setting, --data-dir, --socket and --config among them
    return serve(parser.parse_args(argv))

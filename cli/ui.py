"""`eurekamem ui`: the web page for people, served on 127.0.0.1 (see eurekamem/ui/).

Rule kept here: the command is a client of the daemon's socket like the others (it starts the
daemon on demand for the configured data root), and says which extra to install when the web
libraries are missing.
"""

from __future__ import annotations

import argparse
import importlib.util
import signal
import sys
from typing import Any

NEEDS = ("starlette", "hypercorn", "jinja2")


def cmd_ui(args: argparse.Namespace) -> int:
    missing = [name for name in NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        print(f"eurekamem: `eurekamem ui` needs {', '.join(missing)}: pip install 'eurekamem[ui]'", file=sys.stderr)
        return 1
    import trio

    from ..client import AsyncClient, ConfigFileError, resolve_locations
    from ..ui import serve

    try:
        root, socket_path = resolve_locations(args.socket, args.data_dir, args.config)
    except ConfigFileError as exc:
        print(f"eurekamem: {exc}", file=sys.stderr)
        return 1
    client = AsyncClient(socket_path, timeout=args.timeout, autostart=True, data_dir=root)

    async def main() -> None:
        # Ctrl-C and SIGTERM end the page quietly: the server's tasks are cancelled, the client closed
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with client, trio.open_nursery() as nursery:
                await client.call("sys.ping")  # the daemon first (started on demand), so the link works at once
                guard = await nursery.start(serve, client, args.port)
                print(f"eurekamem ui: open {guard.url()}", flush=True)
                print("(the link works once, in one browser; Ctrl-C stops the page)", flush=True)
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    break

    trio.run(main)
    return 0


def add_ui_command(sub: Any, common: Any) -> None:
    ui = sub.add_parser("ui", help="a web page on 127.0.0.1 to see, search, review and correct the memories")
    common(ui)
    ui.add_argument("--port", type=int, default=0, help="the port to serve on (default: a free one)")
    ui.add_argument("--timeout", type=float, default=30.0, help="seconds one daemon call may take")
    ui.set_defaults(func="eurekamem.cli.ui:cmd_ui")

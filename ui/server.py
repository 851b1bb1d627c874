"""Serving the pages: hypercorn's trio worker on 127.0.0.1 only, and the URL with the one-time token.

Rule kept here: the server binds the loopback address and nothing else (the Host check in guard.py
then knows its port); it runs in the caller's trio run, beside the AsyncClient it talks to the
daemon with.
"""

from __future__ import annotations

import logging
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve

from ..client import AsyncClient
from .app import make_app
from .guard import Guard

HOST = "127.0.0.1"


async def serve(
    client: AsyncClient, port: int = 0, *, by: str | None = None,
    task_status: trio.TaskStatus[Guard] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the pages on 127.0.0.1:`port` (0: a free one) until cancelled; `task_status.started`
    gets the Guard, whose `url()` is the link to open (its token works once)."""
    guard = Guard()
    config = Config()
    config.bind = [f"{HOST}:{port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("eurekamem.ui")
    config.include_server_header = False
    app: Any = make_app(client, guard, by)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(hypercorn_serve, app, config)
        guard.port = int(str(binds[0]).rsplit(":", 1)[1])
        task_status.started(guard)

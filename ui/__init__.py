"""`eurekamem ui`: a local web page for people to see, search, review and correct what the agents
remember. A client of the daemon's socket like the CLI (it imports only the protocol and the
client): Starlette pages rendered by Jinja2, served by hypercorn's trio worker on 127.0.0.1, behind
the guard of guard.py. Needs the `ui` extra: pip install 'eurekamem[ui]'.
"""

from __future__ import annotations

from .app import make_app
from .guard import Guard
from .server import serve

__all__ = ["Guard", "make_app", "serve"]

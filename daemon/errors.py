"""The daemon's own exceptions that stop it at start-up (each message says what to do)."""

from __future__ import annotations

import logging

log = logging.getLogger("eurekamem")


class StartupError(Exception):
    """The daemon cannot start; the message says why and what to do."""



"""Stand-in for EurekaClaw v0.2.0 (tests only; see ../README.md)."""

from __future__ import annotations

__version__ = "0.2.0"

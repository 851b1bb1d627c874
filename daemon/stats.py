"""What the daemon reports about itself: request counters and latency histograms per method, tier
4's background embedding as progress, the version and the first log line; read by sys.stats.

Each counter here has one owner on the event loop (the connections for RequestStats, tier 4's
background loop for EmbeddingProgress); sys.stats reads them there too.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
import trio

from ..protocol import Call, ProtocolError
from .primitives import Histogram, monotonic_ns
from .redact import shown

log = logging.getLogger("eurekamem.requests")


class MethodStats:
    __slots__ = ("latency", "errors")

    def __init__(self) -> None:
        self.latency = Histogram()
        self.errors: dict[str, int] = {}


class RequestStats:
    def __init__(self) -> None:
        self.methods: dict[str, MethodStats] = {}
        self.connections_total = 0
        self.connections_open = 0
        self.rate_limited = 0  # requests refused by the per-connection rate limit

    def record(self, call: Any, result: Any, started_ns: int) -> None:
        micros = (monotonic_ns() - started_ns) * 0.001
        name = call.spec.name if type(call) is Call else "(rejected)"
        entry = self.methods.get(name)
        if entry is None:
            entry = self.methods[name] = MethodStats()
        entry.latency.add(micros)
        if isinstance(result, ProtocolError):
            entry.errors[result.kind] = entry.errors.get(result.kind, 0) + 1
            if log.isEnabledFor(logging.DEBUG):
                request_id = getattr(call, "id", None)
                log.debug(
                    "request failed: %s %s: %s", name, result.kind, shown(result.message),  # it may quote an id
                    extra={"request_id": request_id if isinstance(request_id, (int, str)) else None, "method": name, "kind": result.kind},
                )

    def summary(self) -> dict[str, Any]:
        methods = {}
        total = 0
        for name in sorted(self.methods):
            entry = self.methods[name]
            total += entry.latency.total
            methods[name] = {**entry.latency.summary(), "errors": dict(entry.errors)}
        return {
            "total": total,
            "connections_open": self.connections_open,
            "connections_total": self.connections_total,
            "rate_limited": self.rate_limited,
            "methods": methods,
        }




try:
    from importlib.metadata import version as _dist_version

    VERSION = _dist_version("eurekamem")
except Exception:  # not installed as a distribution (running from a source tree)
    VERSION = "0.0.0+source"


def startup_line(config: Any) -> str:
    """The first log line: versions, the data root, the socket, the model, the durability."""
    import platform
    import sys as _sys

    versions = [f"Python {platform.python_version()}", f"trio {trio.__version__}", f"msgspec {msgspec.__version__}"]
    try:
        import numpy

        versions.append(f"numpy {numpy.__version__}")
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    return (
        f"eurekamem {VERSION} starting ({', '.join(versions)}; {_sys.prefix}): data root {config.data_dir}, "
        f"socket {config.socket_path}, embedding model {config.embedder}, fsync {config.fsync}"
    )


def duration(seconds: float) -> str:
    """A span of time in words for a log line: "4.2 s", "3 min 5 s", "2 h 10 min"."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


EMBED_LOG_EVERY = 10.0  # seconds between progress lines of the background embedding
EMBED_BATCH_SECONDS = 1.0  # the background embedding's batches take about this long ...
EMBED_BATCH_MIN, EMBED_BATCH_MAX = 4, 64  # ... within these sizes


class EmbeddingProgress:
    """Tier 4's background embedding as counts, rate and time left; one owner: the memory actor's
    background loop writes it, sys.stats reads it, both on the event loop."""

    def __init__(self) -> None:
        self.running = False
        self.started = 0.0
        self.done = 0
        self.pending = 0
        self.total_done = 0  # since the daemon started, over every run
        self._last_log = 0.0
        self._last_add = 0.0

    def batch(self) -> int:
        """Memories to embed in the next batch: about EMBED_BATCH_SECONDS of work at the rate so far
        (a few at first), so progress shows soon and a stop never waits for a long batch."""
        if not self.done:
            return EMBED_BATCH_MIN
        per_memory = (self._last_add - self.started) / self.done
        return max(EMBED_BATCH_MIN, min(EMBED_BATCH_MAX, int(EMBED_BATCH_SECONDS / max(per_memory, 1e-6))))

    def begin(self, now: float, pending: int) -> None:
        self.running, self.started, self.done, self.pending, self._last_log = True, now, 0, pending, now

    def add(self, now: float, done: int, pending: int) -> None:
        self.done += done
        self.total_done += done
        self.pending = pending
        self._last_add = now

    def rate(self, now: float) -> float | None:
        elapsed = now - self.started
        return self.done / elapsed if self.done and elapsed > 0 else None

    def eta(self, now: float) -> float | None:
        rate = self.rate(now)
        return self.pending / rate if rate else None

    def due(self, now: float) -> bool:
        if now - self._last_log >= EMBED_LOG_EVERY:
            self._last_log = now
            return True
        return False

    def describe(self, now: float, model: str) -> str:
        total = self.done + self.pending
        text = f"embedded {self.done:,} of {total:,} memories with {model} ({100 * self.done / max(total, 1):.0f} %)"
        rate, eta = self.rate(now), self.eta(now)
        if rate:
            text += f", {rate:.1f}/s"
        if eta is not None:
            text += f", about {duration(eta)} left"
        return text

    def finish(self, now: float, model: str) -> str:
        self.running = False
        self.pending = 0
        return f"background embedding done: {self.done:,} memories with {model} in {duration(now - self.started)}"

    def summary(self, now: float) -> dict[str, Any]:
        """sys.stats → memory.embedding: this run's `done` and `pending`, `per_second`, `eta_seconds`
        (null when not known), `running`, and `embedded_since_start` over every run."""
        rate, eta = (self.rate(now), self.eta(now)) if self.running else (None, None)
        return {
            "running": self.running,
            "done": self.done if self.running else 0,
            "pending": self.pending if self.running else 0,
            "per_second": round(rate, 2) if rate else None,
            "eta_seconds": round(eta, 1) if eta is not None else None,
            "embedded_since_start": self.total_done,
        }

"""Request counters and latency histograms per method, read by sys.stats."""

from __future__ import annotations

import logging
from typing import Any

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



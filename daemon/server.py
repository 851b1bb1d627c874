"""What every connection of the daemon shares: its limits, the read size and the ordered tiers.

The connection's rules (framing, frame limit, in-flight count and `overloaded`, back-pressure,
batches, rate limit, half-close, per-connection order, the outbound buffer) live in
protocol/_connection.py; the one socket adapter that moves bytes for them is daemon/io_layer.py.
Rule kept here: these values are written once, here, and both the adapter and Config read them
from this module (Config's defaults for the limits are Limits' own).
"""

from __future__ import annotations

from ..protocol import ConnectionLimits

# Bytes asked of one recv. Under glibc's mmap threshold (128 KiB) on purpose: recv(n) allocates an
# n-byte bytes object first, and from 128 KiB on each one is a fresh mmap (page faults, munmap):
# 256 KiB cost ~8.7 us a recv here against ~0.9 us at 64 KiB, whatever the bytes that came.
READ_SIZE = 64 * 1024

Limits = ConnectionLimits  # the daemon's name for them (Config → Limits → sys.hello)

# Tiers whose actor runs one connection's requests in the order they are dispatched, each seeing
# those before it: TierActor.run takes its one FIFO channel batch by batch, and its fast path runs a
# call only while the actor owes nothing (daemon/tier.py). So the connection need not hold their reads
# behind their writes (mixed pipelines stay batched). Tier 4's MemoryActor runs reads beside its
# writes' embedding: for it the connection holds (protocol/_connection.py). tests/test_ordering.py
# checks this set against the actors.
IN_ORDER_TIERS = frozenset({"episodic", "persistent", "graph", "skills"})

__all__ = ["IN_ORDER_TIERS", "Limits", "READ_SIZE"]

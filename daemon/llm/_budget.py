"""A per-minute budget of requests and tokens: two token buckets on trio's clock.

Rule kept here: a caller over budget waits for it, it is never refused. Each bucket holds at most
one minute's worth and refills continuously (a full minute's worth per 60 s of `clock()`, which is
trio.current_time by default, so a MockClock drives it in tests). A request takes one request and
a reservation of tokens (its estimated input plus its maximum output) before it is sent;
`settle()` then puts back what the provider says it did not use, or takes what it used beyond the
reservation, which may leave the token bucket below zero: the next callers wait for the debt. A
reservation larger than the whole bucket waits for a full bucket and then goes into debt, so a
large request is slow, never stuck. Waiters are served in arrival order (one lock).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

__all__ = ["Budget"]

_EPSILON = 1e-6  # float slack: a level this close to what is needed counts as enough


class Budget:
    """Requests and tokens per minute. `acquire(tokens)` waits until both allow a request."""

    def __init__(
        self,
        requests_per_minute: int,
        tokens_per_minute: int,
        *,
        clock: Callable[[], float] = trio.current_time,
        sleep: Callable[[float], Awaitable[Any]] = trio.sleep,
    ) -> None:
        if requests_per_minute <= 0 or tokens_per_minute <= 0:
            raise ValueError("requests_per_minute and tokens_per_minute must be positive")
        self.requests_per_minute = requests_per_minute
        self.tokens_per_minute = tokens_per_minute
        self._clock = clock
        self._sleep = sleep
        self._requests = float(requests_per_minute)
        self._tokens = float(tokens_per_minute)
        self._updated: float | None = None  # the clock at the last refill (None: not yet read)
        self._lock = trio.Lock()
        self.waits = 0  # requests that had to wait
        self.waited_seconds = 0.0

    def _refill(self) -> None:
        try:
            now = self._clock()
        except RuntimeError:  # statistics() read outside a trio run: report the last levels
            return
        if self._updated is not None:
            elapsed = max(0.0, now - self._updated)
            self._requests = min(self.requests_per_minute, self._requests + elapsed * self.requests_per_minute / 60)
            self._tokens = min(self.tokens_per_minute, self._tokens + elapsed * self.tokens_per_minute / 60)
        self._updated = now

    def _wait_needed(self, tokens: float) -> float:
        """Seconds until one request and `tokens` tokens are both in the buckets (0: now)."""
        request_deficit = 1 - self._requests
        token_deficit = tokens - self._tokens
        waits = [0.0]
        if request_deficit > _EPSILON:
            waits.append(request_deficit * 60 / self.requests_per_minute)
        if token_deficit > _EPSILON:
            waits.append(token_deficit * 60 / self.tokens_per_minute)
        return max(waits)

    async def acquire(self, tokens: int) -> None:
        """Take one request and reserve `tokens` tokens, waiting as long as the budget needs."""
        needed = float(min(max(tokens, 0), self.tokens_per_minute))
        async with self._lock:
            waited = False
            while True:
                self._refill()
                wait = self._wait_needed(needed)
                if wait <= 0:
                    break
                if not waited:
                    self.waits += 1
                    waited = True
                self.waited_seconds += wait
                await self._sleep(wait)
            self._requests -= 1
            self._tokens -= max(tokens, 0)

    def settle(self, reserved: int, used: int) -> None:
        """A request reserved `reserved` tokens and used `used`: give back or take the difference."""
        self._refill()
        self._tokens = min(float(self.tokens_per_minute), self._tokens + reserved - used)

    def state(self) -> dict[str, Any]:
        self._refill()
        return {
            "requests_per_minute": self.requests_per_minute,
            "requests_available": round(self._requests, 3),
            "tokens_per_minute": self.tokens_per_minute,
            "tokens_available": round(self._tokens, 1),
            "waits": self.waits,
            "waited_seconds": round(self.waited_seconds, 3),
        }

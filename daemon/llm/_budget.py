"""A per-minute budget of requests and tokens: two token buckets on trio's clock.

Rule kept here: a caller over budget waits for it, it is never refused. Each bucket holds at most
one minute's worth and refills continuously (a full minute's worth per 60 s of `clock()`, which is
trio.current_time by default, so a MockClock drives it in tests). A request takes one request and
a reservation of tokens (its estimated input plus its maximum output) before it is sent;
`settle()` then puts back what the provider says it did not use, or takes what it used beyond the
reservation, which may leave the token bucket below zero: the next callers wait for the debt. A
reservation larger than the whole bucket waits for a full bucket and then goes into debt, so a
large request is slow, never stuck. The debt is bounded: the bucket never falls below minus one
minute's worth, so what one answer cost holds the callers after it at most one window (60 s) beyond
their own wait. Waiters are served in arrival order (one lock), and a waiter is told why it waits
and until when (`acquire(..., note=)`: the job queue's `waiting_reason`).
"""

from __future__ import annotations

import time
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

    async def acquire(self, tokens: int, note: Callable[[str | None], Any] | None = None) -> None:
        """Take one request and reserve `tokens` tokens, waiting as long as the budget needs.
        `note(reason)` is called when the caller starts to wait (behind another waiter, or for the
        buckets to refill: the reason says which and until when), `note(None)` when it stops."""
        needed = float(min(max(tokens, 0), self.tokens_per_minute))
        told = False
        try:
            if self._lock.locked() and note is not None:
                note("waiting for the LLM budget behind another request that waits for it")
                told = True
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
                    if note is not None:
                        note(self._why(needed, wait))
                        told = True
                    self.waited_seconds += wait
                    await self._sleep(wait)
                self._requests -= 1
                self._tokens = max(self._tokens - max(tokens, 0), -float(self.tokens_per_minute))
        finally:
            if told and note is not None:
                note(None)

    def _why(self, needed: float, wait: float) -> str:
        until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + wait))
        if (
            needed - self._tokens > _EPSILON
            and (needed - self._tokens) * 60 / self.tokens_per_minute >= wait - _EPSILON
        ):
            what = (
                f"the LLM token budget ({needed:,.0f} tokens needed, {self._tokens:,.0f} of "
                f"{self.tokens_per_minute:,} a minute in the bucket)"
            )
        else:
            what = f"the LLM request budget ({self.requests_per_minute} requests a minute)"
        return f"waiting for {what} until {until} ({wait:.1f} s)"

    def settle(self, reserved: int, used: int) -> None:
        """A request reserved `reserved` tokens and used `used`: give back or take the difference
        (never below one minute's worth of debt: the module's rule)."""
        self._refill()
        level = min(float(self.tokens_per_minute), self._tokens + reserved - used)
        self._tokens = max(level, -float(self.tokens_per_minute))

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

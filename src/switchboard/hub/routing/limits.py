"""Per-client limits that keep one client from hurting the others."""

from __future__ import annotations

from switchboard.clock import Clock


class TokenBucket:
    """``rate`` messages per second on average, ``burst`` at once, on the injected clock.

    Refilling is computed from elapsed time on each take: no timer per client.
    """

    __slots__ = ("_clock", "_last", "_tokens", "burst", "rate")

    def __init__(self, *, rate: float, burst: float, clock: Clock) -> None:
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = burst
        self._last = clock.monotonic()

    def take(self) -> bool:
        now = self._clock.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False

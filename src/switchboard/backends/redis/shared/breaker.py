"""Backoff and a circuit breaker, both driven by an injected :class:`Clock`.

The breaker stops a replica from hammering Redis with SUBSCRIBEs that keep
failing. Its danger is staleness: a breaker opened against a dead connection
must not refuse a fresh, healthy one, so the bus calls :meth:`reset` on every
new connection *before* re-wiring.
"""

from __future__ import annotations

from switchboard.clock import Clock


def backoff_delay(attempt: int, initial: float, cap: float) -> float:
    """Capped exponential backoff: ``initial * 2**attempt``, never above ``cap``."""
    if attempt < 0:
        raise ValueError(f"attempt must be >= 0, got {attempt}")
    return min(cap, initial * (2.0 ** min(attempt, 62)))


class CircuitBreaker:
    """Closed → (``threshold`` consecutive failures) → open for ``cooldown`` s → half-open.

    Half-open lets attempts through; one success closes it, one failure
    re-opens it for another cooldown.
    """

    def __init__(self, clock: Clock, *, threshold: int = 5, cooldown: float = 10.0) -> None:
        if threshold < 1:
            raise ValueError(f"threshold must be >= 1, got {threshold}")
        self._clock = clock
        self.threshold = threshold
        self.cooldown = cooldown
        self.failures = 0
        self._opened_at: float | None = None
        self.trips = 0

    @property
    def state(self) -> str:
        if self._opened_at is None:
            return "closed"
        if self._clock.monotonic() - self._opened_at >= self.cooldown:
            return "half-open"
        return "open"

    def allow(self) -> bool:
        """May an attempt be made now?"""
        return self.state != "open"

    def record_success(self) -> None:
        self.failures = 0
        self._opened_at = None

    def record_failure(self) -> None:
        half_open = self.state == "half-open"
        self.failures += 1
        if half_open or self.failures >= self.threshold:
            self.trip()

    def trip(self) -> None:
        """Open now (also what tests use to plant a stale open breaker)."""
        self._opened_at = self._clock.monotonic()
        self.trips += 1

    def reset(self) -> None:
        """Forget all history: closed, zero failures."""
        self.failures = 0
        self._opened_at = None

    def __repr__(self) -> str:
        return f"CircuitBreaker({self.state}, failures={self.failures}/{self.threshold})"

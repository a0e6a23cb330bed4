"""Per-client limits that keep one client from hurting the others.

A connection has its own :class:`TokenBucket` of frames (set at admission)
and a bound on its calls waiting for a reply. A caller without a
connection, an HTTP request, gets the same bounds from :class:`Allowances`,
per principal: its user, or for an anonymous request its address. A
``select:`` lookup's fan-out counts as calls of its asker (its
:class:`Allowance`: a connection's takes from the connection's own bucket),
one per candidate asked, whatever door it came through.
"""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Iterator

from switchboard.clock import Clock
from switchboard.errors import RateLimited

# Principals tracked at once by one Allowances (about 400 bytes each: 8 MiB at most). An idle
# principal whose bucket is full again is forgotten first (nothing is lost: it would start full);
# beyond this many busy ones a new principal is refused, so a crowd of addresses cannot grow the
# table without bound. A replica's busy HTTP callers within a couple of seconds are far fewer.
MAX_PRINCIPALS = 20_000
# An IPv6 host usually holds a whole /64: its addresses are one caller.
IPV6_PREFIX = 64


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

    def _refill(self) -> None:
        now = self._clock.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now

    def take(self, count: int = 1) -> bool:
        """Take ``count`` tokens if there are that many (else take none); refilled inline: once per frame."""
        now = self._clock.monotonic()
        tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        if tokens >= count:
            self._tokens = tokens - count
            return True
        self._tokens = tokens
        return False

    def wait(self, count: int = 1) -> float:
        """Seconds until ``count`` tokens are there (0: now; never, above the burst: ``inf``)."""
        if count > self.burst:
            return float("inf")
        self._refill()
        return max(0.0, (count - self._tokens) / self.rate)

    def full(self) -> bool:
        self._refill()
        return self._tokens >= self.burst


class Allowance:
    """One caller's bounds: calls per second (its ``bucket``) and calls in flight (``limit``);
    ``name`` says who it is in a refusal."""

    __slots__ = ("bucket", "in_flight", "limit", "name")

    def __init__(self, bucket: TokenBucket, limit: int, name: str) -> None:
        self.bucket = bucket
        self.limit = limit
        self.name = name
        self.in_flight = 0

    def admit(self, calls: int) -> None:
        """Count ``calls`` more calls in flight, or raise :class:`RateLimited` (nothing counted)."""
        if self.in_flight + calls > self.limit:
            raise RateLimited(
                f"Too many calls in flight: {self.name} has {self.in_flight}, this request needs {calls} more, "
                f"at most {self.limit} (--max-pending-calls)",
                retry_after=1.0,
            )
        if not self.bucket.take(calls):
            b = self.bucket
            raise RateLimited(
                f"Rate limit exceeded: {self.name} may make at most {b.rate:g} calls/s (burst {b.burst:g}; "
                f"--max-messages-per-second, --message-burst), this request needs {calls}",
                retry_after=b.wait(calls),
            )
        self.in_flight += calls

    def done(self, calls: int) -> None:
        self.in_flight = max(0, self.in_flight - calls)

    @contextlib.contextmanager
    def holding(self, calls: int) -> Iterator[None]:
        """``calls`` admitted for the ``with`` block, counted in flight until it ends."""
        self.admit(calls)
        try:
            yield
        finally:
            self.done(calls)


class Allowances:
    """:class:`Allowance` per caller key, made on first use, forgotten once idle and full again."""

    def __init__(
        self, *, rate: float, burst: float, limit: int, clock: Clock, max_principals: int = MAX_PRINCIPALS
    ) -> None:
        self.rate, self.burst, self.limit = rate, burst, limit
        self.max_principals = max_principals
        self._clock = clock
        self._by_key: dict[str, Allowance] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def of(self, key: str, name: str) -> Allowance:
        """``key``'s allowance (a new one, named ``name``, starts with a full bucket)."""
        found = self._by_key.get(key)
        if found is not None:
            return found
        if len(self._by_key) >= self.max_principals:
            self._forget_idle()
            if len(self._by_key) >= self.max_principals:
                raise RateLimited(f"Too many callers at once: at most {self.max_principals} tracked", retry_after=1.0)
        made = Allowance(TokenBucket(rate=self.rate, burst=self.burst, clock=self._clock), self.limit, name)
        self._by_key[key] = made
        return made

    def _forget_idle(self) -> None:
        """Drop the callers with nothing in flight and a full bucket: they would start the same."""
        for key in [k for k, a in self._by_key.items() if a.in_flight == 0 and a.bucket.full()]:
            del self._by_key[key]


def address_key(host: str) -> str:
    """The caller an anonymous request's address stands for: the address itself, or for IPv6
    its /64 network (one host can pick any address in it)."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is None:
        return str(ipaddress.ip_network(f"{ip}/{IPV6_PREFIX}", strict=False))
    return str(ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else ip)

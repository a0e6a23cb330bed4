"""Clients in transit: a connection ended, and the client is expected back within a grace.

A client that a draining replica hands to a sibling (close 1012), or whose
connection dropped, has not left: it reconnects with its reconnection token,
usually within a fraction of a second. Until it is back, or its grace is
over, it is *in transit*: frames for it are held here instead of failing, and
its departure (``service_removed``, ``client_disconnected``) is not
announced. If it comes back, the held frames are handed out once, to be
delivered; if its grace runs out, the departure is due and the held frames
are handed out once, to fail ("not connected").

This is the decision logic only, without I/O: time comes from the injected
clock, and the hub (:mod:`switchboard.hub.transit.moves`) does the sending, the
registry writes and the announcements. Every replica keeps one, filled from
its own clients and from the other replicas' notices, so each holds the
frames its own senders address to a moving client.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from switchboard.clock import Clock

T = TypeVar("T")


class Waiting(Protocol):
    """Frames waiting for targets nobody received yet, as the router reads them (the hub's retry
    window, hub/transit/retry.py, above the router): whether some wait for ``target`` (later ones
    queue behind them, in order), and how long they may wait (0: none is kept)."""

    @property
    def window(self) -> float: ...

    def pending(self, target: str) -> bool: ...


@dataclass(slots=True)
class _Mover(Generic[T]):
    since: float
    deadline: float
    held: deque[tuple[float, T]] = field(default_factory=deque)  # (held at, frame)
    held_bytes: int = 0


@dataclass(frozen=True, slots=True)
class TransitEnd(Generic[T]):
    """What a client's transit ended with: its frames, in order, and how long it was away."""

    client: str
    frames: list[T]
    away: float  # seconds in transit
    longest_wait: float  # seconds the oldest frame was held


class Transit(Generic[T]):
    """The clients in transit this replica knows of, with the frames held for each.

    ``grace`` seconds is how long a client that left may take to come back;
    at most ``max_frames`` frames and ``max_bytes`` bytes (as the caller of
    :meth:`hold` counts them) are held per client: one more is refused, and
    its caller fails at once, as the retry window does.
    """

    def __init__(
        self, *, clock: Clock, grace: float, max_frames: int = 1000, max_bytes: int = 64 * 1024 * 1024
    ) -> None:
        self._clock = clock
        self.grace = grace
        self._max = max_frames
        self._max_bytes = max_bytes
        self._movers: dict[str, _Mover[T]] = {}
        self.held_total = 0  # frames ever held
        self.refused_total = 0  # frames refused because a client's holding was full
        self.expired_total = 0  # transits that ended with the grace running out
        self.longest_wait = 0.0  # the longest any frame was held, in seconds

    def __len__(self) -> int:
        return len(self._movers)

    def __contains__(self, client: object) -> bool:
        return client in self._movers

    @property
    def holding(self) -> int:
        """Frames held right now, for every client together."""
        return sum(len(m.held) for m in self._movers.values())

    def left(self, client: str, remaining: float | None = None) -> bool:
        """``client`` is in transit for ``remaining`` seconds (default: the grace) from now.

        ``False`` if it already was: its deadline and frames are kept, so a
        second notice of the same departure never extends the grace.
        """
        if client in self._movers:
            return False
        now = self._clock.monotonic()
        self._movers[client] = _Mover(since=now, deadline=now + (self.grace if remaining is None else remaining))
        return True

    def extend(self, client: str, remaining: float) -> None:
        """The authority (the registry) says ``client``'s grace ends ``remaining`` s from now, not yet."""
        mover = self._movers.get(client)
        if mover is not None:
            mover.deadline = max(mover.deadline, self._clock.monotonic() + remaining)

    def hold(self, client: str, frame: T, *, size: int = 0, first: bool = False) -> bool:
        """Keep ``frame`` (``size`` bytes) for ``client`` until its transit ends; ``False``: not in
        transit, or full.

        ``first`` puts it before the frames held so far (one that was already
        on its way when they came).
        """
        mover = self._movers.get(client)
        if mover is None:
            return False
        if len(mover.held) >= self._max or mover.held_bytes + size > self._max_bytes:
            self.refused_total += 1
            return False
        mover.held_bytes += size
        entry = (self._clock.monotonic(), frame)
        if first:
            mover.held.appendleft(entry)
        else:
            mover.held.append(entry)
        self.held_total += 1
        return True

    def back(self, client: str) -> TransitEnd[T] | None:
        """``client`` is connected again: its held frames, to deliver now; ``None`` if it was not in transit."""
        return self._release(client)

    def due(self) -> list[str]:
        """Clients whose grace is over (their departure may be announced now), earliest first."""
        now = self._clock.monotonic()
        return [c for c, m in sorted(self._movers.items(), key=lambda i: i[1].deadline) if m.deadline <= now]

    def expire(self, client: str) -> TransitEnd[T] | None:
        """``client`` did not come back in time: its held frames, to fail now."""
        released = self._release(client)
        if released is not None:
            self.expired_total += 1
        return released

    def cancel(self, client: str) -> TransitEnd[T] | None:
        """``client`` was never in transit after all (e.g. it is connected elsewhere): its frames, to route again."""
        return self._release(client)

    def holders(self) -> list[str]:
        """Clients in transit with frames held for them."""
        return [c for c, m in self._movers.items() if m.held]

    def since(self, client: str) -> float:
        """When ``client`` left (the hub's clock); it must be in transit."""
        return self._movers[client].since

    def deadline(self, client: str) -> float | None:
        """When ``client``'s grace ends (the hub's clock), ``None`` if it is not in transit."""
        mover = self._movers.get(client)
        return None if mover is None else mover.deadline

    def next_deadline(self) -> float | None:
        """When the next grace ends (the hub's clock), or ``None`` with nobody in transit."""
        return min((m.deadline for m in self._movers.values()), default=None)

    def _release(self, client: str) -> TransitEnd[T] | None:
        mover = self._movers.pop(client, None)
        if mover is None:
            return None
        now = self._clock.monotonic()
        oldest = now - min(at for at, _ in mover.held) if mover.held else 0.0
        self.longest_wait = max(self.longest_wait, oldest)
        return TransitEnd(client, [frame for _, frame in mover.held], now - mover.since, oldest)

    def __repr__(self) -> str:
        return f"Transit(clients={len(self._movers)}, holding={self.holding}, grace={self.grace:g}s)"

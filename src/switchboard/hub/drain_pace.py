"""How fast a draining replica sends its clients away: in waves the sibling can admit.

A drain that closes thousands of connections at once sends thousands of
reconnections to the sibling in the same instant: its accept queue overflows
(the kernel drops connection attempts, and the clients' TCP retries back off
1, 2, 4, 8 s...), and every handshake waits behind all the others, so clients
that were handed over first are back last and the transit grace runs out for
many of them. So the drain keeps at most ``window`` clients *in flight*: sent
away and not yet seen back (a ``back`` notice), each counted for at most
``patience`` seconds (one that never comes back must not stall the rest).
That paces the hand-over to what the sibling admits, and each client's grace
runs from its own hand-over.

The drain must still end in time: whatever comes back, everyone is sent away
by the drain's deadline, at least in proportion to the time gone (the
schedule), so the stop's own budget holds.

Decisions only, on the injected clock; :mod:`switchboard.hub.drain` carries them out.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DrainPace:
    """``window`` clients in flight at most (0: no limit, all at once), each counted for at
    most ``patience`` seconds; everyone sent away between ``started`` and ``deadline``."""

    window: int
    patience: float
    started: float
    deadline: float
    total: int

    def allowance(self, *, now: float, sent: int, in_flight: int) -> int:
        """How many more clients to send away now."""
        left = max(0, self.total - sent)
        if self.window <= 0:
            return left
        room = max(0, self.window - in_flight)
        return min(left, max(room, self.scheduled(now) - sent))

    def scheduled(self, now: float) -> int:
        """How many must have been sent away by ``now`` for everyone to be by the deadline."""
        span = self.deadline - self.started
        if span <= 0 or now >= self.deadline:
            return self.total
        return math.ceil(self.total * max(0.0, now - self.started) / span)

    def next_due(self, sent: int) -> float:
        """When the schedule allows one more than ``sent``, whatever comes back (for a wake-up)."""
        if self.total <= 0 or sent >= self.total:
            return self.deadline
        return self.started + (self.deadline - self.started) * sent / self.total


class InFlight:
    """The clients sent away and not seen back yet, each for at most ``patience`` seconds."""

    def __init__(self, patience: float) -> None:
        self.patience = patience
        self.sent = 0
        self._order: deque[tuple[float, str]] = deque()  # (sent at, client), oldest first
        self._flying: set[str] = set()

    def add(self, client: str, now: float) -> None:
        self.sent += 1
        self._flying.add(client)
        self._order.append((now, client))

    def back(self, client: str) -> None:
        self._flying.discard(client)

    def count(self, now: float) -> int:
        """In flight at ``now``: those sent less than ``patience`` ago and not back."""
        while self._order and (self._order[0][1] not in self._flying or now - self._order[0][0] >= self.patience):
            self._flying.discard(self._order.popleft()[1])
        return len(self._flying)

    def flying(self) -> list[str]:
        """Those counted now (as of the last :meth:`count`), to ask whether they are back."""
        return list(self._flying)

    def oldest(self) -> float | None:
        """When the oldest counted one was sent (it stops counting ``patience`` later)."""
        return self._order[0][0] if self._order else None

"""How fast a draining replica sends its clients away: at the pace the sibling admits them.

A drain that closes thousands of connections at once sends thousands of
reconnections to the sibling in the same instant: its accept queue overflows
(the kernel drops connection attempts, and the clients' TCP retries back off
1, 2, 4, 8 s...), and every handshake waits behind all the others, so clients
that were handed over first are back last and the transit grace runs out for
many of them. So the drain keeps a *window* of clients in flight: sent away
and not yet seen back (a ``back`` notice), each counted for at most
``patience`` seconds (one that never comes back must not stall the rest).
Each client's grace runs from its own hand-over, and it waits at the sibling
behind at most the window, so its time in transit is about the window over
the sibling's admission rate.

The window follows that rate: once the first clients are back, it is what the
sibling admitted in the last :data:`RATE_SPAN` seconds, scaled to
:data:`TARGET_SHARE` of the patience (the grace), between :data:`FLOOR` and
the configured ``window``. A sibling slowed down (a loaded machine, a storm
of its own) then gets fewer clients at a time, so none waits there past its
grace; a fast one gets the whole window.

Nothing forces the pace past what the sibling admits: a schedule that sends
everyone by the drain's deadline whatever comes back queued thousands on a
sibling admitting fewer, and each of them past its grace was announced gone
to every client of its workspace, which starved both replicas (issue 26:
5,000 + 1,000 clients, 10 s). The deadline still ends the drain (the
orchestrator's grace period is the stop's budget): who is still here then is
sent away at once (:meth:`DrainPace.allowance`), and :meth:`DrainPace.short_by`
says early, from the rate, that the drain timeout will not do.

Decisions only, on the injected clock; :mod:`switchboard.hub.transit.drain` carries them out.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

# Seconds of arrivals the sibling's admission rate is measured over.
RATE_SPAN = 1.0
# Share of the patience (the transit grace) a client may spend waiting at the sibling behind the
# window: the rest is headroom for the reconnection itself and a slower second.
TARGET_SHARE = 0.4
# Clients in flight at least, whatever the measured rate: the drain never stalls on a slow second.
FLOOR = 10


@dataclass(frozen=True, slots=True)
class DrainPace:
    """At most ``window`` clients in flight (0: no limit, all at once), fewer when the sibling admits
    fewer (:meth:`limit`), each counted for at most ``patience`` seconds; everyone left goes at
    ``deadline``."""

    window: int
    patience: float
    started: float
    deadline: float
    total: int

    def allowance(self, *, now: float, sent: int, in_flight: int, rate: float | None = None) -> int:
        """How many more clients to send away now; ``rate`` is the sibling's measured admissions
        per second (``None``: not measured yet)."""
        left = max(0, self.total - sent)
        if self.window <= 0 or now >= self.deadline:
            return left
        return min(left, max(0, self.limit(rate) - in_flight))

    def limit(self, rate: float | None) -> int:
        """Clients in flight at most, given the sibling's admission ``rate``."""
        if rate is None or self.window <= 0:
            return self.window
        return min(self.window, max(FLOOR, math.ceil(rate * self.patience * TARGET_SHARE)))

    def short_by(self, *, now: float, sent: int, rate: float | None) -> float:
        """Seconds the drain timeout lacks to send the rest at ``rate`` (0: it will do)."""
        if rate is None or rate <= 0 or self.window <= 0:
            return 0.0
        return max(0.0, now + (self.total - sent) / rate - self.deadline)


class SentAway:
    """The clients sent away and not seen back yet, each for at most ``patience`` seconds, and the
    rate at which they come back."""

    def __init__(self, patience: float) -> None:
        self.patience = patience
        self.sent = 0
        self._order: deque[tuple[float, str]] = deque()  # (sent at, client), oldest first
        self._flying: set[str] = set()
        self._backs: deque[float] = deque()  # when each of the last RATE_SPAN seconds' came back
        self._first: float | None = None  # when the first was sent

    def add(self, client: str, now: float) -> None:
        self.sent += 1
        self._flying.add(client)
        self._order.append((now, client))
        if self._first is None:
            self._first = now

    def skip(self) -> None:
        """One sent away left instead of moving: it takes no place in the window."""
        self.sent += 1

    def back(self, client: str, now: float) -> None:
        if client in self._flying:
            self._flying.discard(client)
            self._backs.append(now)

    def count(self, now: float) -> int:
        """In flight at ``now``: those sent less than ``patience`` ago and not back."""
        while self._order and (self._order[0][1] not in self._flying or now - self._order[0][0] >= self.patience):
            self._flying.discard(self._order.popleft()[1])
        return len(self._flying)

    def rate(self, now: float) -> float | None:
        """Clients back per second over the last :data:`RATE_SPAN` seconds; ``None`` until the
        first ones sent have had that long (too early to tell a slow sibling from a start)."""
        while self._backs and now - self._backs[0] > RATE_SPAN:
            self._backs.popleft()
        if self._first is None or now - self._first < RATE_SPAN:
            return None
        return len(self._backs) / RATE_SPAN

    def flying(self) -> list[str]:
        """Those counted now (as of the last :meth:`count`), to ask whether they are back."""
        return list(self._flying)

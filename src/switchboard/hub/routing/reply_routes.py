"""Which replica made a manager call, so its reply can find the way back."""

from __future__ import annotations

from collections import OrderedDict

from switchboard.clock import Clock


class ReplyRoutes:
    """``session → origin replica``, bounded in size and age.

    Entries only need to outlive the call they belong to; the bound keeps a
    flood of calls from growing memory, and the oldest entry goes first.
    """

    def __init__(self, clock: Clock, *, ttl: float = 600.0, max_entries: int = 100_000) -> None:
        self._clock = clock
        self._ttl = ttl
        self._max = max_entries
        self._routes: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def remember(self, session: str, origin: str) -> None:
        self._routes[session] = (origin, self._clock.monotonic() + self._ttl)
        self._routes.move_to_end(session)
        while len(self._routes) > self._max:
            self._routes.popitem(last=False)

    def origin_of(self, session: str) -> str | None:
        entry = self._routes.get(session)
        if entry is None:
            return None
        origin, expires = entry
        if expires < self._clock.monotonic():
            del self._routes[session]
            return None
        return origin

    def __len__(self) -> int:
        return len(self._routes)

"""How busy each provider is: the calls in flight to it, for the ``min_load`` service selection.

A provider's own replica sees every call to it (:class:`~switchboard.hub.routing.inflight.InFlight`
counts them as they open and close), so for this replica's clients the
count is exact and current. Each replica also publishes its clients' counts
(the :data:`PUBLISHED_LOADS` busiest, idle ones left out) in its presence
record every couple of seconds (:mod:`switchboard.replicas.upkeep.cluster`); the
others' counts are read from there, at most once per :data:`REFRESH`
seconds and only when a lookup needs a provider of another replica. So a
remote count is at most a few seconds old, and a lookup costs at most one
Redis round trip.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping

from switchboard.clock import Clock
from switchboard.errors import BackendError
from switchboard.hub.routing.inflight import InFlight

# Clients whose counts a replica publishes: the busiest, so the record stays small
# (about 40 bytes each) however many clients the replica holds; a client left out
# has fewer calls open than every one published.
PUBLISHED_LOADS = 500
# Seconds the other replicas' counts are reused: they change in their presence
# records every 2 s, so reading them more often would find the same values.
REFRESH = 1.0


class Loads:
    """Calls in flight to providers, here and (with ``remote``) on the other replicas."""

    def __init__(self, inflight: InFlight, *, clock: Clock, is_local: Callable[[str], bool]) -> None:
        self._inflight = inflight
        self._clock = clock
        self._is_local = is_local
        # set by the replica layer on a hub with peers: every other replica's published counts
        self.remote: Callable[[], Awaitable[Mapping[str, int]]] | None = None
        self._remote: Mapping[str, int] = {}
        self._read_at: float | None = None

    def published(self) -> dict[str, int]:
        """What this replica tells the others: its busiest clients' counts."""
        return self._inflight.loads(PUBLISHED_LOADS)

    async def of(self, providers: Collection[str]) -> dict[str, int]:
        """Calls in flight to each of ``providers`` (``ws/cid``): exact here, recent for the others."""
        local = {p: self._inflight.load(p) for p in providers if self._is_local(p)}
        if len(local) < len(providers) and self.remote is not None:
            now = self._clock.monotonic()
            if self._read_at is None or now - self._read_at >= REFRESH:
                try:
                    self._remote = await self.remote()
                except BackendError:
                    self._remote = {}  # the store is away: the others count as idle
                self._read_at = now
        return {p: local[p] if p in local else int(self._remote.get(p, 0)) for p in providers}

    def __repr__(self) -> str:
        return f"<Loads remote={'yes' if self.remote else 'no'} known={len(self._remote)}>"

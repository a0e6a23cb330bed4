"""Undoing deletes a failover lost: the decision of :mod:`.stale`, carried out round after round.

After the registry's shard changed master (or Redis lost its data), the
cluster's upkeep calls :meth:`LostDeletes.begin`; from then on each round
:meth:`LostDeletes.look` compares what the registry holds for this replica's
clients with what it holds itself and removes what was stale twice in a row,
until a look finds nothing suspect (at most :data:`MAX_LOOKS` looks).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Container, Iterable, Mapping
from typing import Any, Protocol

from switchboard.backends.owned import Recorded, Stale
from switchboard.protocol.hypha.services import ServiceInfo
from switchboard.replicas.upkeep.stale import Held, field_of, stale_entries

# Looks after a failover: the first suspects, the second removes; a few more if entries were still
# changing (a client moving in between), then it gives up until the next failover.
MAX_LOOKS = 5


class StaleStore(Protocol):
    """The registry's side (``backends/redis/stores/stale.py``, ``RedisStale``)."""

    async def owned(self, wanted: Callable[[str, str], bool] = ...) -> list[Recorded]: ...

    async def remove(self, stale: Iterable[Stale]) -> list[tuple[Stale, bool, list[ServiceInfo]]]: ...


class _Hub(Protocol):
    @property
    def peers(self) -> Collection[str]:
        """The clients live here."""
        ...

    def services_of(self, client: str) -> Collection[ServiceInfo]: ...

    @property
    def transit(self) -> Container[str]: ...

    async def reclaim(self) -> None: ...

    async def announce_gone(self, workspace: str, client_id: str, removed: list[ServiceInfo]) -> int: ...


class LostDeletes:
    """Looks for and removes what the registry holds of this replica's clients and they do not.

    A client removed is announced gone (``service_removed``, ``client_disconnected``) once more:
    usually its departure was announced before the failover and listeners hear it twice, but a
    departure whose own clean-up was still waiting on Redis (or failed, to be retried) would
    otherwise never be announced, since that clean-up then finds nothing.

    ``reassert`` writes registrations back: a service removed while its
    client registered it again (between the read and the removal) is
    written back at once, as is a client removed while it reconnected here.
    """

    def __init__(
        self,
        store: StaleStore,
        hub: _Hub,
        *,
        reassert: Callable[[list[ServiceInfo]], Awaitable[int]],
        log: logging.LoggerAdapter[Any] | logging.Logger,
    ) -> None:
        self._store = store
        self._hub = hub
        self._reassert = reassert
        self._log = log
        self._suspects: list[Stale] = []
        self._looks_left = 0
        self._gone: set[str] = set()  # clients removed in the last look: checked once more
        self.removed_services = 0
        self.removed_clients = 0

    def begin(self) -> None:
        """The store may have lost deletes: look again from the next :meth:`look`."""
        self._suspects = []
        self._looks_left = MAX_LOOKS

    def held(self) -> Held:
        """What this replica holds now: its clients' services, and the clients away from it."""
        peers = self._hub.peers
        services: dict[str, Collection[str]] = {
            client: {field_of(info["id"]) for info in self._hub.services_of(client)} for client in peers
        }
        return Held(services, away=self._hub.transit)

    async def look(self) -> None:
        """One comparison, and the removal of what the previous one found stale too."""
        if self._gone:  # removed last time: back here meanwhile (a claim answered late)? write it back
            back, self._gone = self._gone & set(self._hub.peers), set()
            if back:
                await self._write_back({client: None for client in back}, reclaim=True)
        if self._looks_left <= 0:
            return
        before = self.held().services  # the values of what a live client holds are not needed
        recorded = await self._store.owned(lambda client, field: field not in before.get(client, ()))
        verdict = stale_entries(recorded, self.held(), self._suspects)
        done = await self._store.remove(verdict.remove) if verdict.remove else []
        self._suspects = verdict.suspects
        self._looks_left = self._looks_left - 1 if verdict.suspects else 0
        services = sum(len(removed) for _, _, removed in done)
        clients = [entry.client for entry, gone, _ in done if gone]
        self.removed_services += services
        self.removed_clients += len(clients)
        if services or clients:
            self._log.warning(
                "removed %d services and %d clients a failover brought back (deleted before it)", services, len(clients)
            )
        for entry, gone, removed in done:
            if gone and entry.client not in self._hub.peers:
                # announced again: its own clean-up, if still under way, now finds nothing to announce
                ws, _, cid = entry.client.partition("/")
                await self._hub.announce_gone(ws, cid, removed)
        # a registration (or a reconnection) that raced the removal: its entries go back at once;
        # a client removed may still be reconnecting (its claim answered late): checked next time
        raced = {
            entry.client: {field_of(info["id"]) for info in removed}
            for entry, _, removed in done
            if entry.client in self._hub.peers
        }
        self._gone = set(clients) - set(raced)
        if raced:
            await self._write_back(raced, reclaim=any(client in self._hub.peers for client in clients))

    async def _write_back(self, clients: Mapping[str, Collection[str] | None], *, reclaim: bool) -> None:
        """Write back the given fields (``None``: every service) of clients live here."""
        if reclaim:
            await self._hub.reclaim()
        infos = [
            info
            for client, fields in clients.items()
            if client in self._hub.peers
            for info in self._hub.services_of(client)
            if fields is None or field_of(info["id"]) in fields
        ]
        if infos:
            await self._reassert(infos)

"""What the cluster (:mod:`.cluster`, the hub's `cluster`) needs of the hub it serves beside, and of its bus."""

from __future__ import annotations

from collections.abc import Collection, Container, Mapping
from typing import Protocol

from switchboard.clock import Clock
from switchboard.config import Settings
from switchboard.protocol.hypha.services import ServiceInfo


class _User(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def accountable(self) -> str: ...


class _ServingClient(Protocol):
    @property
    def user(self) -> _User: ...

    @property
    def workspace(self) -> str: ...


class _Manager(Protocol):
    async def answers_ping(self, address: str, timeout: float = ...) -> bool: ...


class BusCounts(Protocol):
    """The bus's counters (a snapshot: ``backends/redis/bus/bus.py`` ``BusStats``)."""

    @property
    def desired(self) -> int: ...

    @property
    def confirmed(self) -> int: ...

    @property
    def repairs(self) -> int: ...

    @property
    def publishes_to_nobody(self) -> int: ...

    @property
    def reconnects(self) -> int: ...


class Bus(Protocol):
    @property
    def health(self) -> tuple[bool, str]: ...

    @property
    def stats(self) -> BusCounts: ...


class Totals(Protocol):
    """The hub's running totals, written into the presence record for the web console's rates."""

    def totals(self) -> Mapping[str, float]: ...


class PublishedLoads(Protocol):
    """Calls in flight to this replica's busiest clients, for the other replicas' ``min_load`` lookups."""

    def published(self) -> Mapping[str, int]: ...


class Served(Protocol):
    """What the cluster needs of the hub it serves beside."""

    replica_id: str
    settings: Settings
    clock: Clock

    @property
    def peers(self) -> Mapping[str, _ServingClient]: ...

    @property
    def transit(self) -> Container[str]:
        """Clients this replica holds for while they are away (in transit, or being cleaned up)."""
        ...

    def services_of(self, client: str) -> Collection[ServiceInfo]:
        """What the live connection of ``client`` (one of :attr:`peers`) announced."""
        ...

    def counted(self, client: str) -> bool:
        """Whether the hub-wide connection counts include the live connection of ``client``."""
        ...

    @property
    def manager(self) -> _Manager: ...

    @property
    def metrics(self) -> Totals: ...

    async def repair_registry(self) -> list[ServiceInfo]: ...

    async def reclaim(self) -> None: ...

    async def sweep_transits(self) -> int: ...

    @property
    def loads(self) -> PublishedLoads: ...

    async def purge(self, workspace: str, client_id: str, *, owner: str | None = None) -> int: ...

    async def announce_gone(self, workspace: str, client_id: str, removed: list[ServiceInfo]) -> int: ...

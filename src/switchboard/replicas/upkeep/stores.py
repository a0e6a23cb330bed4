"""What the replica layer needs from the shared store, beyond the hub's Registry and EventBus.

Small interfaces, implemented by :mod:`switchboard.backends.redis` (whose
methods raise :class:`~switchboard.errors.BackendError`, never a Redis
error). One process has none of this: it needs no presence, no leader and no
recovery.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from switchboard.protocol.hypha.services import ServiceInfo


class PresenceStore(Protocol):
    """Short-lived presence records, one per replica (``backends/redis/stores/presence.py``)."""

    async def write(self, fields: Mapping[str, Any], *, ttl: float) -> None: ...

    async def remove(self) -> None: ...

    async def known_and_live(self) -> tuple[set[str], set[str]]:
        """Replicas that ever announced themselves, and those whose record is current."""
        ...

    async def forget(self, replica_id: str) -> None: ...

    async def read_all(self) -> tuple[list[dict[str, Any]], str | None]:
        """Every live replica's record and the leader's id (for the status page)."""
        ...


class OwnedRegistry(Protocol):
    """The registry's view of which replica owns which client (``RedisRegistry``)."""

    async def owners(self) -> dict[str, str]:
        """``<ws>/<cid>`` → id of the replica that owns it."""
        ...

    async def check_reset(self, *, settle: float = 0.0, expect: Iterable[str] | None = None) -> bool:
        """Whether the store lost its data since the previous call (the first only records); the
        first replica to notice marks the store settling for at most ``settle`` seconds, until it
        and the replicas ``expect`` names have called :meth:`settled` (``None``: unknown, all of it)."""
        ...

    async def settled(self) -> None:
        """This replica re-wrote its registrations after a loss."""
        ...

    async def reassert(self, infos: Iterable[ServiceInfo]) -> int:
        """Re-write this replica's registrations; return how many were written."""
        ...

    async def remove_replica_state(self, replica_id: str) -> list[ServiceInfo]: ...


class ReplicaCounts(Protocol):
    """Connection counts kept per replica (``RedisConnectionCounts``)."""

    async def forget_replica(self, replica_id: str) -> int:
        """Drop every count of a replica that is gone."""
        ...

    async def rebuild(self, users: Mapping[str, int], workspaces: Mapping[str, int]) -> int:
        """Set this replica's counts (after the store lost them); return how many counters."""
        ...

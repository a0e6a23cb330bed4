"""Values about the clients a replica owns in a shared registry: what it holds for one of them, and
which of its entries to remove (after a failover lost deletes: :mod:`switchboard.replicas.upkeep.stale`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Recorded:
    """What the registry holds for one client this replica owns (its owner entry names this one)."""

    client: str  # "<ws>/<cid>"
    services: Mapping[str, str]  # its fields of the workspace's services hash ("<cid>:<svc>") -> stored value
    in_transit: bool = False  # marked in transit in the registry: its grace decides


@dataclass(frozen=True, slots=True)
class Stale:
    """Entries of one client to remove: ``services`` (field -> the value read, deleted only if
    unchanged) and, if ``departed``, the client itself (owner, holder and the replica's claim)."""

    client: str
    services: Mapping[str, str] = field(default_factory=dict)
    departed: bool = False

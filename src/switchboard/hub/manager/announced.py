"""What each connection here announced: its services, and each one's size (I/O-free).

The service directory (:mod:`switchboard.hub.manager.service_directory`) is
the only writer: it bounds a connection's registrations by count and bytes
without asking Redis. The replica re-asserts every live connection's services
when the shared registry comes back empty (:mod:`switchboard.hub.repairs`, the
cluster's upkeep), and the services gauge counts them. An entry is freed when
the hub detaches its connection (:meth:`Announced.forget`).
"""

from __future__ import annotations

from collections.abc import Mapping

from switchboard.hub.sessions.peer import Peer
from switchboard.protocol.hypha.services import ServiceInfo

_NONE: Mapping[str, ServiceInfo] = {}


class _Held:
    """One connection's services by id, and each one's size as the registry stores it."""

    __slots__ = ("services", "sizes")

    def __init__(self) -> None:
        self.services: dict[str, ServiceInfo] = {}
        self.sizes: dict[str, int] = {}


class Announced:
    """Each connection's announced services, by connection (see the module docstring)."""

    def __init__(self) -> None:
        self._of: dict[Peer, _Held] = {}  # only connections that announced something

    def of(self, peer: Peer) -> Mapping[str, ServiceInfo]:
        """``peer``'s services by id (none once it is detached)."""
        held = self._of.get(peer)
        return held.services if held is not None else _NONE

    def bytes_besides(self, peer: Peer, service_id: str) -> int:
        """The size of ``peer``'s services other than ``service_id``."""
        held = self._of.get(peer)
        if held is None:
            return 0
        return sum(held.sizes.values()) - held.sizes.get(service_id, 0)

    def add(self, peer: Peer, info: ServiceInfo, size: int) -> None:
        """``peer`` announced ``info`` (``size`` bytes)."""
        held = self._of.get(peer)
        if held is None:
            held = self._of[peer] = _Held()
        held.services[info["id"]] = info
        held.sizes[info["id"]] = size

    def remove(self, peer: Peer, service_id: str) -> None:
        """``peer`` withdrew ``service_id``."""
        held = self._of.get(peer)
        if held is None:
            return
        held.services.pop(service_id, None)
        held.sizes.pop(service_id, None)
        if not held.services:
            del self._of[peer]

    def forget(self, peer: Peer) -> None:
        """``peer`` was detached: what it announced is no longer kept here."""
        self._of.pop(peer, None)

    def __len__(self) -> int:
        """How many connections hold services here."""
        return len(self._of)

    def __repr__(self) -> str:
        return f"<Announced connections={len(self._of)}>"

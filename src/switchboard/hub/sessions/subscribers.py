"""Who hears which workspace event on this replica, so that a broadcast costs its listeners only.

Every client that connects or leaves makes an event for its workspace
(``client_connected``, ``client_disconnected``, ``service_added`` ...). Walking
the whole workspace to find who subscribed made each connect cost in
proportion to the clients already there (a workspace of 10,000 walked 10,000
peers for an event nobody had asked for); this index makes a broadcast cost
the peers that asked for its type. It also keeps what each connection asked
for (bounded per connection by the manager), freed when the hub detaches it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Set

from switchboard.hub.sessions.peer import Peer

_NOBODY: frozenset[Peer] = frozenset()
_NOTHING: frozenset[str] = frozenset()


class Subscribers:
    """Peers by workspace and event type, and each peer's event types (I/O-free)."""

    def __init__(self) -> None:
        self._by: dict[tuple[str, str], set[Peer]] = {}
        self._names: dict[Peer, set[str]] = {}  # only peers that hold some

    def add(self, peer: Peer, names: Iterable[str]) -> None:
        """``peer`` hears these event types from now on; nothing once it is closed (it is being detached)."""
        if peer.closed:
            return
        held = self._names.get(peer)
        for name in names:
            if held is None:
                held = self._names[peer] = set()
            if name not in held:
                held.add(name)
                self._by.setdefault((peer.workspace, name), set()).add(peer)

    def remove(self, peer: Peer, names: Iterable[str]) -> None:
        """``peer`` no longer hears these event types."""
        held = self._names.get(peer)
        if held is None:
            return
        for name in names:
            if name in held:
                held.discard(name)
                self._forget(peer, name)
        if not held:
            del self._names[peer]

    def drop(self, peer: Peer) -> None:
        """A detached peer hears nothing more: everything it asked for is freed."""
        for name in self._names.pop(peer, ()):
            self._forget(peer, name)

    def names_of(self, peer: Peer) -> Set[str]:
        """The event types ``peer`` hears (none once it is detached)."""
        return self._names.get(peer, _NOTHING)

    def of(self, workspace: str, event_type: str) -> Collection[Peer]:
        """The peers of ``workspace`` here that subscribed to ``event_type``."""
        return self._by.get((workspace, event_type), _NOBODY)

    def _forget(self, peer: Peer, name: str) -> None:
        key = (peer.workspace, name)
        peers = self._by.get(key)
        if peers is not None:
            peers.discard(peer)
            if not peers:
                del self._by[key]

    def __len__(self) -> int:
        """How many (workspace, event type) pairs someone here listens to."""
        return len(self._by)

    def __repr__(self) -> str:
        return f"<Subscribers pairs={len(self._by)}>"

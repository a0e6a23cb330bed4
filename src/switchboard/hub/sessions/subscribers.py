"""Who hears which workspace event on this replica, so that a broadcast costs its listeners only.

Every client that connects or leaves makes an event for its workspace
(``client_connected``, ``client_disconnected``, ``service_added`` ...). Walking
the whole workspace to find who subscribed made each connect cost in
proportion to the clients already there (a workspace of 10,000 walked 10,000
peers for an event nobody had asked for); this index makes a broadcast cost
the peers that asked for its type. A :class:`~switchboard.hub.sessions.peer.Peer`'s own
``subscriptions`` stay the record of what it asked for (bounded per
connection); this index is kept in step with them and is the only writer.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from switchboard.hub.sessions.peer import Peer

_NOBODY: frozenset[Peer] = frozenset()


class Subscribers:
    """Peers by workspace and event type (I/O-free)."""

    def __init__(self) -> None:
        self._by: dict[tuple[str, str], set[Peer]] = {}

    def add(self, peer: Peer, names: Iterable[str]) -> None:
        """``peer`` hears these event types from now on; nothing once it is closed (it is being detached)."""
        if peer.closed:
            return
        for name in names:
            if name not in peer.subscriptions:
                peer.subscriptions.add(name)
                self._by.setdefault((peer.workspace, name), set()).add(peer)

    def remove(self, peer: Peer, names: Iterable[str]) -> None:
        """``peer`` no longer hears these event types."""
        for name in names:
            if name in peer.subscriptions:
                peer.subscriptions.discard(name)
                self._forget(peer, name)

    def drop(self, peer: Peer) -> None:
        """A detached peer hears nothing more: everything it asked for is freed."""
        for name in peer.subscriptions:
            self._forget(peer, name)
        peer.subscriptions.clear()

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

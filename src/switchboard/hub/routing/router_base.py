"""What every part of the :class:`~switchboard.hub.routing.router.Router` reads: the hub's tables
(read only) and the router's own state, named once for the parts it is made of.

The router is one object made of parts, each a concept with its own module:
balanced handles (:mod:`~switchboard.hub.routing.balanced_routes`), chunked
messages walked for their receiver (:mod:`~switchboard.hub.routing.chunk_routes`),
a frame's way to one client and what the I/O turned up
(:mod:`~switchboard.hub.routing.deliveries`), frames other replicas routed here
(:mod:`~switchboard.hub.routing.relayed_routes`), and a client's own frames
(:mod:`~switchboard.hub.routing.router`). Nothing here awaits.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import TYPE_CHECKING

from switchboard.hub.routing import balance
from switchboard.hub.routing.actions import Action
from switchboard.hub.routing.binds import PendingBinds
from switchboard.hub.routing.inflight import InFlight
from switchboard.hub.routing.reply_routes import ReplyRoutes
from switchboard.hub.routing.served import ServedHandles
from switchboard.hub.routing.undelivered import Undelivered
from switchboard.hub.routing.uploads import Receivers
from switchboard.hub.sessions.in_transit import Transit
from switchboard.protocol.hypha import envelope, handshake

if TYPE_CHECKING:
    from switchboard.clock import Clock
    from switchboard.config import Settings
    from switchboard.hub.sessions.in_transit import Waiting
    from switchboard.hub.sessions.peer import Peer
    from switchboard.metrics import HubMetrics


class RouterBase:
    """The state the router's parts share (set by :class:`~switchboard.hub.routing.router.Router`)."""

    settings: Settings
    clock: Clock
    metrics: HubMetrics
    replica_id: str
    manager_id: str
    manager_address: str
    peers: Mapping[str, Peer]  # clients here
    aliases: Container[str]  # HTTP callers' addresses
    transit: Transit[Undelivered]
    retry: Waiting
    replies: Waiting | None
    inflight: InFlight
    reply_routes: ReplyRoutes
    uploads: Receivers
    balanced: balance.Balanced
    binds: PendingBinds  # frames waiting for a balanced handle to be bound here
    served: ServedHandles  # balanced calls our instances took from callers elsewhere
    draining: bool

    def route(self, peer: Peer, data: bytes) -> Action | None:
        raise NotImplementedError  # :class:`~switchboard.hub.routing.router.Router`

    def toward(self, target: str, item: Undelivered, *, new_call: bool = False) -> Action | None:
        raise NotImplementedError  # :class:`~switchboard.hub.routing.deliveries.Deliveries`

    def relayed(self, peer: Peer, data: bytes) -> Action | None:
        raise NotImplementedError  # :class:`~switchboard.hub.routing.relayed_routes.RelayedRoutes`

    def _refusal(self, peer: Peer, session: str | None, target: str, message: str) -> bytes | str:
        """A frame the hub will not deliver: its call fails now, with the reason."""
        if session:
            return envelope.reject_frame(session=session, target=target, caller=peer.id, message=message)
        return handshake.error_text(f"Invalid message: {message}")

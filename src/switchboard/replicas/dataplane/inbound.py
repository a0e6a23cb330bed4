"""What other replicas send this one: the channels it arrives on, and the one port it climbs through.

Every message, off the bus or a direct link, is decoded once at the edge
(:func:`~switchboard.protocol.link.replica_wire.decode`) and the value handed to one
:class:`Inbound`, which dispatches on its type: a subscription names a channel,
never a callable of its own. The hub implements the port once
(:class:`~switchboard.hub.from_replicas.FromReplicas`); which client a client
channel's frame is for is looked up there, in the hub's tables.
"""

from __future__ import annotations

from typing import Protocol

from switchboard.protocol.hypha import ids
from switchboard.protocol.link import replica_wire
from switchboard.protocol.link.replica_wire import Message

# the channels' names and what travels on each: protocol/link/replica_wire.py
CLIENT_CHANNEL = ids.CLIENT_CHANNEL
REPLICA_CHANNEL = replica_wire.REPLICA_CHANNEL
WORKSPACE_CHANNEL = replica_wire.WORKSPACE_CHANNEL
DELETED_CHANNEL = replica_wire.DELETED_CHANNEL
REVOKED_CHANNEL = replica_wire.REVOKED_CHANNEL
KICK_CHANNEL = replica_wire.KICK_CHANNEL
TRANSIT_CHANNEL = replica_wire.TRANSIT_CHANNEL


class Inbound(Protocol):
    """Where every message from another replica goes, as a value."""

    def receive(self, message: Message) -> bool:
        """Carry out ``message``; ``False``: a client (or HTTP caller) that is not here (the caller
        drops it and counts it; a link sends it back)."""
        ...

"""What other replicas send this one: the channels it arrives on, and the one port it climbs through.

Every message, off the bus or a direct link, is handed to one :class:`Inbound`
by :func:`hand`, by the name of its channel: a subscription names a channel,
never a callable of its own. The hub implements the port once
(:class:`~switchboard.hub.from_replicas.FromReplicas`); which client a client
channel's frame is for is looked up there, in the hub's tables.
"""

from __future__ import annotations

from typing import Protocol

from switchboard.protocol import ids

CLIENT_CHANNEL = ids.CLIENT_CHANNEL  # + "<ws>/<cid>": frames for a client (or an HTTP caller the manager acts for)
REPLICA_CHANNEL = "sb:replica:"  # + replica id: replies to calls its manager made
WORKSPACE_CHANNEL = "sb:ws:"  # + workspace: broadcasts, heard by every replica with members there
DELETED_CHANNEL = "sb:deleted"  # which workspace was deleted: every replica ends its clients' sessions there
REVOKED_CHANNEL = "sb:revoked"  # which credential (jti) was revoked: every replica ends the sessions standing on it
KICK_CHANNEL = (
    "sb:kick"  # which client (or every client of a workspace) the root user closed: "<ws>/<cid|*>\n<code>\n<reason>"
)
TRANSIT_CHANNEL = "sb:transit"  # clients in transit: left, back, gone, abandoned, taken


class Inbound(Protocol):
    """One method per kind of channel; each takes the message as it travelled (a client's frame
    without the bus's sender tag)."""

    def to_client(self, address: str, frame: bytes) -> bool:
        """A frame for the client (or HTTP caller) ``address``; ``False``: nobody here by that address."""
        ...

    def to_manager(self, frame: bytes) -> None:
        """A reply to a call this replica's manager made (this replica's own channel)."""
        ...

    def broadcast(self, data: bytes) -> None:
        """A workspace broadcast another replica published (``<origin>\\n<frame>``)."""
        ...

    def workspace_deleted(self, workspace: str) -> None: ...

    def credential_revoked(self, token_id: str) -> None: ...

    def kicked(self, data: bytes) -> None:
        """The root user closed a client, or every client of a workspace (``admin-utils``)."""
        ...

    def transit_notice(self, data: bytes) -> None:
        """A notice about a client in transit (:mod:`switchboard.hub.transit.moves`)."""
        ...


def hand(port: Inbound, channel: str, data: bytes) -> bool:
    """Give ``data`` to the method of ``port`` that ``channel`` names; ``False``: a channel this
    replica has no use for, or a client that is not here (the caller drops it and counts it)."""
    if channel.startswith(CLIENT_CHANNEL):
        return port.to_client(channel.removeprefix(CLIENT_CHANNEL), data)
    if channel.startswith(WORKSPACE_CHANNEL):
        port.broadcast(data)
    elif channel.startswith(REPLICA_CHANNEL):
        port.to_manager(data)
    elif channel == TRANSIT_CHANNEL:
        port.transit_notice(data)
    elif channel == DELETED_CHANNEL:
        port.workspace_deleted(data.decode(errors="replace"))
    elif channel == REVOKED_CHANNEL:
        port.credential_revoked(data.decode(errors="replace"))
    elif channel == KICK_CHANNEL:
        port.kicked(data)
    else:
        return False
    return True

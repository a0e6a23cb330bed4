"""The other replicas, as this one reaches them: the event bus, the direct links, the registry's claims.

I/O only, no decisions (those are :class:`~switchboard.hub.routing.router.Router`'s, and
so is the frame as it travels: a call the manager makes comes here wrapped with
its origin, :class:`~switchboard.hub.routing.actions.Forward`): publishing to a client's,
a workspace's or a replica's channel (a bus failure counts as "nobody received
it", never as a crash), sending over a direct link, asking the registry whether
some replica still claims a client. A client's
frames go through :class:`~switchboard.replicas.dataplane.unicast.Unicast` (a link if one
takes them, else the bus); what it says back about frames it had counted as
delivered reaches the hub in one place, :meth:`Remote.lost`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from switchboard.backends.base import EventBus, Registry
from switchboard.errors import BackendError
from switchboard.protocol.hypha.services import ServiceQuery
from switchboard.protocol.link import replica_wire
from switchboard.protocol.link.replica_wire import ManagerReply, Message
from switchboard.replicas.dataplane.inbound import CLIENT_CHANNEL, REPLICA_CHANNEL, WORKSPACE_CHANNEL
from switchboard.replicas.dataplane.unicast import Unicast

log = logging.getLogger(__name__)

# the channels' names are replicas/dataplane/inbound.py's
__all__ = ["CLIENT_CHANNEL", "REPLICA_CHANNEL", "WORKSPACE_CHANNEL", "Remote"]


class Remote:
    """This replica's side of the bus."""

    def __init__(self, *, bus: EventBus, unicast: Unicast, registry: Registry, replica_id: str) -> None:
        self.bus = bus
        self.unicast = unicast
        self.registry = registry
        self.replica_id = replica_id
        self.log = logging.LoggerAdapter(log, {"replica": replica_id})

    async def lost(self) -> AsyncIterator[tuple[str, bytes]]:
        """``(target, frame)`` for a client that the unicast had counted as delivered and that reached
        nobody after all (a direct link gave it back and Redis found no subscriber); ends at close."""
        async for channel, data in self.unicast.lost():
            if channel.startswith(CLIENT_CHANNEL):
                yield channel.removeprefix(CLIENT_CHANNEL), data

    async def publish(self, channel: str, data: bytes) -> int:
        """Publish; return how many replicas received it (0 also when the bus failed)."""
        try:
            return await self.bus.publish(channel, data)
        except BackendError as exc:
            self.log.warning("publish failed: %s", exc)
            return 0

    async def publish_message(self, message: Message) -> int:
        """Publish ``message`` on its channel, as :meth:`publish` (``protocol/link/replica_wire.py``)."""
        return await self.publish(replica_wire.channel_of(message), replica_wire.encode(message))

    async def publish_to_replica(self, replica: str, frame: bytes, event: bool = False) -> bool:
        """A reply to a call ``replica``'s manager made, to its replica channel (over a link to it
        if one is open: a replica cut off from Redis still answers those it is linked to);
        ``False``: nobody heard it. (``event`` is never set: replies are RPC frames.)"""
        return self.send_to_replica(replica, frame) or await self.publish_message(ManagerReply(replica, frame)) > 0

    def send_to_replica(self, replica: str, frame: bytes) -> bool:
        """Over a direct link to ``replica``, if one is open and takes it now."""
        return self.unicast.send(REPLICA_CHANNEL + replica, frame)

    def send_direct(self, target: str, frame: bytes, sender: str = "") -> bool:
        """Over a direct link to the client's replica, if one is known and takes it now; a ``sender``
        connected here is offered on that link, so that its answer comes back the same way."""
        return self.unicast.send(CLIENT_CHANNEL + target, frame, reply_to=CLIENT_CHANNEL + sender if sender else None)

    async def publish_to_client(self, target: str, frame: bytes, event: bool = False, *, link: bool = True) -> bool:
        """To the replica holding ``target``, over a direct link if one takes it now, else through the
        bus; ``False``: none received it. An event keeps to the bus's shared path, behind the
        broadcasts its sender emitted before it; so does a frame whose link was tried already
        (``link=False``)."""
        try:
            return await self.unicast.publish(CLIENT_CHANNEL + target, frame, direct=link and not event) > 0
        except BackendError as exc:
            self.log.warning("publish failed: %s", exc)
            return False

    async def worth_retrying(self, target: str) -> bool:
        """Does some replica claim this client, or can we not tell right now?"""
        ws, _, cid = target.partition("/")
        try:
            # a registry that lost its data (Redis restarted empty) is re-filled within seconds
            return bool(await self.registry.find(ServiceQuery(ws, cid, "built-in"))) or await self.registry.lost_data()
        except BackendError:
            return True  # the registry is unreachable: a retry may well succeed

    def __repr__(self) -> str:
        return f"<Remote replica={self.replica_id}>"

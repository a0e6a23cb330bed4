"""Frames for one client, to whichever replica holds it: over a direct link if one is known, else the bus.

The hub asks, and gets answers as values:

* :meth:`Unicast.send` writes a frame to a link now, or says ``False``: fall
  back to :meth:`Unicast.publish`, which goes through the bus (Redis) and
  returns how many replicas received it.
* A frame a link gave back (the client had left that replica, or the link
  died before acking it) is published through the bus here; one that then
  reaches nobody comes out of :meth:`Unicast.lost`, for the hub to retry or
  fail like a publish to nobody. Whether a lost link's unacked frame is
  published again at all is the hub's rule (``worth_replaying``, handed in:
  :mod:`switchboard.hub.routing.replays`).

Frames through the bus carry their sender's link address
(:class:`~switchboard.protocol.link.replica_wire.ClientFrame`'s ``origin``), so the
replica holding the channel can offer a link back (:mod:`switchboard.replicas.dataplane.links`).
The bus itself knows nothing of links: it only publishes and subscribes.

What arrives, off the bus or a link, is decoded once here (the links decode
their own, :meth:`~switchboard.replicas.dataplane.links.Links.on_events`) and climbs as a
value through one port, an :class:`~switchboard.replicas.dataplane.inbound.Inbound` handed
to :meth:`Unicast.listen`: the bus is given one listener, and a subscription is
a channel name. A message that cannot be read is counted (:attr:`Unicast.malformed`)
and dropped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

from switchboard.backends.base import EventBus
from switchboard.clock import Clock
from switchboard.errors import BackendError, ProtocolError
from switchboard.protocol.link import replica_wire
from switchboard.protocol.link.peer_versions import PeerVersions
from switchboard.protocol.link.replica_wire import BalancedCall, BouncedCall, ClientFrame, ManagerCall, Message
from switchboard.replicas.dataplane.inbound import CLIENT_CHANNEL, Inbound
from switchboard.replicas.dataplane.links import Links, LinkSettings, Returned
from switchboard.tasks import cancel_and_wait, spawn

logger = logging.getLogger(__name__)


class Unicast:
    """Client channels (``sb:client:<ws>/<cid>``) on top of an :class:`EventBus`, with links if enabled."""

    def __init__(
        self,
        bus: EventBus,
        *,
        replica_id: str,
        clock: Clock,
        worth_replaying: Callable[[bytes], bool],
        links: LinkSettings | None = None,
        untagged_prefix: str | None = None,
    ) -> None:
        self._bus = bus
        # channels whose frames go through the bus as they are (replicas' own channels, heard by
        # a plain subscriber): a frame for one that a link gave back is published untagged
        self._untagged_prefix = untagged_prefix
        # the hub's replay rule: whether a lost link's unacked frame is published again
        self.worth_replaying = worth_replaying
        self._here: set[str] = set()  # channels wanted here: a link's frame for one is delivered
        self._inbound: Inbound | None = None  # where every frame for us goes, from start on
        self._lost: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._extra = {"replica": replica_id}
        self.replayed = 0  # unacked frames of a lost link published again
        self.not_replayed = 0  # unacked frames of a lost link known to have arrived (answered calls)
        self.dropped = 0  # messages not delivered: for a client this replica does not have, or unreadable
        self.malformed = 0  # of those, off the bus and unreadable (malformed, unknown, of a newer wire version)
        self.links: Links | None = None
        # what each other replica reads (its presence record, learned by the upkeep): whether a
        # balanced or bounced call may take a link to it
        self.peer_versions = PeerVersions()
        if links is not None:
            self.links = Links(replica_id=replica_id, settings=links, clock=clock, deliver=self._deliver_here)

    @property
    def origin(self) -> str:
        """``replica@host:port`` other replicas dial to reach us ('' without links)."""
        return self.links.origin if self.links is not None else ""

    def listen(self, inbound: Inbound) -> None:
        """Everything for this replica, off the bus or a link, goes to ``inbound`` (given once, by the
        composition root, before the first subscription): the bus's one listener is this unicast."""
        if self._inbound is not None:
            raise RuntimeError("the unicast's inbound port is given once")
        self._inbound = inbound
        self._bus.listen(self._from_bus)

    async def start(self) -> None:
        if self.links is not None:
            await self.links.start()
            spawn(self._tasks, self._take_back(self.links), "switchboard-link-returns")

    async def close(self) -> None:
        """Close the links; ends :meth:`lost` (the bus is its owner's to close)."""
        if self._closed:
            return
        self._closed = True
        if self.links is not None:
            await self.links.close()
        await cancel_and_wait(list(self._tasks))
        self._lost.put_nowait(None)

    # -- sending -----------------------------------------------------------------

    def send(self, channel: str, data: bytes, *, reply_to: str | None = None) -> bool:
        """Over a link, now, if ``channel`` has a route that takes it; ``False``: publish it.
        ``reply_to``: the sender's channel, offered on that link if the sender is here."""
        if self.links is None:
            return False
        if replica_wire.bus_only(data):  # a balanced or bounced call: to a replica that reads it
            peer = self.links.route_of(channel)
            body = replica_wire.over_link(data, self.peer_versions.reads(peer)) if peer is not None else None
            if body is None:
                return False  # the bus, its mark in the origin tag
            data = body
        return self.links.send(channel, data, reply_to=reply_to if reply_to in self._here else None)

    async def publish(self, channel: str, data: bytes, *, direct: bool = True) -> int:
        """How many replicas received ``data`` (0 = nobody); :class:`BackendError` if the bus failed.

        A frame a link takes counts 1 (should it come back, :meth:`lost` says so).
        ``direct=False`` keeps it on the bus, behind the broadcasts sent before
        it: an event must not overtake them.
        """
        if direct and self.send(channel, data):
            return 1
        return await self._bus.publish(channel, self._tagged(channel, data))

    async def lost(self) -> AsyncIterator[tuple[str, bytes]]:
        """``(channel, frame)`` that a link gave back and the bus then delivered to nobody; ends at close."""
        while (item := await self._lost.get()) is not None:
            yield item

    # -- receiving ---------------------------------------------------------------

    async def subscribe(self, channel: str) -> None:
        """A client's channel: its frames, whichever way they come, go to the port's ``to_client``."""
        self._here.add(channel)
        await self._bus.subscribe(channel)

    async def subscribe_own(self, channel: str) -> None:
        """This replica's own channel: on the bus as its senders publish it (untagged), and offered
        on every link, so a replica linked to this one reaches it even while Redis does not."""
        self._here.add(channel)
        if self.links is not None:
            self.links.hint_everywhere(channel)
        await self._bus.subscribe(channel)

    async def unsubscribe(self, channel: str) -> None:
        """Links' frames for ``channel`` go back at once; the bus's until Redis confirms."""
        self._here.discard(channel)
        if self.links is not None:
            self.links.forget(channel)
        await self._bus.unsubscribe(channel)

    def _from_bus(self, channel: str, data: bytes) -> None:
        """The bus's one listener: a client's frame carries its sender's link address (offered a link)."""
        try:
            message = replica_wire.decode(channel, data)
        except ProtocolError as exc:
            self.malformed += 1
            self.dropped += 1
            logger.warning("dropped a message on %s: %s", channel[:120], exc, extra=self._extra)
            return
        replay = message.replay if isinstance(message, ClientFrame | ManagerCall | BalancedCall | BouncedCall) else None
        if replay is not None and self.links is not None and not self.links.replayed(replay):
            return  # a lost link's frame that the link (or an earlier replay) delivered here already
        if type(message) is ClientFrame or type(message) is ManagerCall:
            origin = message.sender if type(message) is ManagerCall else message.origin
            if origin and self.links is not None:
                self.links.heard(origin, channel)
        self._hand(channel, message)

    def _deliver_here(self, channel: str, message: Message) -> bool:
        """A message that came over a link: ours only while we still want its channel."""
        if channel not in self._here:
            return False
        try:
            self._hand(channel, message)
        except Exception:  # the port's bug, never the link's
            logger.exception("frame for %s failed", channel, extra=self._extra)
        return True

    def _hand(self, channel: str, message: Message) -> None:
        if self._inbound is None or not self._inbound.receive(message):
            self.dropped += 1
            logger.debug("dropped a frame for %s: nobody here", channel, extra=self._extra)

    def _tagged(self, channel: str, data: bytes, replay: tuple[str, int] | None = None) -> bytes:
        """A client channel's frame as it goes through the bus: with this replica's link address."""
        address = channel.removeprefix(CLIENT_CHANNEL)
        return replica_wire.encode(replica_wire.outgoing(address, data, self.origin, replay))

    # -- frames links gave back --------------------------------------------------

    async def _take_back(self, links: Links) -> None:
        while True:
            item = await links.returned()
            if replica_wire.bus_only(data := replica_wire.handed_on(item.data)):
                # a balanced or bounced call: sent again as the router handed it on, marked, with
                # a lost link's number beside its mark (delivered once, as a plain frame is)
                item = Returned(item.channel, data, item.unacked, item.replay)
            if item.unacked:
                if not self.worth_replaying(item.data):
                    self.not_replayed += 1
                    continue
                self.replayed += 1
            spawn(self._tasks, self._republish(item), "switchboard-link-republish")

    async def _republish(self, item: Returned) -> None:
        """Redis, the source of truth, decides who gets a frame a link gave back.

        A lost link's frame goes through Redis alone, marked with its number on that link
        (never over another link, which would not carry the mark): the replica that holds
        its channel delivers it only if the lost link did not.
        """
        try:
            if self._untagged_prefix is not None and item.channel.startswith(self._untagged_prefix):
                receivers = await self._bus.publish(item.channel, item.data)
            elif item.replay is not None:
                receivers = await self._bus.publish(item.channel, self._tagged(item.channel, item.data, item.replay))
            else:
                receivers = await self.publish(item.channel, item.data)
        except BackendError as exc:
            logger.warning("%s", exc, extra=self._extra)
            receivers = 0
        if receivers == 0:
            self._lost.put_nowait((item.channel, item.data))

    def __repr__(self) -> str:
        return f"Unicast({self.links!r}, channels={len(self._here)})"

"""Direct links between replicas: a client's frames skip Redis once its replica is known.

Routes are learned from traffic and verified by the receiver, so they need no
directory to keep consistent:

1. The first frame for a client's channel goes through Redis, tagged with the
   sender's ``replica@host:port`` (:mod:`switchboard.replicas.dataplane.unicast`); a
   frame sent over a link offers its sender's channel on that link, so that
   the answer needs no first trip through Redis.
2. The replica that holds the channel dials the sender, answers its
   challenge (``protocol/link/link_wire.py``: a HELLO good for that one connection to
   that one replica, a WELCOME back; both prove they hold a key derived from
   the hub's shared secret) and sends ``HINT channel``. Every frame after the
   handshake is sealed, each way (``protocol/link/link_seal.py``), and a listener
   takes few unfinished handshakes per address (``protocol/link/link_gate.py``).
3. The sender writes later frames for that channel to the link (``DELIVER``).
4. A receiver that no longer has the channel (the client left or moved)
   sends the frame back (``NACK``); the sender forgets the route and the
   frame comes out of :meth:`Links.returned`, to be published through Redis,
   the source of truth.

A link that breaks, backs up or goes silent only sends traffic back to
Redis: the frames it leaves unacked come out of :meth:`Links.returned` too
(``unacked=True``: they may have arrived), so a cut link delays them instead
of losing them. Each carries its number on the link, and the receiver
delivers a replay only if the link did not (:meth:`Links.replayed`,
``protocol/link/link_arrivals.py``): a frame arrives at most once, whichever way it
comes and whatever a host on the path withholds or repeats. Frames may
overtake one another only while a route changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass

from switchboard.clock import Clock
from switchboard.errors import ProtocolError
from switchboard.protocol.link import link_wire as wire
from switchboard.protocol.link import replica_wire
from switchboard.protocol.link.link_arrivals import Arrivals
from switchboard.protocol.link.link_gate import MAX_PENDING, HandshakeGate, RefusalLog
from switchboard.protocol.link.link_state import HEARTBEAT, Delivered, Event, Hinted, Opened, SentBack
from switchboard.protocol.link.replica_wire import Message
from switchboard.replicas.dataplane.link import Link
from switchboard.tasks import cancel_and_wait, spawn

logger = logging.getLogger(__name__)

# After a failed dial, frames keep going through Redis for this long before
# dialling again: a replica whose link port is unreachable costs one attempt
# per interval, not one per frame.
REDIAL_AFTER = 5.0
_MAX_PENDING_HINTS = 10_000  # per replica being dialled; the rest are re-learned from traffic


@dataclass(frozen=True)
class LinkSettings:
    """Where this replica listens for links, what it tells others to dial, and the shared secret."""

    secret: str
    host: str = "127.0.0.1"
    port: int = 0
    advertise: str = (
        ""  # "host" or "host:port" others dial; empty: ``host``, or this machine's address if that is a wildcard
    )
    max_frame: int = 64 << 20
    dial_timeout: float = 2.0
    max_handshakes: int = MAX_PENDING  # unfinished handshakes on the listener, from all addresses


@dataclass
class LinkStats:
    direct: int = 0  # frames written to a link instead of Redis
    received: int = 0  # frames that arrived over a link and were delivered here
    nacked: int = 0  # frames sent back because their channel is no longer here
    dials: int = 0
    dial_failures: int = 0
    refused: int = 0  # accepted connections that failed the handshake (or never finished it, or were turned away)
    turned_away: int = 0  # of those, closed unanswered: too many unfinished handshakes from their address
    forged: int = 0  # open links dropped because a frame failed its MAC or sequence number
    duplicates: int = 0  # frames not delivered again: a replay of one a link delivered, or the reverse
    malformed: int = 0  # delivered frames whose message could not be read (or of a newer wire version)


@dataclass(frozen=True, slots=True)
class Returned:
    """A frame a link gave back: to publish through Redis instead.

    ``unacked``: a lost link's frame, which may have arrived (so it may be
    known not to need sending again); else the receiver refused it (NACK).
    ``replay``: an unacked frame's (direction id, number) on its link, which
    its replay through Redis carries (:func:`~switchboard.protocol.link.replica_wire.tag`).
    """

    channel: str
    data: bytes
    unacked: bool
    replay: tuple[str, int] | None = None


def open_descriptors() -> tuple[int, int] | None:
    """This process's open file descriptors and its limit (RLIMIT_NOFILE), or ``None`` where unknown."""
    try:
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        count = len(os.listdir("/proc/self/fd"))
    except (OSError, ValueError):
        return None
    return None if limit == resource.RLIM_INFINITY else (count, limit)


def advertised(advertise: str, bind_host: str, port: int) -> str:
    """``host:port`` other replicas dial: ``advertise`` ("host" or "host:port", IPv6 in
    brackets), else the bound host, else (a wildcard) this machine's address."""
    host, sep, given = advertise.rpartition(":")
    if not (sep and given.isdigit()) or advertise.endswith("]"):
        host, given = advertise, ""
    host = host or bind_host
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = socket.gethostbyname(socket.gethostname())
    return f"{host}:{given or port}"


class Links:
    """This replica's link listener, its links, and the routes learned over them.

    ``deliver(channel, message)`` hands what came over a link, decoded
    (:func:`~switchboard.protocol.link.replica_wire.decode`), to this replica's
    subscriber and says whether there was one (else the frame goes back). A
    frame that cannot be decoded is counted (:attr:`LinkStats.malformed`) and dropped.
    """

    def __init__(
        self,
        *,
        replica_id: str,
        settings: LinkSettings,
        clock: Clock,
        deliver: Callable[[str, Message], bool],
        descriptors: Callable[[], tuple[int, int] | None] = open_descriptors,
    ) -> None:
        if not settings.secret:
            raise ValueError("links need the hub's shared secret")
        self.replica_id = replica_id
        self._key = wire.link_key(settings.secret)
        self.max_frame = settings.max_frame
        self.origin = ""  # "replica@host:port", once listening
        self.stats = LinkStats()
        self._clock = clock
        self._deliver = deliver
        self._bind = (settings.host, settings.port)
        self._advertise = settings.advertise
        self._dial_timeout = settings.dial_timeout
        self._server: asyncio.Server | None = None
        self._links: set[Link] = set()
        self._to: dict[str, Link] = {}  # replica id -> the link hints to it go over
        self._routes: dict[str, Link] = {}  # channel -> the link its frames go over
        self._routes_of: dict[Link, set[str]] = {}  # the channels each link carries from us
        self._hinted: dict[Link, set[str]] = {}  # channels we told each link's other side live here
        self._pending: dict[str, set[str]] = {}  # replica being dialled -> hints to send
        self._everywhere: set[str] = set()  # hinted on every link: this replica's own channels
        self._quiet_until: dict[str, float] = {}  # replica -> no dialling before (after a failure)
        self._dialling: set[str] = set()
        self._gate = HandshakeGate(total=settings.max_handshakes)  # unfinished handshakes, on the listener
        self._descriptors = descriptors
        self._handshaking: set[Link] = set()  # accepted links the gate counts
        self._refusals = RefusalLog()
        self._arrivals = Arrivals()  # what each link delivered here: replays of it are not delivered again
        self._returned: asyncio.Queue[Returned] = asyncio.Queue()
        self._tasks: set[asyncio.Task[None]] = set()

    def now(self) -> float:
        return self._clock.monotonic()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: self._track(Link(self, self._accept(), max_frame=self.max_frame)), *self._bind
        )
        port = self._server.sockets[0].getsockname()[1]
        self.origin = f"{self.replica_id}@{advertised(self._advertise, self._bind[0], port)}"
        spawn(self._tasks, self._heartbeat_loop(), "switchboard-link-heartbeat")
        logger.info(
            "links listening on %s:%s, advertised as %s",
            self._bind[0],
            port,
            self.origin,
            extra={"replica": self.replica_id},
        )

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            link.abort()
        await cancel_and_wait(list(self._tasks))
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)

    # -- sending -----------------------------------------------------------------

    def send(self, channel: str, data: bytes, *, reply_to: str | None = None) -> bool:
        """Write ``data`` to the link ``channel`` was hinted on; ``False``: use Redis.

        ``reply_to``: a channel held here (the sender's, a client of this replica), hinted on
        that link first if it is not yet: the other replica's answer comes straight back
        the way the call went, never through Redis, which a replica cut off from it could
        not wait for without holding up the sender's every later frame.
        """
        link = self._routes.get(channel)
        if link is None:
            return False
        if reply_to is not None and not link.closed and reply_to not in (hinted := self._hinted[link]):
            hinted.add(reply_to)
            link.hint(reply_to)
        if not link.deliver(channel, data):
            return False
        self.stats.direct += 1
        return True

    async def returned(self) -> Returned:
        """The next frame a link gave back (sent back, or left unacked by a lost link)."""
        return await self._returned.get()

    @property
    def route_count(self) -> int:
        """Channels with a learned route (routes of a lost link are forgotten with it)."""
        return len(self._routes)

    @property
    def pending_handshakes(self) -> int:
        """Accepted connections that have not finished their handshake yet."""
        return self._gate.pending

    def route_of(self, channel: str) -> str | None:
        """The replica ``channel``'s frames go straight to, if any (for tests and status)."""
        link = self._routes.get(channel)
        return link.peer if link is not None and not link.closed else None

    def replayed(self, replay: tuple[str, int]) -> bool:
        """A lost link's unacked frame came through Redis: deliver it (``True``) unless it arrived already."""
        if self._arrivals.from_replay(*replay, self.now()):
            return True
        self.stats.duplicates += 1
        return False

    # -- learning ----------------------------------------------------------------

    def heard(self, origin: str, channel: str) -> None:
        """A frame for our ``channel`` came through Redis from ``origin``: offer it a link."""
        parsed = wire.parse_origin(origin)
        if parsed is None or parsed[0] == self.replica_id:
            return
        replica, host, port = parsed
        link = self._to.get(replica)
        if link is not None and not link.closed:
            hinted = self._hinted[link]
            if channel not in hinted:
                hinted.add(channel)
                link.hint(channel)
            return
        pending = self._pending.setdefault(replica, set())
        if len(pending) < _MAX_PENDING_HINTS:
            pending.add(channel)
        if replica not in self._dialling and self.now() >= self._quiet_until.get(replica, 0.0):
            self._dialling.add(replica)
            spawn(self._tasks, self._dial(replica, host, port), f"switchboard-link-dial-{replica}")

    def hint_everywhere(self, channel: str) -> None:
        """Offer ``channel`` on every link, open or to come: frames for it may take any link here
        (this replica's own channel: a replica it talks to through links need not hear it through
        Redis first, nor reach it through Redis at all)."""
        self._everywhere.add(channel)
        for link in self._to.values():
            if not link.closed and channel not in self._hinted[link]:
                self._hinted[link].add(channel)
                link.hint(channel)

    def forget(self, channel: str) -> None:
        """``channel`` left this replica: hint it again if it comes back."""
        for hinted in self._hinted.values():
            hinted.discard(channel)
        for hints in self._pending.values():
            hints.discard(channel)

    async def _heartbeat_loop(self) -> None:
        while True:
            await self._clock.sleep(HEARTBEAT / 2)
            now = self.now()
            for link in list(self._links):
                link.tick(now)
            if (line := self._refusals.due(now)) is not None:
                logger.warning(line, extra={"replica": self.replica_id})

    async def _dial(self, replica: str, host: str, port: int) -> None:
        self.stats.dials += 1
        # the route named ``replica``: only it can answer a HELLO bound to its id
        handshake = wire.Dial(self._key, self.replica_id, replica, secrets.token_bytes(wire.NONCE_SIZE))
        link: Link | None = None
        try:
            async with asyncio.timeout(self._dial_timeout):
                _, link = await asyncio.get_running_loop().create_connection(
                    lambda: self._track(Link(self, handshake, max_frame=self.max_frame)), host, port
                )
                await link.opened
        except (OSError, TimeoutError, ConnectionError, ProtocolError) as exc:
            self.stats.dial_failures += 1
            self._quiet_until[replica] = self.now() + REDIAL_AFTER
            self._pending.pop(replica, None)
            if link is not None and not link.closed:
                link.abort("dial failed")
            logger.warning(
                "link to %s at %s:%s failed: %r; its frames keep going through Redis",
                replica,
                host,
                port,
                exc,
                extra={"replica": self.replica_id},
            )
        finally:
            self._dialling.discard(replica)

    def _accept(self) -> wire.Accept:
        """A fresh challenge for each connection: a HELLO recorded on another one answers nothing."""
        return wire.Accept(self._key, self.replica_id, secrets.token_bytes(wire.NONCE_SIZE))

    def admit(self, link: Link) -> str | None:
        # descriptors are counted only for a connection the counts would take: a flood costs no listing each
        descriptors = self._descriptors() if self._gate.has_room(link.address) else None
        if (refusal := self._gate.refusal(link.address, descriptors)) is not None:
            self.stats.turned_away += 1
            return refusal
        self._handshaking.add(link)
        return None

    def _handshake_over(self, link: Link) -> None:
        if link in self._handshaking:
            self._handshaking.discard(link)
            self._gate.release(link.address)

    def _track(self, link: Link) -> Link:
        self._links.add(link)
        self._routes_of[link] = set()
        self._hinted[link] = set()
        return link

    # -- what links tell us ------------------------------------------------------

    def on_events(self, link: Link, events: list[Event]) -> None:
        for event in events:
            if link.closed:
                return
            if type(event) is Delivered:
                if not self._arrivals.from_link(link.state.receive_id, event.number):
                    self.stats.duplicates += 1  # its replay through Redis came first
                elif (message := self._decoded(link, event.channel, event.data)) is None:
                    continue  # counted: sent back, it would only come round again
                elif self._deliver(event.channel, message):
                    self.stats.received += 1
                else:
                    self._arrivals.sent_back(link.state.receive_id, event.number)
                    self.stats.nacked += 1
                    self._hinted[link].discard(event.channel)
                    link.send_back(event.channel, event.data)
            elif type(event) is Hinted:
                old = self._routes.get(event.channel)
                if old is not None and old is not link:
                    self._routes_of[old].discard(event.channel)
                self._routes[event.channel] = link
                self._routes_of[link].add(event.channel)
            elif type(event) is SentBack:
                if self._routes.get(event.channel) is link:
                    del self._routes[event.channel]
                self._routes_of[link].discard(event.channel)
                self._returned.put_nowait(Returned(event.channel, event.data, unacked=False))
            elif type(event) is Opened:
                self._opened(link, event.peer)

    def _decoded(self, link: Link, channel: str, data: bytes) -> Message | None:
        try:
            return replica_wire.decode(channel, data, linked=True)
        except ProtocolError as exc:
            self.stats.malformed += 1
            logger.warning(
                "dropped a frame from %s on %s: %s", link.peer, channel[:120], exc, extra={"replica": self.replica_id}
            )
            return None

    def _opened(self, link: Link, peer: str) -> None:
        self._handshake_over(link)
        self._arrivals.opened(link.state.receive_id)
        self._to[peer] = link
        hinted = self._hinted[link]
        for channel in (*self._pending.pop(peer, ()), *self._everywhere):
            if channel not in hinted:
                hinted.add(channel)
                link.hint(channel)

    def on_lost(self, link: Link) -> None:
        self._links.discard(link)
        self._handshake_over(link)
        if link.refused and not link.dialled:
            self.stats.refused += 1
            why = (link.reason or "").removeprefix("handshake refused: ")
            line = self._refusals.refused(self.now(), f"from {link.address}: {why}")
            if line is not None:
                logger.warning(line, extra={"replica": self.replica_id})
        if link.state.forged is not None:
            self.stats.forged += 1
        for channel in self._routes_of.pop(link, ()):
            if self._routes.get(channel) is link:
                del self._routes[channel]
        self._hinted.pop(link, None)
        if link.peer is not None and self._to.get(link.peer) is link:
            del self._to[link.peer]
        if link.peer is not None:
            self._arrivals.lost(link.state.receive_id, self.now())
        first = link.state.acked + 1  # the number of the first unacked frame
        unacked = link.take_unacked()
        if unacked:
            logger.warning(
                "link to %s lost with %d frame(s) unacked: sending them through Redis",
                link.peer,
                len(unacked),
                extra={"replica": self.replica_id},
            )
        for number, (channel, data) in enumerate(unacked, first):
            self._returned.put_nowait(Returned(channel, data, unacked=True, replay=(link.state.send_id, number)))

    def __repr__(self) -> str:
        return f"Links({self.origin or 'not listening'}, links={len(self._links)}, routes={len(self._routes)})"

"""Direct links between replicas: a client's frames skip Redis once its replica is known.

Routes are learned from traffic and verified by the receiver, so they need no
directory to keep consistent:

1. The first frame for a client's channel goes through Redis, tagged with the
   sender's ``replica@host:port``.
2. The replica that holds the channel dials the sender, answers its
   challenge (``protocol/link.py``: a HELLO good for that one connection to
   that one replica, a WELCOME back; both prove they hold a key derived from
   the hub's shared secret) and sends ``HINT channel``.
3. The sender writes later frames for that channel to the link (``DELIVER``).
4. A receiver that no longer has the channel (the client left or moved)
   sends the frame back (``NACK``); the sender forgets the route and
   publishes that frame through Redis, the source of truth.

A link that breaks, backs up or goes silent only sends traffic back to
Redis. The sender keeps every frame until the receiver acks it (acks ride
on the receiver's next write, or follow within ``ACK_DELAY``); frames a
dead link leaves unacked are published through Redis, so a cut link delays
them instead of losing them. A frame the receiver handled just before the
link died can thus arrive twice. Frames may overtake one another only while
a route changes (Redis path to link, or back).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass

from switchboard.backends.redis.link_socket import WRITE_HIGH_WATER, Link
from switchboard.clock import Clock
from switchboard.errors import ProtocolError
from switchboard.protocol import link as wire
from switchboard.tasks import cancel_and_wait, spawn

logger = logging.getLogger(__name__)

# After a failed dial, frames keep going through Redis for this long before
# dialling again: a replica whose link port is unreachable costs one attempt
# per interval, not one per frame.
REDIAL_AFTER = 5.0
# Each side writes something at least every HEARTBEAT s; a link silent for
# DEAD_AFTER s is dropped, so a blackholed link holds frames at most that
# time before its unacked frames go through Redis (as the pub/sub probe does).
HEARTBEAT = 1.0
DEAD_AFTER = 3.0
_MAX_PENDING_HINTS = 10_000  # per replica being dialled; the rest are re-learned from traffic
PING_FRAME = wire.encode(wire.PING, b"")


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


@dataclass
class LinkStats:
    direct: int = 0  # frames written to a link instead of Redis
    received: int = 0  # frames that arrived over a link and were delivered here
    nacked: int = 0  # frames sent back because their channel is no longer here
    dials: int = 0
    dial_failures: int = 0
    refused: int = 0  # accepted connections that failed the handshake (or never finished it)
    replayed: int = 0  # unacked frames of a lost link sent through Redis
    not_replayed: int = 0  # unacked frames of a lost link known to have arrived (answered)


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

    ``deliver(channel, data)`` hands a frame to this replica's subscriber and
    says whether there was one; ``on_nack(channel, data)`` gets a frame the
    other side refused, for the sender to publish through Redis instead.
    """

    def __init__(
        self,
        *,
        replica_id: str,
        settings: LinkSettings,
        clock: Clock,
        deliver: Callable[[str, bytes], bool],
        on_nack: Callable[[str, bytes], None],
        on_replay: Callable[[str, bytes], bool] | None = None,
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
        self._on_nack = on_nack
        self._on_replay = on_replay
        self._bind = (settings.host, settings.port)
        self._advertise = settings.advertise
        self._dial_timeout = settings.dial_timeout
        self._server: asyncio.Server | None = None
        self._links: set[Link] = set()
        self._to: dict[str, Link] = {}  # replica id -> the link hints to it go over
        self._routes: dict[str, Link] = {}  # channel -> the link its frames go over
        self._pending: dict[str, set[str]] = {}  # replica being dialled -> hints to send
        self._quiet_until: dict[str, float] = {}  # replica -> no dialling before (after a failure)
        self._dialling: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def now(self) -> float:
        return self._clock.monotonic()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: self._track(Link(self, self._accept())), *self._bind)
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

    def send(self, channel: str, data: bytes) -> bool:
        """Write ``data`` to the link ``channel`` was hinted on; ``False``: use Redis."""
        link = self._routes.get(channel)
        if link is None or link.closed or link.paused or link.unacked_bytes > WRITE_HIGH_WATER:
            return False
        link.unacked.append((channel, data))
        link.unacked_bytes += len(data)
        link.write(wire.deliver(channel, data))
        self.stats.direct += 1
        return True

    @property
    def route_count(self) -> int:
        """Channels with a learned route (routes of a lost link are forgotten with it)."""
        return len(self._routes)

    def route_of(self, channel: str) -> str | None:
        """The replica ``channel``'s frames go straight to, if any (for tests and status)."""
        link = self._routes.get(channel)
        return link.peer if link is not None and not link.closed else None

    # -- learning ----------------------------------------------------------------

    def heard(self, origin: str, channel: str) -> None:
        """A frame for our ``channel`` came through Redis from ``origin``: offer it a link."""
        parsed = wire.parse_origin(origin)
        if parsed is None or parsed[0] == self.replica_id:
            return
        replica, host, port = parsed
        link = self._to.get(replica)
        if link is not None and not link.closed:
            if channel not in link.hinted:
                link.hinted.add(channel)
                link.write(wire.hint(channel))
            return
        pending = self._pending.setdefault(replica, set())
        if len(pending) < _MAX_PENDING_HINTS:
            pending.add(channel)
        if replica not in self._dialling and self.now() >= self._quiet_until.get(replica, 0.0):
            self._dialling.add(replica)
            spawn(self._tasks, self._dial(replica, host, port), f"switchboard-link-dial-{replica}")

    async def _heartbeat_loop(self) -> None:
        while True:
            await self._clock.sleep(HEARTBEAT / 2)
            now = self.now()
            for link in list(self._links):
                if link.closed:
                    continue
                if link.peer is None and now - link.born > DEAD_AFTER:
                    self.refuse(link, f"no handshake within {DEAD_AFTER:g} s")
                elif now - link.last_rx > DEAD_AFTER:
                    link.abort(f"silent for {now - link.last_rx:.1f} s")
                elif link.peer is not None and now - link.last_tx >= HEARTBEAT and not link.writing:
                    link.write(PING_FRAME)

    def forget(self, channel: str) -> None:
        """``channel`` left this replica: hint it again if it comes back."""
        for link in self._to.values():
            link.hinted.discard(channel)
        for hints in self._pending.values():
            hints.discard(channel)

    async def _dial(self, replica: str, host: str, port: int) -> None:
        self.stats.dials += 1
        # the route named ``replica``: only it can answer a HELLO bound to its id
        handshake = wire.Dial(self._key, self.replica_id, replica, secrets.token_bytes(wire.NONCE_SIZE))
        link: Link | None = None
        try:
            async with asyncio.timeout(self._dial_timeout):
                _, link = await asyncio.get_running_loop().create_connection(
                    lambda: self._track(Link(self, handshake)), host, port
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

    def _track(self, link: Link) -> Link:
        self._links.add(link)
        return link

    # -- receiving ---------------------------------------------------------------

    def on_frame(self, link: Link, kind: int, body: bytes) -> None:
        if link.peer is None:
            self._authenticate(link, kind, body)
        elif kind == wire.DELIVER:
            channel, data = wire.split_channel(body)
            link.handled_one()
            if self._deliver(channel, data):
                self.stats.received += 1
            else:
                self.stats.nacked += 1
                link.hinted.discard(channel)
                link.write(wire.nack(channel, data))
        elif kind == wire.HINT:
            channel = body.decode("utf-8", "replace")
            old = self._routes.get(channel)
            if old is not None and old is not link:
                old.routes.discard(channel)
            self._routes[channel] = link
            link.routes.add(channel)
        elif kind == wire.ACK:
            link.acked(wire.ack_count(body))
        elif kind == wire.PING:
            pass  # its arrival was the point
        elif kind == wire.NACK:
            channel, data = wire.split_channel(body)
            if self._routes.get(channel) is link:
                del self._routes[channel]
            link.routes.discard(channel)
            self._on_nack(channel, data)
        else:
            raise ProtocolError(f"unexpected {wire.KINDS[kind]} on an open link")

    def _authenticate(self, link: Link, kind: int, body: bytes) -> None:
        reply, peer = link.handshake.step(kind, body)  # ProtocolError: refused
        if reply:
            link.write(reply)
        if peer is None:
            return
        link.authenticated(peer, self.max_frame)
        self._to[peer] = link
        for channel in self._pending.pop(peer, ()):
            link.hinted.add(channel)
            link.write(wire.hint(channel))

    def refuse(self, link: Link, reason: str) -> None:
        """``link`` failed its handshake: close it alone, and log it once (a dial that waits
        on it logs and counts it as a failed dial; an accepted one counts as ``refused``)."""
        if not link.dialled:
            self.stats.refused += 1
        link.abort(f"handshake refused: {reason}")

    def on_lost(self, link: Link) -> None:
        self._links.discard(link)
        for channel in link.routes:
            if self._routes.get(channel) is link:
                del self._routes[channel]
        link.routes.clear()
        if link.peer is not None and self._to.get(link.peer) is link:
            del self._to[link.peer]
        unacked = link.take_unacked()
        if unacked:
            logger.warning(
                "link to %s lost with %d frame(s) unacked: sending them through Redis",
                link.peer,
                len(unacked),
                extra={"replica": self.replica_id},
            )
        for channel, data in unacked:
            if self._on_replay is not None and not self._on_replay(channel, data):
                self.stats.not_replayed += 1
                continue
            self.stats.replayed += 1
            self._on_nack(channel, data)

    def __repr__(self) -> str:
        return f"Links({self.origin or 'not listening'}, links={len(self._links)}, routes={len(self._routes)})"

"""One direct link to another replica: a TCP connection carrying link frames both ways.

The first write of an event-loop turn goes out at once (a lone request pays
no wait) and the rest of the turn's writes go out together at its end (a busy
link pays one system call per turn, not per frame). DELIVERs stay in
``unacked`` until the other side's cumulative ACK, which rides on its next
write or follows within ``ACK_DELAY``. Routing, dialling and the handshake
live in :mod:`switchboard.backends.redis.links`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections import deque
from typing import TYPE_CHECKING

from switchboard.errors import ProtocolError
from switchboard.protocol import link as wire

if TYPE_CHECKING:
    from switchboard.backends.redis.links import Links

logger = logging.getLogger(__name__)

# A link whose unsent bytes exceed this stops taking frames until it drains:
# they go through Redis instead, so one slow replica never grows our memory.
WRITE_HIGH_WATER = 16 << 20
# A receiver with nothing to send acks after this long: bounds what a sender
# keeps, while acks of a request/reply exchange ride on the reply for free.
ACK_DELAY = 0.05


class Link(asyncio.Protocol):
    """One TCP connection to another replica, usable both ways once authenticated."""

    def __init__(self, owner: Links, handshake: wire.Accept | wire.Dial) -> None:
        self.owner = owner
        self.handshake = handshake  # pure: this class only carries its frames
        self.dialled = isinstance(handshake, wire.Dial)
        self.reason: str | None = None  # why we aborted it, for the dial waiting on it
        self.peer: str | None = None  # the other replica's id, once proven
        self.routes: set[str] = set()  # channels we send through this link
        self.hinted: set[str] = set()  # channels we told the other side live here
        self._loop = asyncio.get_running_loop()
        self.opened: asyncio.Future[None] = self._loop.create_future()
        self.closed = False
        self.paused = False
        self.born = self.last_rx = self.last_tx = owner.now()
        self.unacked: deque[tuple[str, bytes]] = deque()  # DELIVERs sent, not yet acked
        self.unacked_bytes = 0
        self.handled = 0  # DELIVERs received and handled (delivered or sent back)
        self._acked_out = 0
        self._acked_in = 0
        self._ack_timer: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None
        self._decoder = wire.Decoder(wire.HANDSHAKE_MAX_FRAME)  # raised once authenticated
        self._out: list[bytes] = []
        self._in_turn = False  # this event-loop turn has written already: batch the rest

    # -- asyncio.Protocol ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        with contextlib.suppress(OSError, AttributeError):
            transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)  # type: ignore[union-attr]
        if self.handshake.first:
            self.write(self.handshake.first)

    def data_received(self, data: bytes) -> None:
        self.last_rx = self.owner.now()
        try:
            for kind, body in self._decoder.feed(data):
                self.owner.on_frame(self, kind, body)
                if self.closed:
                    return
        except ProtocolError as exc:
            if self.peer is None:
                self.owner.refuse(self, str(exc))
            else:
                self.abort(str(exc))

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.opened.done():
            if not self.dialled:
                self.opened.cancel()  # accepted: nobody waits for it to open
            else:
                why = self.reason or repr(exc)
                self.opened.set_exception(ConnectionError(f"link closed before it opened: {why}"))
        self.owner.on_lost(self)

    def authenticated(self, peer: str, max_frame: int) -> None:
        """The other side proved it is ``peer``: full-size frames from now on."""
        self.peer = peer
        self._decoder.max_frame = max_frame
        if not self.opened.done():
            self.opened.set_result(None)

    def take_unacked(self) -> deque[tuple[str, bytes]]:
        """What a lost link sent but never had acked (for the sender to publish elsewhere)."""
        if self._ack_timer is not None:
            self._ack_timer.cancel()
        unacked, self.unacked, self.unacked_bytes = self.unacked, deque(), 0
        return unacked

    # -- writing ---------------------------------------------------------------

    @property
    def writing(self) -> bool:
        """Frames are queued for the end of this event-loop turn."""
        return bool(self._out)

    def write(self, frame: bytes) -> None:
        """Send ``frame``: at once if it is the turn's first, else with the rest at the turn's end."""
        self._out.append(frame)
        if not self._in_turn:
            self._in_turn = True
            self._loop.call_soon(self._end_turn)
            self._flush()

    def _end_turn(self) -> None:
        self._in_turn = False
        if self._out:
            self._flush()

    def handled_one(self) -> None:
        """One more DELIVER handled: ack it with the next write, or soon."""
        self.handled += 1
        if self._ack_timer is None and not self._out:
            self._ack_timer = self._loop.call_later(ACK_DELAY, self._flush)

    def acked(self, count: int) -> None:
        for _ in range(min(count - self._acked_in, len(self.unacked))):
            _, data = self.unacked.popleft()
            self.unacked_bytes -= len(data)
        self._acked_in = max(self._acked_in, count)

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        if self.handled > self._acked_out:
            out.append(wire.ack(self.handled))
            self._acked_out = self.handled
        if out and self._transport is not None and not self.closed:
            if len(out) == 1:
                self._transport.write(out[0])
            else:
                self._transport.writelines(out)
            self.last_tx = self.owner.now()

    def abort(self, reason: str | None = None) -> None:
        """Reset the connection; ``reason`` is logged once (none on a clean shutdown): here,
        or by the dial waiting for it to open."""
        if reason is not None:
            self.reason = reason
            if self.peer is not None or not self.dialled:
                logger.warning(
                    "link to %s dropped: %s",
                    self.peer or "unauthenticated peer",
                    reason,
                    extra={"replica": self.owner.replica_id},
                )
        self.closed = True
        if self._transport is not None:
            self._transport.abort()

    def __repr__(self) -> str:
        return f"<Link peer={self.peer} routes={len(self.routes)} closed={self.closed}>"

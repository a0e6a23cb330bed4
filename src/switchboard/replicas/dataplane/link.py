"""One direct link to another replica: the asyncio glue around a :class:`LinkState`.

This layer only moves bytes and keeps time: what the frames mean, when an
ack is due and when silence means death are the state machine's
(:mod:`switchboard.protocol.link.link_state`). The first write of an event-loop
turn goes out at once (a lone request pays no wait) and the rest of the
turn's writes go out together at its end (a busy link pays one system call
per turn, not per frame). The pool (:mod:`switchboard.replicas.dataplane.links`) sees a
link through its few public methods and hears from it through
:class:`LinkOwner`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections import deque
from typing import Protocol, cast

from switchboard.errors import ProtocolError
from switchboard.protocol.link import link_wire as wire
from switchboard.protocol.link.link_state import ACK_DELAY, WRITE_HIGH_WATER, Event, LinkState

logger = logging.getLogger(__name__)


class LinkOwner(Protocol):
    """What a link tells the pool that owns it."""

    replica_id: str

    def now(self) -> float: ...

    def admit(self, link: Link) -> str | None:
        """An accepted connection from ``link.address``: a reason turns it away unanswered."""
        ...

    def on_events(self, link: Link, events: list[Event]) -> None:
        """Frames that arrived, in order (the first :class:`Opened` included)."""
        ...

    def on_lost(self, link: Link) -> None:
        """The connection is gone (see :attr:`Link.refused`, :meth:`Link.take_unacked`)."""
        ...


class Link(asyncio.Protocol):
    """One TCP connection to another replica, usable both ways once authenticated."""

    def __init__(self, owner: LinkOwner, handshake: wire.Accept | wire.Dial, *, max_frame: int) -> None:
        self._owner = owner
        self.state = LinkState(handshake, now=owner.now(), max_frame=max_frame)
        self.reason: str | None = None  # why we aborted it, for the dial waiting on it
        self.refused = False  # it failed its handshake (or was turned away before it)
        self.address = ""  # the other end's IP address (accepted connections)
        self.closed = False
        self.paused = False
        self._loop = asyncio.get_running_loop()
        self.opened: asyncio.Future[None] = self._loop.create_future()
        self._ack_timer: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None
        self._in_turn = False  # this event-loop turn has written already: batch the rest

    @property
    def peer(self) -> str | None:
        return self.state.peer

    @property
    def dialled(self) -> bool:
        return self.state.dialled

    # -- asyncio.Protocol ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # cast, not isinstance: uvloop's transports implement asyncio.Transport without subclassing it
        self._transport = transport = cast(asyncio.Transport, transport)
        with contextlib.suppress(OSError, AttributeError):
            transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        if not self.state.dialled:
            peer = transport.get_extra_info("peername")
            self.address = str(peer[0]) if peer else "unknown"
            if (refusal := self._owner.admit(self)) is not None:
                self.refused = True
                self.reason = f"handshake refused: {refusal}"
                self.closed = True
                transport.abort()  # before its challenge: a flood costs no nonce, no deadline
                return
        if self.state.has_output:
            self._kick()

    def data_received(self, data: bytes) -> None:
        try:
            events = self.state.receive_data(data, self._owner.now())
        except ProtocolError as exc:
            self._fail(str(exc))
            return
        if events:
            if not self.opened.done() and self.state.peer is not None:
                self.opened.set_result(None)
            self._owner.on_events(self, events)
        if self.closed:
            return
        if self.state.has_output:
            self._kick()
        elif self.state.ack_pending and self._ack_timer is None:
            self._ack_timer = self._loop.call_later(ACK_DELAY, self._ack_due)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._ack_timer is not None:
            self._ack_timer.cancel()
        if not self.opened.done():
            if not self.state.dialled:
                self.opened.cancel()  # accepted: nobody waits for it to open
            else:
                why = self.reason or repr(exc)
                self.opened.set_exception(ConnectionError(f"link closed before it opened: {why}"))
        self._owner.on_lost(self)

    # -- what the pool does with it ----------------------------------------------

    def deliver(self, channel: str, data: bytes) -> bool:
        """Send a frame for ``channel``; ``False``: the link cannot take it now (use Redis)."""
        if self.closed or self.paused or not self.state.deliver(channel, data):
            return False
        if not self._in_turn:  # else it goes out with the rest at the turn's end
            self._kick()
        return True

    def hint(self, channel: str) -> None:
        self.state.hint(channel)
        self._kick()

    def send_back(self, channel: str, data: bytes) -> None:
        self.state.send_back(channel, data)
        self._kick()

    def tick(self, now: float) -> None:
        """The heartbeat's turn: a PING if we have been quiet, a drop if the link is dead."""
        if self.closed:
            return
        if (dead := self.state.tick(now)) is not None:
            self._fail(dead)
        elif self.state.has_output and not self._in_turn:
            self._kick()

    def take_unacked(self) -> deque[tuple[str, bytes]]:
        return self.state.take_unacked()

    # -- writing ---------------------------------------------------------------

    def _kick(self) -> None:
        """Write now if this is the turn's first write, else at the turn's end with the rest."""
        if not self._in_turn:
            self._in_turn = True
            self._loop.call_soon(self._end_turn)
            self._flush()

    def _end_turn(self) -> None:
        self._in_turn = False
        if self.state.has_output:
            self._flush()

    def _ack_due(self) -> None:
        """The ack timer: armed once per :data:`ACK_DELAY`, not per frame, and left running when
        the ack rides on a write (arming and cancelling one per frame cost more than the rest of
        a reply's ack), so a frame handled while it runs is acked sooner, never later."""
        self._ack_timer = None
        if self.state.ack_pending:
            self._flush()

    def _flush(self) -> None:
        if self._transport is None or self.closed:
            return
        out = self.state.data_to_send(self._owner.now())
        if len(out) == 1:
            self._transport.write(out[0])
        elif out:
            self._transport.writelines(out)

    def _fail(self, reason: str) -> None:
        if self.state.peer is None:
            self.refused = True
            reason = f"handshake refused: {reason}"
        self.abort(reason)

    def abort(self, reason: str | None = None) -> None:
        """Reset the connection; ``reason`` is logged once (none on a clean shutdown): here for
        an open link, by the dial waiting for it to open, or by the pool's count of refused
        handshakes (:class:`~switchboard.protocol.link.link_gate.RefusalLog`)."""
        if reason is not None:
            self.reason = reason
            if self.state.peer is not None:
                logger.warning(
                    "link to %s dropped: %s",
                    self.state.peer,
                    reason,
                    extra={"replica": self._owner.replica_id},
                )
        self.closed = True
        if self._transport is not None:
            self._transport.abort()

    def __repr__(self) -> str:
        return f"<Link peer={self.peer} closed={self.closed} {self.state!r}>"

"""One link's protocol state, without I/O: handshake, frames, acks and liveness.

The asyncio layer (:mod:`switchboard.replicas.dataplane.link`) feeds it the bytes it
read and the time, writes what :meth:`LinkState.data_to_send` hands out, and
drops the connection when :meth:`LinkState.tick` or a :class:`ProtocolError`
says so. Every decision about frames, acks and silence is made here, so
tests drive it synchronously (``tests/protocol/test_link_state.py``), as
``websockets`` drives its protocol.

* A sender keeps each DELIVER until the receiver's cumulative ``ACK n``: what
  a dead link leaves unacked is handed back (:meth:`take_unacked`) for Redis.
* A receiver's ack rides in every frame it sends (the ``acked`` number of its
  seal); with nothing to send it is due, as an ACK frame, within
  :data:`ACK_DELAY` (:attr:`ack_pending`).
* Each side writes at least every :data:`HEARTBEAT` (a PING when idle), and a
  link silent for :data:`DEAD_AFTER`, or not authenticated within it, is dead.
* Once the handshake is done, every frame each way is sealed (a sequence
  number and a MAC, :mod:`switchboard.protocol.link.link_seal`): one that fails
  is a :class:`ProtocolError` (:attr:`LinkState.forged` says why), which
  drops the link.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from switchboard.errors import ProtocolError
from switchboard.protocol.link import link_wire as wire
from switchboard.protocol.link.link_seal import OVERHEAD, Opener, Sealer

# Each side writes something at least every HEARTBEAT s; a link silent for
# DEAD_AFTER s is dropped, so a blackholed link holds frames at most that
# time before its unacked frames go through Redis (as the pub/sub probe does).
HEARTBEAT = 1.0
DEAD_AFTER = 3.0
# A receiver with nothing to send acks after this long: bounds what a sender
# keeps, while acks of a request/reply exchange ride on the reply for free.
ACK_DELAY = 0.05
# A link holding more unacked bytes than this takes no more frames until acks
# come: they go through Redis instead, so one slow replica never grows our memory.
WRITE_HIGH_WATER = 16 << 20


@dataclass(slots=True)
class Opened:
    """The other side proved it is ``peer``."""

    peer: str


@dataclass(slots=True)
class Delivered:
    """A frame for our ``channel``: hand it to its subscriber, or :meth:`LinkState.send_back` it.

    ``number``: its place among the DELIVERs of this direction (1, 2, ...), as a replay
    of it through Redis would name it (``protocol/link/link_arrivals.py``).
    """

    channel: str
    data: bytes
    number: int = field(default=0, compare=False)


@dataclass(slots=True)
class Hinted:
    """The other side holds ``channel``: its frames may go straight there."""

    channel: str


@dataclass(slots=True)
class SentBack:
    """A frame we delivered whose channel the other side no longer holds."""

    channel: str
    data: bytes


Event = Opened | Delivered | Hinted | SentBack


class LinkState:
    """Both directions of one link; ``now`` is always the caller's monotonic clock."""

    def __init__(self, handshake: wire.Accept | wire.Dial, *, now: float, max_frame: int) -> None:
        self.handshake = handshake
        self.dialled = isinstance(handshake, wire.Dial)
        self.peer: str | None = None  # the other replica's id, once proven
        self.send_id = self.receive_id = ""  # each direction's id (link_wire.direction_id), once proven
        self.born = self.last_rx = self.last_tx = now
        self.unacked: deque[tuple[str, bytes]] = deque()  # DELIVERs sent, not yet acked
        self.unacked_bytes = 0
        self.handled = 0  # DELIVERs received (delivered here or sent back)
        self._max_frame = max_frame
        self._decoder = wire.Decoder(wire.HANDSHAKE_MAX_FRAME)  # raised once authenticated
        self._out: list[bytes] = [handshake.first] if handshake.first else []
        self._acked_out = 0
        self._acked_in = 0
        self._sealer: Sealer | None = None  # both set once the handshake is done
        self._opener: Opener | None = None
        self.forged: str | None = None  # why a frame failed its seal (the link is then dropped)

    # -- bytes in --------------------------------------------------------------

    def receive_data(self, data: bytes, now: float) -> list[Event]:
        """What ``data`` completes; :class:`ProtocolError`: drop the link (refused if not yet open)."""
        self.last_rx = now
        events: list[Event] = []
        for kind, frame in self._decoder.feed(data):
            if self._opener is None:
                reply, peer = self.handshake.step(kind, frame)
                if reply:
                    self._out.append(reply)  # the last frame not sealed
                if peer is not None:
                    self._opened(peer)
                    events.append(Opened(peer))
                continue
            try:
                acked, body = self._opener.open(kind, frame)
            except ProtocolError as exc:
                self.forged = str(exc)
                raise
            if acked > self._acked_in:
                self._acked(acked)
            if kind == wire.DELIVER:
                self.handled += 1
                events.append(Delivered(*wire.split_channel(body), self.handled))
            elif kind == wire.HINT:
                events.append(Hinted(str(body, "utf-8", "replace")))
            elif kind == wire.NACK:
                events.append(SentBack(*wire.split_channel(body)))
            elif kind not in (wire.PING, wire.ACK):  # their numbers, and their arrival, were the point
                raise ProtocolError(f"unexpected {wire.KINDS[kind]} on an open link")
        return events

    def _opened(self, peer: str) -> None:
        keys = self.handshake.keys
        assert keys is not None  # a handshake that names the peer has made the keys
        self.peer = peer
        self._sealer, self._opener = Sealer(keys[0]), Opener(keys[1])
        self.send_id, self.receive_id = wire.direction_id(keys[0]), wire.direction_id(keys[1])
        self._decoder.max_frame = self._max_frame + OVERHEAD

    def _seal(self, kind: int, start: bytes = b"", data: bytes = b"") -> bytes:
        """``kind`` sealed, with the ack of every DELIVER handled so far in it."""
        if self._sealer is None:
            raise ProtocolError(f"{wire.KINDS[kind]} before the link was authenticated")
        self._acked_out = self.handled
        return self._sealer.seal(kind, self.handled, start, data)

    def _acked(self, count: int) -> None:
        for _ in range(min(count - self._acked_in, len(self.unacked))):
            _, data = self.unacked.popleft()
            self.unacked_bytes -= len(data)
        self._acked_in = count

    # -- frames out ------------------------------------------------------------

    def deliver(self, channel: str, data: bytes) -> bool:
        """Queue ``data`` for ``channel``, kept until acked; ``False``: too much unacked already."""
        if self.unacked_bytes > WRITE_HIGH_WATER:
            return False
        frame = self._seal(wire.DELIVER, wire.channel_head(channel), data)
        self.unacked.append((channel, data))
        self.unacked_bytes += len(data)
        self._out.append(frame)
        return True

    def hint(self, channel: str) -> None:
        self._out.append(self._seal(wire.HINT, channel.encode()))

    def send_back(self, channel: str, data: bytes) -> None:
        """Return a delivered frame whose channel is not here (NACK)."""
        self._out.append(self._seal(wire.NACK, wire.channel_head(channel), data))

    @property
    def has_output(self) -> bool:
        return bool(self._out)

    @property
    def ack_pending(self) -> bool:
        """Frames were handled and not acked yet: the next frame sent acks them; with none, an
        ACK frame after :data:`ACK_DELAY`."""
        return self.handled > self._acked_out

    def data_to_send(self, now: float) -> list[bytes]:
        """Every frame queued, and an ACK frame if they do not ack all that was handled; the
        caller writes them now."""
        out, self._out = self._out, []
        if self.handled > self._acked_out:
            out.append(self._seal(wire.ACK))
        if out:
            self.last_tx = now
        return out

    @property
    def acked(self) -> int:
        """DELIVERs the other side has acked: the first of :attr:`unacked` is number ``acked + 1``."""
        return self._acked_in

    def take_unacked(self) -> deque[tuple[str, bytes]]:
        """What was sent and never acked (the link is gone: for the sender to publish elsewhere)."""
        unacked, self.unacked, self.unacked_bytes = self.unacked, deque(), 0
        return unacked

    # -- liveness --------------------------------------------------------------

    def tick(self, now: float) -> str | None:
        """Why the link is dead (drop it), or ``None``; queues a PING when we have been quiet."""
        if self.peer is None:
            if now - self.born > DEAD_AFTER:
                return f"no handshake within {DEAD_AFTER:g} s"
            return None
        if now - self.last_rx > DEAD_AFTER:
            return f"silent for {now - self.last_rx:.1f} s"
        if now - self.last_tx >= HEARTBEAT and not self._out:
            self._out.append(self._seal(wire.PING))
        return None

    def __repr__(self) -> str:
        return f"<LinkState peer={self.peer} unacked={len(self.unacked)} handled={self.handled}>"

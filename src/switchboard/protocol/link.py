"""Frames on a direct link between two replicas, and how a link proves who opened it.

A replica that holds a client's channel tells the replicas sending to it
(``HINT``); they then write the client's frames straight to it (``DELIVER``)
instead of through Redis, which saves the Redis hop and its CPU on every
frame. A frame the receiver no longer has a subscriber for comes back
(``NACK``) so the sender can fall back to Redis. Each side sends ``PING``
when it has sent nothing else for a while, so silence means a dead link.
``ACK n`` says the first ``n`` DELIVERs were handled; the sender keeps the
rest, and sends them through Redis if the link dies before they are acked. Pure functions and a
byte-stream decoder here; the sockets live in ``backends/redis/links.py``.

Wire: ``u32 length | u8 kind | body``; the length counts kind and body.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
from dataclasses import dataclass

from switchboard.errors import ProtocolError

HELLO, WELCOME, DELIVER, HINT, NACK, PING, ACK = range(1, 8)
KINDS = {
    HELLO: "HELLO",
    WELCOME: "WELCOME",
    DELIVER: "DELIVER",
    HINT: "HINT",
    NACK: "NACK",
    PING: "PING",
    ACK: "ACK",
}

# Frames before the handshake is done are HELLO/WELCOME only: small, so an
# unauthenticated connection cannot make a replica buffer much.
HANDSHAKE_MAX_FRAME = 4096
# A HELLO older or newer than this (wall clock) is refused: a captured one cannot be replayed later.
HELLO_MAX_SKEW = 60.0

_HEAD = struct.Struct(">IB")
_CHAN = struct.Struct(">H")
_COUNT = struct.Struct(">Q")


def encode(kind: int, body: bytes) -> bytes:
    return _HEAD.pack(len(body) + 1, kind) + body


def deliver(channel: str, data: bytes) -> bytes:
    """``DELIVER`` (or, with ``kind=NACK``, the same layout sent back)."""
    return _channel_frame(DELIVER, channel, data)


def nack(channel: str, data: bytes) -> bytes:
    return _channel_frame(NACK, channel, data)


def ack(count: int) -> bytes:
    return encode(ACK, _COUNT.pack(count))


def ack_count(body: bytes) -> int:
    if len(body) != _COUNT.size:
        raise ProtocolError("link ACK must carry one 8-byte count")
    return _COUNT.unpack(body)[0]


def hint(channel: str) -> bytes:
    return encode(HINT, channel.encode())


def _channel_frame(kind: int, channel: str, data: bytes) -> bytes:
    name = channel.encode()
    if len(name) > 0xFFFF:
        raise ProtocolError(f"channel name too long for a link frame ({len(name)} bytes)")
    return b"".join(
        (_HEAD.pack(len(data) + len(name) + 3, kind), _CHAN.pack(len(name)), name, data)
    )


def split_channel(body: bytes) -> tuple[str, bytes]:
    """``(channel, data)`` of a ``DELIVER`` or ``NACK`` body."""
    if len(body) < 2:
        raise ProtocolError("link frame too short for a channel")
    (n,) = _CHAN.unpack_from(body)
    if len(body) < 2 + n:
        raise ProtocolError("link frame shorter than its channel name")
    try:
        return body[2 : 2 + n].decode(), body[2 + n :]
    except UnicodeDecodeError:
        raise ProtocolError("link channel name is not UTF-8") from None


class Decoder:
    """Bytes in, ``(kind, body)`` frames out; refuses frames above ``max_frame``."""

    def __init__(self, max_frame: int) -> None:
        self._buf = bytearray()
        self.max_frame = max_frame

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buf += data
        out: list[tuple[int, bytes]] = []
        pos = 0
        buf = self._buf
        while len(buf) - pos >= _HEAD.size:
            size, kind = _HEAD.unpack_from(buf, pos)
            if size < 1 or size > self.max_frame:
                raise ProtocolError(f"link frame of {size} bytes (at most {self.max_frame})")
            end = pos + 4 + size
            if len(buf) < end:
                break
            if kind not in KINDS:
                raise ProtocolError(f"unknown link frame kind {kind}")
            out.append((kind, bytes(buf[pos + 5 : end])))
            pos = end
        if pos:
            del buf[:pos]
        return out


# -- proving who is on the other end ------------------------------------------


@dataclass(frozen=True)
class Hello:
    replica: str
    ts: float
    nonce: str
    mac: str


def _mac(secret: str, *parts: str) -> str:
    msg = "|".join(("switchboard-link", *parts)).encode()
    return hmac.new(secret.encode(), msg, hashlib.sha256).hexdigest()


def hello(secret: str, replica: str, ts: float, nonce: str) -> bytes:
    """The first frame of the replica that dials: its id, signed with the shared secret."""
    mac = _mac(secret, "hello", replica, repr(ts), nonce)
    return encode(
        HELLO, json.dumps({"replica": replica, "ts": ts, "nonce": nonce, "mac": mac}).encode()
    )


def check_hello(secret: str, body: bytes, now: float) -> Hello:
    """The dialling replica's id, or :class:`ProtocolError` if it does not hold the secret."""
    try:
        raw = json.loads(body)
        h = Hello(str(raw["replica"]), float(raw["ts"]), str(raw["nonce"]), str(raw["mac"]))
    except (ValueError, KeyError, TypeError):
        raise ProtocolError("malformed link HELLO") from None
    if abs(now - h.ts) > HELLO_MAX_SKEW:
        raise ProtocolError(f"link HELLO is {now - h.ts:+.0f} s off this replica's clock")
    if not hmac.compare_digest(h.mac, _mac(secret, "hello", h.replica, repr(h.ts), h.nonce)):
        raise ProtocolError("link HELLO not signed with this hub's secret")
    return h


def welcome(secret: str, replica: str, nonce: str) -> bytes:
    """The answer: the accepting replica's id, bound to the dialler's nonce."""
    return encode(
        WELCOME,
        json.dumps({"replica": replica, "mac": _mac(secret, "welcome", replica, nonce)}).encode(),
    )


def check_welcome(secret: str, body: bytes, nonce: str) -> str:
    try:
        raw = json.loads(body)
        replica, mac = str(raw["replica"]), str(raw["mac"])
    except (ValueError, KeyError, TypeError):
        raise ProtocolError("malformed link WELCOME") from None
    if not hmac.compare_digest(mac, _mac(secret, "welcome", replica, nonce)):
        raise ProtocolError("link WELCOME not signed with this hub's secret")
    return replica


# -- the origin tag on Redis messages -------------------------------------------


def tag(origin: str, data: bytes) -> bytes:
    """Prefix a unicast message sent through Redis with ``replica@host:port`` of its sender."""
    name = origin.encode()
    if len(name) > 255:
        raise ProtocolError("link origin too long")
    return bytes((len(name),)) + name + data


def untag(data: bytes) -> tuple[str, bytes]:
    if not data:
        raise ProtocolError("empty unicast message")
    n = data[0]
    if len(data) < 1 + n:
        raise ProtocolError("unicast message shorter than its origin tag")
    return data[1 : 1 + n].decode("utf-8", "replace"), data[1 + n :]


def parse_origin(origin: str) -> tuple[str, str, int] | None:
    """``(replica, host, port)`` of ``replica@host:port``; ``None`` if it has no link."""
    replica, at, addr = origin.rpartition("@")
    host, colon, port = addr.rpartition(":")
    if not at or not colon or not port.isdigit() or not replica:
        return None
    return replica, host.strip("[]"), int(port)

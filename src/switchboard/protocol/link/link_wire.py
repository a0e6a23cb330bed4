"""Frames on a direct link between two replicas, and how a link proves who opened it.

A replica that holds a client's channel tells the replicas sending to it
(``HINT``); they then write the client's frames straight to it (``DELIVER``)
instead of through Redis, which saves the Redis hop and its CPU on every
frame. A frame the receiver no longer has a subscriber for comes back
(``NACK``) so the sender can fall back to Redis. Each side sends ``PING``
when it has sent nothing else for a while, so silence means a dead link.
Every frame says how many DELIVERs its sender has handled (an ``ACK`` says
only that); the other side keeps the rest, and sends them through Redis if
the link dies before they are acked. Pure functions and a
byte-stream decoder here; every frame after the handshake sealed with a sequence number and a
MAC in ``protocol/link/link_seal.py``; one link's state (acks, heartbeat) in ``protocol/link/link_state.py``,
who may start a handshake in ``protocol/link/link_gate.py``, its socket in ``replicas/dataplane/link.py``, the
pool in ``replicas/dataplane/links.py``.

Wire: ``u32 length | u8 kind | body``; the length counts kind and body. After the handshake
the body is ``u64 sequence | u64 acked | body | 16-byte MAC`` (``link_seal``).
"""

from __future__ import annotations

import hmac
import struct

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from switchboard.errors import ProtocolError

HELLO, WELCOME, DELIVER, HINT, NACK, PING, ACK, CHALLENGE = range(1, 9)
KINDS = {
    HELLO: "HELLO",
    WELCOME: "WELCOME",
    DELIVER: "DELIVER",
    HINT: "HINT",
    NACK: "NACK",
    PING: "PING",
    ACK: "ACK",
    CHALLENGE: "CHALLENGE",
}

# Frames before the handshake is done are CHALLENGE/HELLO/WELCOME only: small,
# so an unauthenticated connection cannot make a replica buffer much.
HANDSHAKE_MAX_FRAME = 4096

_HEAD = struct.Struct(">IB")
_CHAN = struct.Struct(">H")


def encode(kind: int, body: bytes) -> bytes:
    return _HEAD.pack(len(body) + 1, kind) + body


def deliver(channel: str, data: bytes) -> bytes:
    """A ``DELIVER`` frame, unsealed: its layout (an open link sends it sealed, ``link_seal``)."""
    return _channel_frame(DELIVER, channel, data)


def nack(channel: str, data: bytes) -> bytes:
    return _channel_frame(NACK, channel, data)


def hint(channel: str) -> bytes:
    return encode(HINT, channel.encode())


def channel_head(channel: str) -> bytes:
    """The start of a ``DELIVER`` or ``NACK`` body: the channel's name, its length first."""
    name = channel.encode()
    if len(name) > 0xFFFF:
        raise ProtocolError(f"channel name too long for a link frame ({len(name)} bytes)")
    return _CHAN.pack(len(name)) + name


def _channel_frame(kind: int, channel: str, data: bytes) -> bytes:
    head = channel_head(channel)
    return b"".join((_HEAD.pack(len(data) + len(head) + 1, kind), head, data))


def split_channel(body: bytes | memoryview) -> tuple[str, bytes]:
    """``(channel, data)`` of a ``DELIVER`` or ``NACK`` body."""
    if len(body) < 2:
        raise ProtocolError("link frame too short for a channel")
    (n,) = _CHAN.unpack_from(body)
    if len(body) < 2 + n:
        raise ProtocolError("link frame shorter than its channel name")
    try:
        return str(body[2 : 2 + n], "utf-8"), bytes(body[2 + n :])
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
#
# The listener speaks first: CHALLENGE carries a fresh random nonce. The
# dialler answers HELLO: its id, a nonce of its own, and an HMAC over the
# transcript (both nonces, both ids). The listener answers WELCOME: an HMAC
# over the same transcript under another label. So a HELLO is good for the
# one connection whose challenge it answers, at the one replica it names, and
# the WELCOME shows the dialler that the listener holds the key too. The key
# is derived from the hub's secret, so link MACs never use the JWT key itself.
# Each side then derives, from the same transcript under two more labels, the
# keys that seal the frames of this link in each direction (never sent): a
# frame sealed on one link, or in one direction, opens on no other.

# v3: frames after the handshake are sealed (``link_seal``). A replica of another version
# derives another key, so its handshake fails (and its frames go through Redis) rather than
# opening a link whose frames the other side would take for forged.
KEY_INFO = b"switchboard link v3"
NONCE_SIZE = 32
_MAC_SIZE = 32
_LEN = struct.Struct(">I")


def hkdf_sha256(ikm: bytes, info: bytes, length: int = 32, salt: bytes = b"") -> bytes:
    """HKDF-SHA256 (RFC 5869): a key for one purpose out of a secret shared with others.

    ``cryptography``'s, so no hand-written KDF; no salt means RFC 5869's (32 zero bytes), the
    same bytes as the hand-written one it replaced, so replicas of both agree on link keys.
    """
    return HKDF(hashes.SHA256(), length, salt or None, info).derive(ikm)


def link_key(secret: str) -> bytes:
    """The key links sign with, derived from the hub's shared secret."""
    return hkdf_sha256(secret.encode(), KEY_INFO)


def _mac(
    key: bytes,
    role: bytes,
    listener_nonce: bytes,
    dialler: str,
    listener: str,
    dialler_nonce: bytes,
) -> bytes:
    parts = (KEY_INFO, role, listener_nonce, dialler.encode(), listener.encode(), dialler_nonce)
    # length-prefixed, so no two different transcripts are the same bytes
    return hmac.digest(key, b"".join(_LEN.pack(len(p)) + p for p in parts), "sha256")


def session_keys(
    key: bytes, listener_nonce: bytes, dialler: str, listener: str, dialler_nonce: bytes
) -> tuple[bytes, bytes]:
    """``(dialler -> listener, listener -> dialler)``: the keys that seal this link's frames."""
    up = _mac(key, b"dialler to listener", listener_nonce, dialler, listener, dialler_nonce)
    down = _mac(key, b"listener to dialler", listener_nonce, dialler, listener, dialler_nonce)
    return up, down


def direction_id(key: bytes) -> str:
    """The id of one direction of a link, from the key that seals it: both ends know it, nobody else.

    A frame of that direction replayed through Redis carries it with the frame's number
    (:func:`~switchboard.protocol.link.replica_wire.tag`), so the receiver can tell a frame the link delivered already
    (``protocol/link/link_arrivals.py``).
    """
    return hmac.digest(key, b"direction id", "sha256")[:12].hex()


def challenge(nonce: bytes) -> bytes:
    """The listener's first frame: the nonce the dialler's HELLO must answer."""
    if len(nonce) != NONCE_SIZE:
        raise ValueError(f"a link nonce is {NONCE_SIZE} bytes")
    return encode(CHALLENGE, nonce)


def hello(key: bytes, listener_nonce: bytes, dialler: str, listener: str, dialler_nonce: bytes) -> bytes:
    """The dialler's answer: its id and nonce, signed over the whole transcript."""
    mac = _mac(key, b"hello", listener_nonce, dialler, listener, dialler_nonce)
    return encode(HELLO, dialler_nonce + mac + dialler.encode())


def check_hello(key: bytes, body: bytes, listener: str, listener_nonce: bytes) -> tuple[str, bytes]:
    """``(dialler id, dialler nonce)``, or :class:`ProtocolError` unless it answers this challenge."""
    nonce, mac, name = (
        body[:NONCE_SIZE],
        body[NONCE_SIZE : NONCE_SIZE + _MAC_SIZE],
        body[NONCE_SIZE + _MAC_SIZE :],
    )
    try:
        dialler = name.decode()
    except UnicodeDecodeError:
        dialler = ""
    if not dialler:
        raise ProtocolError("malformed link HELLO")
    if not hmac.compare_digest(mac, _mac(key, b"hello", listener_nonce, dialler, listener, nonce)):
        raise ProtocolError("link HELLO does not answer this connection's challenge with this hub's key")
    return dialler, nonce


def welcome(key: bytes, listener_nonce: bytes, dialler: str, listener: str, dialler_nonce: bytes) -> bytes:
    """The listener's proof, over the same transcript: it holds the key too."""
    return encode(WELCOME, _mac(key, b"welcome", listener_nonce, dialler, listener, dialler_nonce))


def check_welcome(
    key: bytes,
    body: bytes,
    listener_nonce: bytes,
    dialler: str,
    listener: str,
    dialler_nonce: bytes,
) -> None:
    if not hmac.compare_digest(body, _mac(key, b"welcome", listener_nonce, dialler, listener, dialler_nonce)):
        raise ProtocolError(f"link WELCOME not signed by {listener} with this hub's key for this dial")


def _early(kind: int) -> ProtocolError:
    return ProtocolError(f"{KINDS.get(kind, kind)} before the link was authenticated")


class Accept:
    """The listener's side of one handshake: its challenge, then the one HELLO that answers it."""

    def __init__(self, key: bytes, replica: str, nonce: bytes) -> None:
        self.first = challenge(nonce)  # sent as soon as the connection is made
        self._key, self._replica, self._nonce = key, replica, nonce
        self._spent = False
        self.keys: tuple[bytes, bytes] | None = None  # (to send with, to receive with), once proven

    def step(self, kind: int, body: bytes) -> tuple[bytes, str | None]:
        """``(frame to send, the dialler's id once proven)``; :class:`ProtocolError` refuses."""
        if kind != HELLO or self._spent:
            raise _early(kind)
        self._spent = True  # one try per challenge
        dialler, nonce = check_hello(self._key, body, self._replica, self._nonce)
        up, down = session_keys(self._key, self._nonce, dialler, self._replica, nonce)
        self.keys = (down, up)
        return welcome(self._key, self._nonce, dialler, self._replica, nonce), dialler


class Dial:
    """The dialler's side: answer ``listener``'s challenge (the route named it), check its WELCOME."""

    def __init__(self, key: bytes, replica: str, listener: str, nonce: bytes) -> None:
        self.first = b""  # the listener speaks first
        self._key, self._replica, self._listener, self._nonce = key, replica, listener, nonce
        self._challenge: bytes | None = None
        self._done = False
        self.keys: tuple[bytes, bytes] | None = None  # (to send with, to receive with), once proven

    def step(self, kind: int, body: bytes) -> tuple[bytes, str | None]:
        """``(frame to send, the listener's id once proven)``; :class:`ProtocolError` refuses."""
        if self._done:
            raise _early(kind)
        if kind == CHALLENGE and self._challenge is None:
            if len(body) != NONCE_SIZE:
                raise ProtocolError("malformed link CHALLENGE")
            self._challenge = body
            return hello(self._key, body, self._replica, self._listener, self._nonce), None
        if kind == WELCOME and self._challenge is not None:
            self._done = True
            check_welcome(self._key, body, self._challenge, self._replica, self._listener, self._nonce)
            self.keys = session_keys(self._key, self._challenge, self._replica, self._listener, self._nonce)
            return b"", self._listener
        raise _early(kind)


# -- the origin a message through Redis carries (protocol/link/replica_wire.py) ------------------------


def parse_origin(origin: str) -> tuple[str, str, int] | None:
    """``(replica, host, port)`` of ``replica@host:port``; ``None`` if it has no link."""
    replica, at, addr = origin.rpartition("@")
    host, colon, port = addr.rpartition(":")
    if not at or not colon or not port.isdigit() or not replica:
        return None
    return replica, host.strip("[]"), int(port)

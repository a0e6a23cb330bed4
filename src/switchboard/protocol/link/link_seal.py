"""Every frame of an open link carries a sequence number and a MAC, so nothing on the path can
inject, alter, drop, reorder or replay one.

The handshake (:mod:`switchboard.protocol.link.link_wire`) proves who is on each end;
after it, a host on the path of the TCP connection could still write frames
into it (a ``DELIVER`` stamped with any user's identity, to any client of the
receiving replica). So each direction of a link has its own key, derived
from the handshake's transcript (both nonces, both replica ids) under the
key derived from the hub's secret, and each frame is sealed under it::

    u32 length | u8 kind | u64 sequence | u64 acked | body | MAC

where the MAC (keyed BLAKE2b, 16 bytes) covers everything before it and the
sequence number counts the frames of that direction from 0. ``acked`` is the
sender's cumulative ack of the DELIVERs it has handled (``protocol/link/link_state.py``):
riding in every frame, it saves a separately sealed ACK frame per reply. The receiver
checks the MAC, then that the number is exactly the next one: a frame made
up, changed, taken from another link or from the other direction fails the
MAC; one sent again, held back or left out fails the number. Either is a
:class:`ProtocolError`, and the link is dropped (its unacked frames go
through Redis).

BLAKE2b with a key is a MAC by design (no HMAC construction needed) and,
with the keyed state made once per link and copied per frame, costs about a
microsecond for a small frame: two frames per call and its reply (the acks
ride in them), well within the budget of a cross-replica call (``bench/ab.py``).
"""

from __future__ import annotations

import hashlib
import hmac
import struct

from switchboard.errors import ProtocolError

TAG_SIZE = 16
_NUMBERS = struct.Struct(">QQ")  # sequence, acked: the start of a sealed body
_HEAD = struct.Struct(">IB")  # as in protocol/link/link_wire.py: length (kind and body), kind
_SEALED_HEAD = struct.Struct(">IBQQ")  # both, and the numbers
OVERHEAD = _NUMBERS.size + TAG_SIZE  # what sealing adds to a frame's body


class Sealer:
    """The sending side of one direction: numbers and signs each frame, in the order they are made."""

    __slots__ = ("_mac", "seq")

    def __init__(self, key: bytes) -> None:
        self._mac = hashlib.blake2b(key=key, digest_size=TAG_SIZE)
        self.seq = 0  # the number of the next frame

    def seal(self, kind: int, acked: int, start: bytes = b"", data: bytes = b"") -> bytes:
        """The frame of ``kind`` whose body is ``start + data``, sealed; frames go out in this order.

        (Two parts, not one, so a large ``data`` is never copied to be signed.)"""
        head = _SEALED_HEAD.pack(len(start) + len(data) + 1 + OVERHEAD, kind, self.seq, acked) + start
        self.seq += 1
        mac = self._mac.copy()
        mac.update(head)
        if data:
            mac.update(data)
            return b"".join((head, data, mac.digest()))
        return head + mac.digest()


class Opener:
    """The receiving side of one direction: a frame's body if its MAC and number are right."""

    __slots__ = ("_mac", "seq")

    def __init__(self, key: bytes) -> None:
        self._mac = hashlib.blake2b(key=key, digest_size=TAG_SIZE)
        self.seq = 0  # the number the next frame must carry

    def open(self, kind: int, body: bytes) -> tuple[int, memoryview]:
        """``(acked, body)`` of a sealed frame of ``kind``; :class:`ProtocolError` if it is not the
        next frame the other side sealed."""
        if len(body) < OVERHEAD:
            raise ProtocolError(f"link frame {self.seq} too short to be sealed: injected on the way")
        view = memoryview(body)
        mac = self._mac.copy()
        mac.update(_HEAD.pack(len(body) + 1, kind))
        mac.update(view[:-TAG_SIZE])
        if not hmac.compare_digest(mac.digest(), body[-TAG_SIZE:]):
            raise ProtocolError(f"link frame {self.seq} failed its MAC: injected or altered on the way")
        seq, acked = _NUMBERS.unpack_from(body)
        if seq != self.seq:
            raise ProtocolError(f"link frame numbered {seq} where {self.seq} was due: replayed, dropped or reordered")
        self.seq += 1
        return acked, view[_NUMBERS.size : -TAG_SIZE]

"""The few WebSocket frames the hub writes or reads itself, beside websockets' own (RFC 6455 §5).

The hub writes its data frames' headers itself (:func:`data_frame`, see
:meth:`~switchboard.server.ws.ws_protocol.HubWebSocketProtocol.send_now`) and
reads back the close frame websockets wrote when it failed a connection
(:func:`close_in`), for the code and reason the app is told.
"""

from __future__ import annotations

import struct

from websockets.frames import Close

# A frame's first byte: the FIN bit and the opcode (RFC 6455 §5.2).
TEXT = 0x81
BINARY = 0x82
CLOSE = 0x88

_SHORT = struct.Struct(">BB")
_MEDIUM = struct.Struct(">BBH")
_LONG = struct.Struct(">BBQ")


def data_frame(first: int, payload: bytes) -> bytes:
    """One unmasked, unfragmented frame; ``first`` is :data:`TEXT` or :data:`BINARY`."""
    size = len(payload)
    if size < 126:
        return _SHORT.pack(first, size) + payload
    if size < 65536:
        return _MEDIUM.pack(first, 126, size) + payload
    return _LONG.pack(first, 127, size) + payload


def close_in(writes: list[bytes]) -> Close | None:
    """The close frame among what websockets wrote, if any (a server's frames are unmasked and a
    close frame's payload fits the 7-bit length: RFC 6455 §5.5)."""
    for data in writes:
        if len(data) >= 2 and data[0] == CLOSE:
            return Close.parse(data[2 : 2 + (data[1] & 0x7F)])
    return None

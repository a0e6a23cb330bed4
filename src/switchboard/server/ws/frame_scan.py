"""Where a client's WebSocket byte stream stands, read from the frame headers alone.

The server must know whether a client is in the middle of a message (a frame
partly received, or a fragmented message not finished) to bound how long it
may take, and the ``websockets`` sans-I/O connection documents no way to ask.
RFC 6455 §5.2 framing tells it from the bytes: :class:`FrameScanner` reads
each frame's header and skips its payload by length, holding at most one
unfinished header (14 bytes), never the payload.
"""

from __future__ import annotations

_FIN = 0x80
_CONTROL = 0x08  # opcodes 0x8-0xF: close, ping, pong; they never fragment a message


class FrameScanner:
    """Feed it every byte the client sends after its opening handshake, in order."""

    __slots__ = ("_b0", "_fragmented", "_head", "_in_frame", "_left", "messages")

    def __init__(self) -> None:
        self._head = b""  # a header received in part
        self._in_frame = False  # a header is in, and its payload has not all come
        self._left = 0  # payload bytes of that frame still to come
        self._b0 = 0  # that frame's first byte: FIN and opcode
        self._fragmented = False  # a data frame without FIN came; its message is open
        #: Frames after which the stream was between messages: changes when a message ends.
        self.messages = 0

    @property
    def busy(self) -> bool:
        """Whether the bytes so far end inside a frame or inside a fragmented message."""
        return self._in_frame or bool(self._head) or self._fragmented

    def feed(self, data: bytes) -> None:
        # Locals, written back once: this runs for every read of every client.
        n, i = len(data), 0
        head, in_frame, left, b0 = self._head, self._in_frame, self._left, self._b0
        fragmented, messages = self._fragmented, self.messages
        while True:
            if in_frame:
                if left > n - i:
                    left -= n - i
                    break
                i += left
                left, in_frame = 0, False
                if not b0 & _CONTROL:
                    fragmented = not b0 & _FIN
                if not fragmented:
                    messages += 1
            if i >= n:
                break
            if head or n - i < 14:  # the header may be cut: put it together first
                had = len(head)
                buf = head + data[i : i + 14 - had]
                parsed = _parse_header(buf)
                if parsed is None:  # the data ran out inside it
                    head = buf
                    break
                b0, left, size = parsed
                i += size - had
                head = b""
            else:
                b0, b1 = data[i], data[i + 1]
                left, size = b1 & 0x7F, 2
                if left == 126:
                    left, size = (data[i + 2] << 8) | data[i + 3], 4
                elif left == 127:
                    left, size = int.from_bytes(data[i + 2 : i + 10], "big"), 10
                i += size + (4 if b1 & 0x80 else 0)
            in_frame = True
        self._head, self._in_frame, self._left, self._b0 = head, in_frame, left, b0
        self._fragmented, self.messages = fragmented, messages


def _parse_header(buf: bytes) -> tuple[int, int, int] | None:
    """``(first byte, payload length, header size)`` of the header ``buf`` begins, if all there."""
    if len(buf) < 2:
        return None
    length = buf[1] & 0x7F
    extended = 2 if length == 126 else 8 if length == 127 else 0
    size = 2 + extended + (4 if buf[1] & 0x80 else 0)
    if len(buf) < size:
        return None
    if extended:
        length = int.from_bytes(buf[2 : 2 + extended], "big")
    return buf[0], length, size

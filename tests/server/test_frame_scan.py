"""The frame scanner knows, after any read, whether the client is in the middle of a message.

Frames are made by a real ``websockets`` client (masked, every length
encoding), joined, and cut at arbitrary points; after each piece the scanner
must say what the byte offsets say.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.client import ClientProtocol
from websockets.protocol import State
from websockets.uri import parse_uri

from switchboard.server.ws.frame_scan import FrameScanner

# one of each header length: 7-bit, 16-bit and 64-bit
SIZES = [0, 1, 125, 126, 65535, 65536, 70000]


def frames(messages: list[list[int]], pings: list[bool]) -> list[tuple[bytes, bool]]:
    """``(frame bytes, between messages after it)`` for messages of the given fragment sizes,
    with a ping after the first fragment of those marked."""
    client = ClientProtocol(parse_uri("ws://hub/ws"), state=State.OPEN)
    out: list[tuple[bytes, bool]] = []
    for sizes, ping in zip(messages, pings, strict=True):
        for i, size in enumerate(sizes):
            last = i == len(sizes) - 1
            if i == 0:
                client.send_binary(bytes(size), fin=last)
            else:
                client.send_continuation(bytes(size), fin=last)
            out.append((b"".join(client.data_to_send()), last))
            if ping and i == 0:
                client.send_ping(b"p")  # a control frame: the state stays as it was
                out.append((b"".join(client.data_to_send()), last))
    return out


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[tuple[bytes, bool]], list[int]]:
    messages = draw(st.lists(st.lists(st.sampled_from(SIZES), min_size=1, max_size=3), min_size=1, max_size=4))
    pings = draw(st.lists(st.booleans(), min_size=len(messages), max_size=len(messages)))
    made = frames(messages, pings)
    total = sum(len(f) for f, _ in made)
    cuts = draw(st.lists(st.integers(min_value=1, max_value=total), max_size=12, unique=True))
    return made, cuts


@settings(max_examples=150, deadline=None)
@given(streams())
def test_busy_and_messages_match_the_offsets_after_every_read(
    stream: tuple[list[tuple[bytes, bool]], list[int]],
) -> None:
    made, cuts = stream
    data = b"".join(f for f, _ in made)
    ends, offset = [], 0
    for f, between in made:
        offset += len(f)
        ends.append((offset, between))
    scanner, start = FrameScanner(), 0
    for cut in sorted({*cuts, len(data)}):
        scanner.feed(data[start:cut])
        start = cut
        at_rest = any(end == cut and between for end, between in ends)
        assert scanner.busy is not at_rest, cut
        assert scanner.messages == sum(1 for end, between in ends if end <= cut and between)


def test_a_header_split_byte_by_byte_is_still_read() -> None:
    ((frame, _),) = frames([[70000]], [False])
    scanner = FrameScanner()
    for i in range(14):  # the whole header, one byte a read
        scanner.feed(frame[i : i + 1])
        assert scanner.busy
    scanner.feed(frame[14:])
    assert (scanner.busy, scanner.messages) == (False, 1)

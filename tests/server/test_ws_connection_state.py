"""A WebSocket connection's life is one state that only moves forward (``ws_state``).

The protocol is driven synchronously on a transport that only records what it
is given: each event, from each state, leaves the state the table says; an
event that would take the connection back leaves it where it is.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from websockets.client import ClientProtocol
from websockets.frames import Close, Frame, Opcode
from websockets.http11 import Request
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

from switchboard.server.process.connections import Connections
from switchboard.server.ws.ws_protocol import HubWebSocketProtocol
from switchboard.server.ws.ws_state import (
    CLOSED,
    CLOSING,
    CONNECTING,
    HANDED_OVER,
    OPEN,
    REFUSED,
    ConnectionState,
)
from switchboard.testing.wait import scaled

pytestmark = pytest.mark.timeout(30)


class RecordingTransport(asyncio.Transport):
    """A transport that keeps what is written and whether it was ended or closed."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.eof = False
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def write(self, data: Any) -> None:
        self.written += data

    def write_eof(self) -> None:
        self.eof = True

    def can_write_eof(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def upgrade_request() -> tuple[Request, bytes]:
    """A client's upgrade request, and its bytes."""
    client = ClientProtocol(parse_uri("ws://127.0.0.1:8000/ws"))
    request = client.connect()
    client.send_request(request)
    return request, b"".join(client.data_to_send())


def client_close() -> bytes:
    """The client's close frame (masked, as a client's frames are)."""
    return Frame(Opcode.CLOSE, Close(1000, "bye").serialize()).serialize(mask=True)


async def waits(scope: Any, receive: Any, send: Any) -> None:
    """An app that neither accepts nor refuses: the protocol alone decides."""
    await asyncio.Event().wait()


class Driven:
    """One connection on a recording transport, its upgrade request in, its app not yet run."""

    def __init__(self, connections: Connections, app: Any = waits) -> None:
        cls = HubWebSocketProtocol.configured(app=app, connections=connections, max_size=None, frame_timeout=None)
        self.proto = cls(app_state={})
        self.wire = RecordingTransport()
        self.proto.connection_made(self.wire)
        self.request, head = upgrade_request()
        self.proto.data_received(head)

    def accept(self) -> None:
        self.proto.accept(ServerProtocol().accept(self.request))

    def refuse(self) -> None:
        self.proto.refuse(403)

    def close(self) -> None:
        self.proto.close(1000, "")

    def receive_close(self) -> None:
        self.proto.data_received(client_close())

    def fail(self) -> None:
        self.proto.fail(1002, "broken framing")

    def hand_over(self) -> None:
        self.proto.hand_over('{"type": "restarting"}')

    def lose(self) -> None:
        self.proto.connection_lost(None)


EVENTS: dict[str, Callable[[Driven], None]] = {
    "101 written": Driven.accept,
    "refusal written": Driven.refuse,
    "close sent": Driven.close,
    "close received": Driven.receive_close,
    "failed": Driven.fail,
    "handed over": Driven.hand_over,
    "transport lost": Driven.lose,
}

#: How each state is reached from a fresh connection.
REACH: dict[ConnectionState, tuple[str, ...]] = {
    CONNECTING: (),
    OPEN: ("101 written",),
    REFUSED: ("refusal written",),
    CLOSING: ("101 written", "close sent"),
    HANDED_OVER: ("101 written", "handed over"),
    CLOSED: ("101 written", "transport lost"),
}

# fmt: off
#: The state after each event (the columns, in the order of EVENTS), from each state.
TABLE: dict[ConnectionState, tuple[ConnectionState, ...]] = {
    #              101 written  refusal   close sent  close recv  failed   handed over  lost
    CONNECTING:   (OPEN,        REFUSED,  CLOSING,    CLOSING,    CLOSING, CONNECTING,  CLOSED),
    OPEN:         (OPEN,        OPEN,     CLOSING,    CLOSING,    CLOSING, HANDED_OVER, CLOSED),
    REFUSED:      (REFUSED,     REFUSED,  REFUSED,    REFUSED,    REFUSED, REFUSED,     CLOSED),
    CLOSING:      (CLOSING,     CLOSING,  CLOSING,    CLOSING,    CLOSING, CLOSING,     CLOSED),
    HANDED_OVER:  (HANDED_OVER, HANDED_OVER, HANDED_OVER, HANDED_OVER, HANDED_OVER, HANDED_OVER, CLOSED),
    CLOSED:       (CLOSED,      CLOSED,   CLOSED,     CLOSED,     CLOSED,  CLOSED,      CLOSED),
}
# fmt: on

CASES = [
    pytest.param(start, event, after, id=f"{start.value}-{event}")
    for start, row in TABLE.items()
    for event, after in zip(EVENTS, row, strict=True)
]


@pytest.fixture
async def connections() -> AsyncIterator[Connections]:
    """The list the driven connections join; their timers and app tasks end with the test."""
    listed = Connections()
    yield listed
    for proto in list(listed.websockets):
        assert isinstance(proto, HubWebSocketProtocol)
        proto.connection_lost(None)  # cancels its timers
    for task in listed.tasks:
        task.cancel()
    if listed.tasks:
        await asyncio.wait(list(listed.tasks), timeout=scaled(5))


@pytest.mark.parametrize(("start", "event", "after"), CASES)
async def test_each_event_from_each_state_gives_the_next_state(
    connections: Connections, start: ConnectionState, event: str, after: ConnectionState
) -> None:
    driven = Driven(connections)
    for step in REACH[start]:
        EVENTS[step](driven)
    assert driven.proto.state is start
    EVENTS[event](driven)
    assert driven.proto.state is after


def test_a_connection_only_moves_forward() -> None:
    order = list(ConnectionState)
    for state in ConnectionState:
        ahead = {new for new in ConnectionState if state.allows(new)}
        assert all(order.index(new) > order.index(state) for new in ahead), f"{state} goes back"
    assert {state: {new for new in ConnectionState if state.allows(new)} for state in ConnectionState} == {
        CONNECTING: {OPEN, REFUSED, CLOSING, CLOSED},
        OPEN: {CLOSING, HANDED_OVER, CLOSED},
        REFUSED: {CLOSED},
        CLOSING: {CLOSED},
        HANDED_OVER: {CLOSED},
        CLOSED: set(),
    }


async def test_a_closed_connection_writes_nothing_more(connections: Connections) -> None:
    driven = Driven(connections)
    driven.accept()
    driven.lose()
    written = bytes(driven.wire.written)
    for event in EVENTS.values():
        event(driven)
    assert driven.proto.state is CLOSED
    assert bytes(driven.wire.written) == written
    assert driven.proto.send_now(b"late") is False


async def test_a_handed_over_connection_writes_nothing_after_the_end_of_the_stream(connections: Connections) -> None:
    driven = Driven(connections)
    driven.accept()
    driven.hand_over()
    assert driven.wire.eof
    written = bytes(driven.wire.written)
    driven.receive_close()  # websockets would answer it: not after the end of the stream
    assert bytes(driven.wire.written) == written
    assert driven.wire.closed, "the client's close ends a handed-over connection at once"
    assert driven.proto.state is HANDED_OVER


async def test_an_app_that_accepts_after_the_server_refused_the_handshake_hears_1006(
    connections: Connections,
) -> None:
    """The server stops while the app decides (``shutdown``: a 500); the app then accepts.

    No 101 was written, so the connection never opened: the app hears 1006 when it
    is lost, and nothing more is written after the refusal.
    """
    started, go, accepted = asyncio.Event(), asyncio.Event(), asyncio.Event()
    heard: list[dict[str, Any]] = []

    async def accepts_late(scope: Any, receive: Any, send: Any) -> None:
        assert (await receive())["type"] == "websocket.connect"
        started.set()
        await go.wait()
        await send({"type": "websocket.accept"})
        accepted.set()
        heard.append(await receive())

    driven = Driven(connections, accepts_late)
    await asyncio.wait_for(started.wait(), scaled(5))
    driven.proto.shutdown()
    refusal = bytes(driven.wire.written)
    assert refusal.startswith(b"HTTP/1.1 500")
    go.set()
    await asyncio.wait_for(accepted.wait(), scaled(5))
    driven.lose()
    (task,) = connections.tasks
    await asyncio.wait_for(task, scaled(5))
    assert heard == [{"type": "websocket.disconnect", "code": 1006, "reason": ""}]
    assert bytes(driven.wire.written) == refusal, "nothing follows the refusal"

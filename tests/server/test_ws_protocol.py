"""The hub's own WebSocket protocol (websockets' sans-I/O ServerProtocol) speaks RFC 6455 as uvicorn's did.

Messages in fragments are put together and routed; a ping is answered; text
that is not UTF-8 fails the connection with 1007 and a frame that breaks the
framing with 1002, and either client is detached; a client's close code
reaches the hub; a WebSocket still open when the server stops (one that never
said hello, so the drain does not know it) gets 1012 and does not hold the
stop up.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import msgpack
import pytest
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.client import ClientProtocol
from websockets.frames import Opcode
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

from support.raw_ws import read_handshake
from switchboard.server.runner import RunningServer
from switchboard.server.ws.ws_frames import BINARY, TEXT, data_frame
from switchboard.server.ws.ws_protocol import HubWebSocketProtocol
from switchboard.testing.hub import running, settings_for_tests
from switchboard.testing.wait import eventually

pytestmark = pytest.mark.timeout(30)


def url(server: RunningServer) -> str:
    return server.url.replace("http", "ws", 1) + "/ws"


async def hello(ws: ClientConnection, client_id: str) -> dict:
    await ws.send(json.dumps({"client_id": client_id}))
    info = json.loads(await asyncio.wait_for(ws.recv(), 5))
    assert info["type"] == "connection_info"
    return info


@pytest.fixture
async def pair(server: RunningServer) -> AsyncIterator[tuple[ClientConnection, ClientConnection, str]]:
    """A sender and a receiver on one hub, and the receiver's address."""
    async with ws_connect(url(server)) as sender, ws_connect(url(server)) as receiver:
        await hello(sender, "sender")
        info = await hello(receiver, "receiver")
        yield sender, receiver, f"{info['workspace']}/receiver"


async def test_the_hub_runs_its_own_protocol(server: RunningServer) -> None:
    async with ws_connect(url(server)) as ws:
        await hello(ws, "c1")
        (connection,) = server.app.state.switchboard.connections.websockets
        assert isinstance(connection, HubWebSocketProtocol)
        assert connection.on_message is not None, "the hub takes messages straight from the protocol"


async def test_a_message_sent_in_fragments_is_routed_whole(pair) -> None:
    sender, receiver, to = pair
    frame = msgpack.packb({"type": "note", "to": to}) + msgpack.packb({"blob": b"x" * 3000})
    await sender.send([frame[:10], frame[10:2000], frame[2000:]])  # three frames: BINARY, CONT, CONT
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(await asyncio.wait_for(receiver.recv(), 5))
    header, extra = next(unpacker), next(unpacker)
    assert header["to"] == to
    assert header["from"].endswith("/sender")
    assert extra == {"blob": b"x" * 3000}


async def test_a_text_message_in_fragments_is_handled_whole(server: RunningServer) -> None:
    async with ws_connect(url(server)) as ws:
        await hello(ws, "c1")
        await ws.send(['{"type": ', '"ping"}'])
        assert json.loads(await asyncio.wait_for(ws.recv(), 5)) == {"type": "pong"}


async def test_a_ping_is_answered(server: RunningServer) -> None:
    async with ws_connect(url(server)) as ws:
        await hello(ws, "c1")
        latency = await asyncio.wait_for(await ws.ping(), 5)
        assert latency >= 0


async def test_text_that_is_not_utf8_fails_the_connection_with_1007(server: RunningServer) -> None:
    async with RawClient(server) as raw:
        info = await raw.hello("garbled")
        raw.send_frame(0x81, b"\xff\xfe")  # a TEXT frame that does not decode
        assert (await raw.close_code())[0] == 1007
    await eventually(
        lambda: f"{info['workspace']}/garbled" not in server.hub.peers, timeout=5, what="the client to be detached"
    )


async def test_a_frame_that_breaks_the_framing_fails_the_connection_with_1002(server: RunningServer) -> None:
    async with RawClient(server) as raw:
        info = await raw.hello("unmasked")
        raw.writer.write(b"\x82\x01x")  # a client's frame must be masked (RFC 6455 §5.1)
        assert (await raw.close_code())[0] == 1002
    await eventually(
        lambda: f"{info['workspace']}/unmasked" not in server.hub.peers, timeout=5, what="the client to be detached"
    )


@pytest.mark.parametrize(("code", "leaves"), [(1000, True), (4000, False)])
async def test_the_clients_close_code_reaches_the_hub(server: RunningServer, code: int, leaves: bool) -> None:
    async with ws_connect(url(server)) as ws:
        info = await hello(ws, "closer")
        peer = server.hub.peers[f"{info['workspace']}/closer"]
        await ws.close(code)
    await eventually(lambda: peer.id not in server.hub.peers, timeout=5, what="the client to be detached")
    assert peer.close_code == code
    assert (peer.id not in server.hub.transit) is leaves, "a goodbye departs, any other code is a move"


async def test_a_websocket_the_drain_does_not_know_gets_1012_and_does_not_hold_the_stop_up() -> None:
    async with running(settings_for_tests(handshake_timeout=60)) as server:
        silent = await ws_connect(url(server))  # accepted, never says hello: not a peer
        started = time.monotonic()
    took = time.monotonic() - started
    await asyncio.wait_for(silent.wait_closed(), 5)
    assert silent.close_code == 1012
    assert took < 5, took


class RawClient:
    """A WebSocket client over a TCP stream (websockets' sans-I/O protocol) that can also write
    bytes no conforming client would."""

    def __init__(self, server: RunningServer) -> None:
        self.uri = parse_uri(url(server))
        self.proto = ClientProtocol(self.uri)

    async def __aenter__(self) -> RawClient:
        self.reader, self.writer = await asyncio.open_connection(self.uri.host, self.uri.port)
        self.proto.send_request(self.proto.connect())
        self._flush()
        await read_handshake(self.proto, self.reader)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.writer.close()

    async def hello(self, client_id: str) -> dict:
        self.proto.send_text(json.dumps({"client_id": client_id}).encode())
        self._flush()
        for _ in range(100):  # reads, each within 5 s
            self.proto.receive_data(await asyncio.wait_for(self.reader.read(65536), 5))
            for event in self.proto.events_received():
                return json.loads(event.data)
        raise AssertionError("no connection_info within 100 reads")

    def send_frame(self, first_byte: int, payload: bytes) -> None:
        """A masked frame (mask 0: the payload goes as it is) of fewer than 126 bytes."""
        self.writer.write(bytes([first_byte, 0x80 | len(payload)]) + b"\0\0\0\0" + payload)

    async def close_code(self) -> tuple[int, str]:
        """The server's close frame, read raw: ``(code, reason)``."""
        data = b""
        while chunk := await asyncio.wait_for(self.reader.read(65536), 5):
            data += chunk
        assert data[:1] == b"\x88", data[:20]
        payload = data[2 : 2 + (data[1] & 0x7F)]
        return int.from_bytes(payload[:2], "big"), payload[2:].decode()

    def _flush(self) -> None:
        for chunk in self.proto.data_to_send():
            if chunk:
                self.writer.write(chunk)


@pytest.mark.parametrize("size", [0, 125, 126, 65535, 65536, 70000])
@pytest.mark.parametrize("text", [False, True])
def test_a_frame_the_hub_frames_itself_reads_back_whole_in_websockets_client(size: int, text: bool) -> None:
    """send_now writes its own headers: each length class reads back as one whole message."""
    client, server = ClientProtocol(parse_uri("ws://hub/ws")), ServerProtocol()
    client.send_request(client.connect())  # the opening handshake, in memory
    server.receive_data(b"".join(client.data_to_send()))
    (request,) = server.events_received()
    server.send_response(server.accept(request))
    client.receive_data(b"".join(server.data_to_send()))
    assert client.events_received()
    assert client.state is State.OPEN
    payload = b"x" * size
    client.receive_data(data_frame(TEXT if text else BINARY, payload))
    (frame,) = client.events_received()
    assert frame.opcode is (Opcode.TEXT if text else Opcode.BINARY)
    assert frame.fin
    assert frame.data == payload
    assert client.data_to_send() == []  # nothing to answer: no protocol error

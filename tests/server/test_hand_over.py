"""A draining replica sends a WebSocket client away without a close frame, and still hears it out.

The client gets ``{"type": "restarting", "code": 1012}`` and then the end of
the stream: an unmodified hypha-rpc client in the closing state of a close
handshake fails a call it sends, one whose stream simply ended waits for its
reconnection. What the client sent before it saw the end is still routed.
"""

from __future__ import annotations

import asyncio
import json

import msgpack
import pytest
import websockets
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.uri import parse_uri

from switchboard.protocol.hypha.handshake import CLOSE_RESTARTING
from switchboard.testing.balancer import Balancer
from switchboard.testing.hub import running, settings_for_tests
from switchboard.testing.wait import eventually

pytestmark = pytest.mark.timeout(30)


class SlowReader:
    """A WebSocket client (websockets' sans-I/O protocol over a TCP stream) that reads only when
    told to: it can still send after the hub ended the stream, as a client does that has not
    yet read that end."""

    def __init__(self, url: str) -> None:
        self.uri = parse_uri(url.replace("http", "ws", 1) + "/ws")
        self.proto = ClientProtocol(self.uri, max_size=None)

    async def open(self, client_id: str) -> dict:
        self.reader, self.writer = await asyncio.open_connection(self.uri.host, self.uri.port)
        self.proto.send_request(self.proto.connect())
        self._flush()
        await self._until(lambda events: True)  # the handshake response
        self.send(json.dumps({"client_id": client_id, "workspace": None, "token": None, "reconnection_token": None}))
        return json.loads(await self.next_text())

    def send(self, data: str | bytes) -> None:
        if isinstance(data, str):
            self.proto.send_text(data.encode())
        else:
            self.proto.send_binary(data)
        self._flush()

    async def next_text(self) -> str:
        frames = await self._until(lambda events: any(isinstance(e, Frame) for e in events))
        frame = next(e for e in frames if isinstance(e, Frame))
        assert frame.opcode is Opcode.TEXT, frame
        return frame.data.decode()

    async def until_end(self) -> list[Frame]:
        """Everything up to the end of the stream (EOF from the hub)."""
        frames: list[Frame] = []
        while data := await asyncio.wait_for(self.reader.read(65536), 5):
            self.proto.receive_data(data)
            frames += [e for e in self.proto.events_received() if isinstance(e, Frame)]
        return frames

    async def _until(self, done) -> list:
        events: list = []
        while not done(events) or not events:
            data = await asyncio.wait_for(self.reader.read(65536), 5)
            assert data, "the stream ended"
            self.proto.receive_data(data)
            events += self.proto.events_received()
        return events

    def _flush(self) -> None:
        for chunk in self.proto.data_to_send():
            if chunk:
                self.writer.write(chunk)

    def close(self) -> None:
        self.writer.close()


async def test_the_stream_ends_after_a_restarting_notice_and_what_the_client_sent_meanwhile_is_routed():
    async with running(settings_for_tests()) as srv:
        moving = SlowReader(srv.url)
        info = await moving.open("moving")
        ws_id = info["workspace"]
        listener = await websockets.connect(srv.url.replace("http", "ws", 1) + "/ws")
        await listener.send(
            json.dumps({"client_id": "listener", "workspace": None, "token": None, "reconnection_token": None})
        )
        json.loads(await listener.recv())
        listener_id = next(p for p in srv.hub.peers if p.endswith("/listener"))
        peer = srv.hub.peers[f"{ws_id}/moving"]

        peer.close(CLOSE_RESTARTING, "Server restarting, please reconnect")  # what the drain does
        notice = json.loads(await moving.next_text())
        assert notice["type"] == "restarting"
        assert notice["code"] == CLOSE_RESTARTING
        # the hub has sent its notice and ended the stream; the client has not taken in that end
        # yet, and sends (a close frame would have put it in the closing state by now)
        moving.send(msgpack.packb({"type": "note", "to": listener_id, "n": 1}))
        rest = await moving.until_end()
        assert rest == [], "nothing after the notice, not even a close frame: the stream just ended"

        got = msgpack.unpackb(await asyncio.wait_for(listener.recv(), 5))
        assert got["n"] == 1, "what the client sent after the hand-over began is still routed"
        assert got["from"] == f"{ws_id}/moving"
        moving.close()
        await eventually(lambda: f"{ws_id}/moving" not in srv.hub.peers, timeout=5, what="the peer detached")
        assert f"{ws_id}/moving" in srv.hub.transit, "handed over: in transit, not gone"
        await listener.close()


async def test_through_the_test_balancer_what_the_client_sends_after_the_end_reached_it_is_routed_too():
    """As in a rolling restart behind a Service: the client has the hub's end in its socket but
    has not acted on it (hypha-rpc's sender can run before its listener), and sends a call. The
    balancer passes the half-close on, so the hub, which reads on, routes it (bench/roll.py's
    plain caller lost such a call to a timeout when the test balancer closed both directions)."""
    async with running(settings_for_tests()) as srv, Balancer([int(srv.url.rsplit(":", 1)[1])]) as balancer:
        moving = SlowReader(balancer.url)
        info = await moving.open("moving")
        ws_id = info["workspace"]
        listener = await websockets.connect(srv.url.replace("http", "ws", 1) + "/ws")
        await listener.send(
            json.dumps({"client_id": "listener", "workspace": None, "token": None, "reconnection_token": None})
        )
        json.loads(await listener.recv())
        listener_id = next(p for p in srv.hub.peers if p.endswith("/listener"))

        srv.hub.peers[f"{ws_id}/moving"].close(CLOSE_RESTARTING, "Server restarting, please reconnect")
        rest = await moving.until_end()  # the notice, then the end of the stream, both received
        assert [json.loads(f.data)["type"] for f in rest] == ["restarting"]
        moving.send(msgpack.packb({"type": "note", "to": listener_id, "n": 2}))

        try:
            got = msgpack.unpackb(await asyncio.wait_for(listener.recv(), 5))
        except TimeoutError:
            pytest.fail("what the client sent after the end reached it was lost on the way")
        assert got["n"] == 2
        moving.close()
        await listener.close()

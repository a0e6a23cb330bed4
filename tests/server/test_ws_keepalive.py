"""The hub's WebSocket keepalive: a ping after KEEPALIVE seconds of silence, the end without its pong.

A client the hub hears from (every hypha-rpc client pings every 20 s on its
own, and sends a ``{"type": "ping"}`` as often) is not pinged: with 10,000
idle clients, the hub's pings and their pongs were a third of the replica's
idle CPU (issue 26). A silent client is pinged as before, and one that does not
answer is closed with 1011.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import pytest
from websockets.client import ClientProtocol
from websockets.frames import Close, Opcode
from websockets.uri import parse_uri

from support.raw_ws import read_handshake
from switchboard.server.runner import RunningServer
from switchboard.server.ws import ws_protocol
from switchboard.testing.hub import running, settings_for_tests
from switchboard.testing.wait import scaled

pytestmark = pytest.mark.timeout(30)

KEEPALIVE = 0.3  # seconds, in place of 20


@pytest.fixture
async def server(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[RunningServer]:
    monkeypatch.setattr(ws_protocol, "KEEPALIVE", scaled(KEEPALIVE))
    async with running(settings_for_tests(handshake_timeout=60)) as srv:
        yield srv


class Client:
    """A WebSocket client on websockets' sans-I/O protocol: it sees the hub's pings, and answers
    them only if told to."""

    def __init__(self, server: RunningServer, *, answers: bool) -> None:
        self.uri = parse_uri(server.url.replace("http", "ws", 1) + "/ws")
        self.proto = ClientProtocol(self.uri)
        self.answers = answers
        self.pings = 0
        self.closed: Close | None = None

    async def __aenter__(self) -> Client:
        self.reader, self.writer = await asyncio.open_connection(self.uri.host, self.uri.port)
        self.proto.send_request(self.proto.connect())
        self._flush()
        await read_handshake(self.proto, self.reader)
        self.proto.send_text(json.dumps({"client_id": "kept"}).encode())
        self._flush()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.writer.close()

    async def listen(self, seconds: float, *, ping_every: float | None = None) -> None:
        """Read for ``seconds`` (pinging the hub every ``ping_every`` s, if given), counting pings."""
        end = time.monotonic() + seconds
        next_ping = time.monotonic()
        while (now := time.monotonic()) < end and self.closed is None:
            if ping_every is not None and now >= next_ping:
                self.proto.send_ping(b"mine")
                self._flush()
                next_ping = now + ping_every
            wait = min(end, next_ping if ping_every is not None else end) - now
            try:
                data = await asyncio.wait_for(self.reader.read(65536), max(wait, 0.01))
            except TimeoutError:
                continue
            if not data:
                break
            self.proto.receive_data(data)
            for event in self.proto.events_received():
                if event.opcode is Opcode.PING:
                    self.pings += 1
                elif event.opcode is Opcode.CLOSE:
                    self.closed = Close.parse(event.data)
            if self.answers:
                self._flush()  # websockets queued a pong for each ping
            else:
                self.proto.data_to_send()  # ... and this client drops it

    def _flush(self) -> None:
        for chunk in self.proto.data_to_send():
            if chunk:
                self.writer.write(chunk)


async def test_a_silent_client_is_pinged_each_interval_and_kept_while_it_answers(server: RunningServer) -> None:
    async with Client(server, answers=True) as client:
        await client.listen(scaled(KEEPALIVE) * 6)
    assert client.closed is None
    assert client.pings >= 3, f"{client.pings} pings in six intervals of silence"


async def test_a_client_that_does_not_answer_the_ping_is_closed_with_1011(server: RunningServer) -> None:
    async with Client(server, answers=False) as client:
        await client.listen(scaled(KEEPALIVE) * 6)
    assert client.closed is not None, "still open without answering a ping"
    assert (client.closed.code, client.closed.reason) == (1011, "keepalive ping timeout")


async def test_a_client_heard_from_within_the_interval_is_not_pinged(server: RunningServer) -> None:
    async with Client(server, answers=True) as client:
        await client.listen(scaled(KEEPALIVE) * 6, ping_every=scaled(KEEPALIVE) / 3)
    assert client.closed is None
    assert client.pings == 0, f"pinged {client.pings} times though it spoke three times an interval"

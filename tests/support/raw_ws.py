"""The handshake of the tests' hand-made WebSocket clients (websockets' sans-I/O protocol on a stream)."""

from __future__ import annotations

import asyncio

from websockets.client import ClientProtocol


async def read_handshake(proto: ClientProtocol, reader: asyncio.StreamReader, *, reads: int = 100) -> None:
    """Until the hub's handshake response is in: at most ``reads`` reads, each within 5 s."""
    for _ in range(reads):
        data = await asyncio.wait_for(reader.read(65536), 5)
        if not data:
            raise AssertionError("the hub closed the connection before its handshake response")
        proto.receive_data(data)
        if proto.events_received():
            return
    raise AssertionError(f"no handshake response within {reads} reads")

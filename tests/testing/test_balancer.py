"""The test balancer passes a half-close on, as a TCP proxy or a Kubernetes Service does.

A draining replica ends its side of a client's stream and reads on until the
client closes its own (server/ws/websocket.py): what the client sends before it
has taken in that end is still routed. A balancer that closed the whole
connection at the replica's end would lose exactly those frames, a loss of
the test rig that the hub never sees.
"""

from __future__ import annotations

import asyncio

import pytest

from switchboard.testing.balancer import Balancer
from switchboard.testing.wait import eventually

pytestmark = pytest.mark.timeout(10)


async def test_what_the_client_sends_after_the_upstream_ended_its_side_still_reaches_the_upstream():
    heard: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"bye")
        writer.write_eof()  # its side ends; it still reads, as a draining replica does
        heard.set_result(await reader.read())  # until the client's end
        writer.close()

    server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with Balancer([port]) as balancer:
        reader, writer = await asyncio.open_connection("127.0.0.1", balancer.port)
        assert await asyncio.wait_for(reader.read(), 5) == b"bye", "the upstream's bytes, then its end"
        writer.write(b"late")  # the client has the end in its buffer but has not acted on it yet
        writer.close()  # and then its own end
        assert await asyncio.wait_for(heard, 5) == b"late", "the client's bytes sent after the upstream's end"
    server.close()
    await server.wait_closed()


async def test_a_connection_ends_once_both_sides_have_ended():
    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # the client ends first
        writer.write(b"last words")
        writer.write_eof()
        writer.close()

    server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with Balancer([port]) as balancer:
        reader, writer = await asyncio.open_connection("127.0.0.1", balancer.port)
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), 5) == b"last words"
        writer.close()
        await asyncio.wait_for(writer.wait_closed(), 5)
        await eventually(lambda: balancer.open_connections == 0, "the balancer to let go of the pair", timeout=5)
    server.close()
    await server.wait_closed()

"""A client lets go of its socket whatever becomes of the closing handshake.

The hub here is deaf: it answers the WebSocket handshake and the first frame,
then reads on and answers nothing, as a hub that stalled or was cut off after
the client connected. A disconnect whose close frame is never answered, or
whose wait for the answer is cancelled (a caller's own timeout), must still
end the TCP connection: a socket left open is an unclosed-socket warning
wherever the garbage collector finds it, one file descriptor less until then,
and a connection the hub keeps counting.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from websockets.http11 import Request
from websockets.server import ServerProtocol

from switchboard.client import transport as transport_module
from switchboard.client.transport import State, Transport


class DeafHub:
    """One loopback listener; ``ended`` is set when a client's TCP connection ends."""

    def __init__(self) -> None:
        self.ended = asyncio.Event()
        self.heard_close = False
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> DeafHub:
        self._server = await asyncio.start_server(self._on_client, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"ws://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/ws"

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        proto = ServerProtocol()
        try:
            request = await self._next_event(proto, reader)
            assert isinstance(request, Request)
            proto.send_response(proto.accept(request))
            writer.write(b"".join(proto.data_to_send()))
            await self._next_event(proto, reader)  # the client's first frame
            info = {"type": "connection_info", "workspace": "ws-deaf", "manager_id": "manager", "hub_id": "deaf"}
            proto.send_text(json.dumps(info).encode())
            writer.write(b"".join(proto.data_to_send()))
            for _ in range(1000):  # reads on, answering nothing (not even a close frame), until the end
                data = await reader.read(65536)
                if not data:
                    break
                proto.receive_data(data)
                self.heard_close = self.heard_close or proto.close_rcvd is not None
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.ended.set()
            writer.close()

    @staticmethod
    async def _next_event(proto: ServerProtocol, reader: asyncio.StreamReader) -> object:
        for _ in range(100):
            data = await asyncio.wait_for(reader.read(65536), 5)
            if not data:
                raise ConnectionError("the client left")
            proto.receive_data(data)
            events = proto.events_received()
            if events:
                return events[0]
        raise AssertionError("no event within 100 reads")


def client(url: str) -> Transport:
    return Transport([url], client_id="leaver", ping_interval=0, refresh_interval=0)


async def test_a_disconnect_whose_close_is_never_answered_drops_the_socket_when_its_wait_runs_out(monkeypatch):
    monkeypatch.setattr(transport_module, "CLOSE_WAIT", 0.2)
    async with DeafHub() as hub:
        t = client(hub.url)
        await t.open()
        await asyncio.wait_for(t.disconnect(), 5)
        assert t.state is State.CLOSED
        await asyncio.wait_for(hub.ended.wait(), 2)  # the connection ended, not left to the collector
        assert hub.heard_close, "the closing handshake was not even tried"


async def test_a_disconnect_cut_short_by_its_callers_timeout_still_drops_the_socket():
    async with DeafHub() as hub:
        t = client(hub.url)
        await t.open()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(t.disconnect(), 0.1)  # cancelled while it waits for the hub's close
        await asyncio.wait_for(hub.ended.wait(), 2)

"""The client connections one server holds: for its shutdown, and for tests that watch a socket."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

Address = tuple[str, int]


class Listed(Protocol):
    """What the list needs of a WebSocket (:class:`~switchboard.server.ws.ws_protocol.Listed`)."""

    address: Address | None
    transport: asyncio.Transport

    def shutdown(self) -> None: ...


class Connections:
    """Transports by the client's address, and the upgraded ones' WebSocket protocols.

    An HTTP connection is listed from its start; one upgraded to a WebSocket
    keeps its transport and is listed until the WebSocket ends.
    """

    def __init__(self) -> None:
        self.transports: dict[Address, asyncio.BaseTransport] = {}
        self.websockets: set[Listed] = set()
        self.tasks: set[asyncio.Task[None]] = set()  # the app's, one per WebSocket, until it returns

    def __repr__(self) -> str:
        return f"<Connections {len(self.transports)} open, {len(self.websockets)} WebSockets>"

    def opened(self, address: Any, transport: asyncio.BaseTransport) -> None:
        if isinstance(address, tuple):
            self.transports[address[:2]] = transport

    def closed(self, address: Any, transport: asyncio.BaseTransport) -> None:
        if isinstance(address, tuple) and self.transports.get(address[:2]) is transport:
            del self.transports[address[:2]]

    def add(self, websocket: Listed) -> None:
        self.websockets.add(websocket)
        self.opened(websocket.address, websocket.transport)

    def discard(self, websocket: Listed) -> None:
        self.websockets.discard(websocket)
        self.closed(websocket.address, websocket.transport)

    def run(self, task: asyncio.Task[None]) -> None:
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def shut_down(self, timeout: float) -> None:
        """Close every WebSocket still open (1012; a handshake under way gets 500), and wait for
        the app to be done with them, at most ``timeout`` seconds."""
        for websocket in list(self.websockets):
            websocket.shutdown()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=timeout)

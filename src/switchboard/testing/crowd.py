"""Crowds of raw hypha clients, for the tests and benches that need hundreds or thousands.

A raw client does what every hypha-rpc client does on connect (the handshake,
then registering its ``built-in`` service) on a bare WebSocket, a fraction of
the memory and CPU of a real client, so that a crowd fits beside the replica
it loads. It reads nothing after the handshake: the answers pile up unread.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import msgpack
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect

from switchboard.clock import SystemClock
from switchboard.hub.identity.auth import TokenIssuer
from switchboard.hub.identity.users import Permission, User, user_workspace
from switchboard.testing.hub import TEST_SECRET

CLOSE_1000 = b"\x88\x82\x00\x00\x00\x00\x03\xe8"  # a masked close frame, code 1000: a goodbye


def admin_token(user_id: str, *, secret: str = TEST_SECRET, expires_in: int = 3600) -> str:
    """A token of ``user_id`` (role ``user``), admin of its own workspace."""
    issuer = TokenIssuer(secret, SystemClock())
    user = User(id=user_id, roles=("user",))
    return issuer.issue(user, workspace=user_workspace(user_id), permission=Permission.ADMIN, expires_in=expires_in)


@dataclass
class RawClient:
    """One raw client past the handshake: its connection, ``<workspace>/<client id>`` and manager."""

    ws: ClientConnection
    address: str
    manager_id: str

    async def register(self, name: str, *, kind: str = "generic") -> None:
        """Ask the manager to register service ``name``; the answer is not awaited."""
        call = {
            "type": "method",
            "from": self.address,
            "to": f"*/{self.manager_id}",
            "method": "services.default.register_service",
        }
        service = {"id": f"{self.address}:{name}", "name": name, "type": kind, "config": {"visibility": "protected"}}
        await self.ws.send(msgpack.packb(call) + msgpack.packb({"args": [service]}))

    def leave(self, *, goodbye: bool) -> None:
        """End the connection at once, with a goodbye (a close frame: the client left) or
        without (a TCP abort: it dropped, and may come back within the transit grace)."""
        transport: Any = self.ws.transport
        if goodbye:
            transport.write(CLOSE_1000)
            transport.close()
        else:
            transport.abort()


async def let_go(clients: list[RawClient], *, timeout: float = 10.0) -> None:
    """Close every client's socket now (whatever it still had to write) and wait until each is
    closed: a socket left to the garbage collector, its transport still flushing to a server that
    stopped reading, is an unclosed-socket warning in whichever test runs next."""
    for client in clients:
        client.ws.transport.abort()
    await asyncio.wait_for(asyncio.gather(*(client.ws.wait_closed() for client in clients)), timeout)


async def open_raw(url: str, client_id: str, token: str, *, timeout: float = 30.0) -> RawClient:
    """A raw client on ``url`` (``http://...``) past the handshake, that announced its
    ``built-in`` service (the answer is not awaited)."""
    ws = await ws_connect(
        url.replace("http", "ws", 1) + "/ws",
        ping_interval=None,
        compression=None,
        open_timeout=timeout,
        close_timeout=5,
        max_queue=None,  # the answers are never read: they must not stop the connection
    )
    hello = {"client_id": client_id, "workspace": None, "token": token, "reconnection_token": None}
    await ws.send(json.dumps(hello))
    info = json.loads(await asyncio.wait_for(ws.recv(), timeout))
    if info.get("type") != "connection_info":
        await ws.close()
        raise RuntimeError(f"{client_id} refused: {str(info)[:200]}")
    client = RawClient(ws, f"{info['workspace']}/{client_id}", info["manager_id"])
    await client.register("built-in", kind="built-in")
    return client

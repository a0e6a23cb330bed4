"""The client's side of the WebSocket handshake (protocol §2), and the socket it runs over.

The frames are pure functions; :class:`Socket` is the narrow interface the
transport needs, so unit tests dial a stub endpoint instead of a network.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from switchboard.client.errors import Refused, SocketClosed
from switchboard.clock import Clock
from switchboard.errors import ConfigError, ProtocolError

# Frames the hub may send: it accepts 16 MiB, and so do we.
MAX_FRAME_BYTES = 16 * 1024 * 1024


class Socket(Protocol):
    """One WebSocket, as the transport uses it."""

    async def send(self, data: str | bytes) -> None:
        """Send one frame; raise :class:`SocketClosed` if the socket is gone."""
        ...

    async def recv(self) -> str | bytes:
        """The next frame; raise :class:`SocketClosed` (with the close code) when it ends."""
        ...

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """The closing handshake: a close frame, then the peer's, then the end of the stream."""
        ...

    def abort(self) -> None:
        """Drop the connection now (nothing if it is closed already): what a closing handshake
        that was not answered in time, or was cut short, leaves behind is still released."""
        ...


Dial = Callable[[str], Awaitable[Socket]]


def normalize_url(url: str) -> str:
    """``http(s)://host[/base]`` → ``ws(s)://host[/base]/ws``; ``ws(s)://`` is used as given (§2.1)."""
    if not isinstance(url, str) or not url:
        raise ConfigError(f"server URL {url!r}: must be a non-empty string")
    for http, ws in (("http://", "ws://"), ("https://", "wss://")):
        if url.startswith(http):
            return ws + url[len(http) :].rstrip("/") + "/ws"
    if url.startswith(("ws://", "wss://")):
        return url
    raise ConfigError(f"server URL {url!r}: must start with http://, https://, ws:// or wss://")


def hello(client_id: str, workspace: str | None, token: str | None, reconnection_token: str | None) -> str:
    """The first frame (§2.2): all four keys, always."""
    return json.dumps(
        {
            "client_id": client_id,
            "workspace": workspace,
            "token": token,
            "reconnection_token": reconnection_token,
        }
    )


def parse_reply(text: str, url: str) -> dict[str, Any] | str:
    """The hub's answer to :func:`hello`: the ``connection_info`` dict, or an error frame's message."""
    try:
        data = json.loads(text)
    except ValueError:
        raise ProtocolError(f"{url} answered the handshake with a non-JSON text frame") from None
    kind = data.get("type") if isinstance(data, dict) else None
    if kind == "error":
        return str(data.get("message") or "refused without a message")
    if kind != "connection_info":
        raise ProtocolError(f"{url} answered the handshake with an unexpected frame (type {kind!r})")
    if not isinstance(data.get("workspace"), str) or not isinstance(data.get("manager_id"), str):
        raise ProtocolError(f"{url} sent connection_info without workspace or manager_id")
    info: dict[str, Any] = data
    return info


def check_info(info: dict[str, Any], *, workspace: str | None, url: str) -> None:
    if workspace and info["workspace"] != workspace:
        raise Refused(f"connected to workspace {info['workspace']!r}, expected {workspace!r}", url=url)


async def handshake(sock: Socket, first_frame: str, url: str, workspace: str | None) -> dict[str, Any]:
    """Send the first frame, return ``connection_info``; an error frame raises :class:`Refused`."""
    await sock.send(first_frame)
    while True:
        frame = await sock.recv()
        if isinstance(frame, bytes):
            continue  # frames queued for us before connection_info are skipped (§2.3)
        reply = parse_reply(frame, url)
        if isinstance(reply, str):
            raise Refused(reply, url=url, close_code=await _close_code(sock))
        check_info(reply, workspace=workspace, url=url)
        return reply


async def close(sock: Socket, reason: str, within: float) -> None:
    """The closing handshake, waited for at most ``within`` seconds; then, whether it was
    answered, ran out or was cancelled, the socket is dropped: never left to the collector."""
    try:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(sock.close(1000, reason), within)
    finally:
        sock.abort()


async def _close_code(sock: Socket) -> int | None:
    """The close code that follows an error frame (1013 makes a refusal retryable)."""
    try:
        await asyncio.wait_for(sock.recv(), 2.0)
    except SocketClosed as closed:
        return closed.code
    except Exception:
        return None
    return None


def control(text: str) -> dict[str, Any] | None:
    """A text control frame after the handshake (§2.5), or ``None`` if it is not JSON."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


PING = json.dumps({"type": "ping"})
REFRESH_TOKEN = json.dumps({"type": "refresh_token"})


async def keep_alive(sock: Socket, clock: Clock, ping_interval: float, refresh_interval: float) -> None:
    """Application pings (activity that passes through proxies, §2.5) and token refreshes.

    The refresh keeps the reconnection token younger than its lifetime, so a
    connection that lived for days can still resume its identity.
    """
    next_ping = ping_interval if ping_interval > 0 else float("inf")
    next_refresh = refresh_interval if refresh_interval > 0 else float("inf")
    now = 0.0
    with contextlib.suppress(SocketClosed):
        while min(next_ping, next_refresh) < float("inf"):
            due = min(next_ping, next_refresh)
            await clock.sleep(due - now)
            now = due
            if now >= next_refresh:
                await sock.send(REFRESH_TOKEN)
                next_refresh += refresh_interval
            if now >= next_ping:
                await sock.send(PING)
                next_ping += ping_interval


class WebsocketsSocket:
    """:class:`Socket` over a ``websockets`` client connection."""

    def __init__(self, connection: ClientConnection) -> None:
        self._conn = connection

    async def send(self, data: str | bytes) -> None:
        if self._conn.state is State.CLOSED:  # the stream ended: nothing is written
            raise SocketClosed(1006, "no close frame received", unsent=True)
        try:
            await self._conn.send(data)
        except ConnectionClosed as exc:
            raise _closed(exc) from exc

    async def recv(self) -> str | bytes:
        try:
            return await self._conn.recv()
        except ConnectionClosed as exc:
            raise _closed(exc) from exc

    async def close(self, code: int = 1000, reason: str = "") -> None:
        await self._conn.close(code, reason)

    def abort(self) -> None:
        self._conn.transport.abort()

    def __repr__(self) -> str:
        return f"<WebsocketsSocket {self._conn.remote_address} {self._conn.state.name}>"


def _closed(exc: ConnectionClosed) -> SocketClosed:
    if exc.rcvd is not None:
        return SocketClosed(exc.rcvd.code, exc.rcvd.reason)
    return SocketClosed(1006, "no close frame received")


def websocket_dial(*, open_timeout: float = 10.0, **options: Any) -> Dial:
    """A :data:`Dial` that opens a real WebSocket (``options`` go to ``websockets.connect``).

    Protocol-level pings (20 s, as hypha-rpc) notice a peer that vanished
    without closing; ``open_timeout`` bounds a dial to a blackholed address.
    """

    async def dial(url: str) -> Socket:
        connection = await ws_connect(url, open_timeout=open_timeout, max_size=MAX_FRAME_BYTES, **options)
        return WebsocketsSocket(connection)

    return dial

"""The app's side of an upgraded connection: ASGI's WebSocket interface, over the hub's protocol.

:class:`~switchboard.server.ws.ws_protocol.HubWebSocketProtocol` parses the
upgrade request with ``websockets``; :class:`AsgiWebSocket` then runs the app
on the ASGI WebSocket interface (scope 2.4, with the ``websocket.http.response``
extension that lets the app deny an upgrade with a full HTTP response), so
that ``/ws`` is an ordinary Starlette route. Once the hub has taken over the
messages (``hand_messages_to``: those waiting here first), only the disconnect
still comes through here. The
scope and the responses are built by pure functions.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
from collections.abc import Iterable, Mapping
from http import HTTPStatus
from typing import Any, Protocol
from urllib.parse import unquote

from starlette.types import ASGIApp, Message
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from switchboard.server.process.connections import Connections
from switchboard.server.ws.ws_state import CLOSED, CONNECTING, OPEN, ConnectionState


class Connection(Protocol):
    """What the app's side needs of the connection (:class:`~switchboard.server.ws.ws_protocol.HubWebSocketProtocol`)."""

    state: ConnectionState

    @property
    def connections(self) -> Connections: ...

    async def writable(self) -> None: ...
    def accept(self, response: Response) -> None: ...
    def respond(self, response: Response) -> bool: ...
    def refuse(self, status: int) -> None: ...
    def app_done(self) -> None: ...
    def send_now(self, message: bytes | str) -> bool: ...
    def close(self, code: int, reason: str) -> None: ...
    def resume_reading(self) -> None: ...


log = logging.getLogger(__name__)


#: The scope extension under which the hub finds the connection itself (its synchronous paths).
EXTENSION = "switchboard.websocket"


def scope(
    request: Request,
    *,
    scheme: str,
    server: tuple[str, int] | None,
    client: tuple[str, int] | None,
    state: Mapping[str, Any],
    connection: object,
) -> dict[str, Any]:
    """The ASGI scope of an upgrade request (websockets 17 decodes header values as ISO-8859-1)."""
    raw_path, _, query = request.path.partition("?")
    subprotocols = [
        token.strip() for header in request.headers.get_all("Sec-WebSocket-Protocol") for token in header.split(",")
    ]
    return {
        "type": "websocket",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "scheme": scheme,
        "server": server,
        "client": client,
        "root_path": "",
        "path": unquote(raw_path),
        "raw_path": raw_path.encode("ascii"),
        "query_string": query.encode("ascii"),
        "headers": [(k.lower().encode("ascii"), v.encode("latin-1")) for k, v in request.headers.raw_items()],
        "subprotocols": subprotocols,
        "state": dict(state),
        "extensions": {"websocket.http.response": {}, EXTENSION: {"connection": connection}},
    }


def accepted(response: Response, message: Mapping[str, Any]) -> Response:
    """The 101 response ``websockets`` prepared, with what the app's ``websocket.accept`` adds."""
    for name, value in message.get("headers") or ():
        response.headers[name.decode("latin-1")] = value.decode("latin-1")
    if subprotocol := message.get("subprotocol"):
        response.headers["Sec-WebSocket-Protocol"] = subprotocol
    return response


def denial(status: int, headers: Iterable[tuple[bytes, bytes]], body: bytes) -> Response:
    """The HTTP response of a ``websocket.http.response.start`` and its body: the upgrade refused."""
    if not 100 <= status < 600:
        raise RuntimeError(f"Invalid HTTP status code {status} in response")
    fields = Headers([(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers])
    fields.setdefault("Date", email.utils.formatdate(usegmt=True))
    fields.setdefault("Connection", "close")
    fields.setdefault("Content-Length", str(len(body)))
    fields.setdefault("Content-Type", "text/plain; charset=utf-8")
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return Response(status, phrase, fields, body)


class ClientDisconnected(ConnectionError):
    """An ASGI ``send`` on a connection that is gone or closing (Starlette: WebSocketDisconnect)."""


class AsgiWebSocket:
    """The ASGI ``receive`` and ``send`` of one connection; the protocol feeds it what the client did."""

    def __init__(self, proto: Connection, response: Response) -> None:
        self._proto = proto
        # the 101 websockets prepared, sent when the app accepts (None from then on: the app accepted)
        self._response: Response | None = response
        # a list, not a deque (600 bytes each, for thousands of idle connections): rarely more than one waits
        self._events: list[dict[str, Any]] = [{"type": "websocket.connect"}]
        self._wanted: asyncio.Future[None] | None = None
        self._told = False  # the disconnect is given once
        self._denial: tuple[int, Any] | None = None  # a refusal's status and headers, awaiting its body
        self._body = b""
        self.task: asyncio.Task[None] | None = None

    @property
    def app_accepted(self) -> bool:
        """The app sent ``websocket.accept`` (whether the 101 went out is the connection's state)."""
        return self._response is None

    def take_messages(self) -> list[bytes | str]:
        """The messages waiting for ``receive``, in order, taken out of its queue (what else waits,
        the disconnect, stays there)."""
        events = self._events
        taken = [e["text"] if "text" in e else e["bytes"] for e in events if e["type"] == "websocket.receive"]
        if taken:
            events[:] = [e for e in events if e["type"] != "websocket.receive"]
        return taken

    def run(self, app: ASGIApp, scope: dict[str, Any]) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run(app, scope), name=f"websocket {scope['client']}")
        self._proto.connections.run(self.task)

    async def _run(self, app: ASGIApp, scope: dict[str, Any]) -> None:
        proto = self._proto
        try:
            await app(scope, self.receive, self.send)
        except ClientDisconnected:
            pass
        except Exception:
            log.exception("WebSocket app failed")
            proto.refuse(500)
        else:
            if not self.app_accepted and self._denial is None:
                log.error("the WebSocket app returned without completing the handshake")
                proto.refuse(500)
        proto.app_done()

    # -- from the client ------------------------------------------------------------

    def received(self, message: bytes | str) -> None:
        self._event({"type": "websocket.receive", "text" if isinstance(message, str) else "bytes": message})

    def disconnected(self, code: int, reason: str = "") -> None:
        if not self._told:
            self._told = True
            self._event({"type": "websocket.disconnect", "code": code, "reason": reason})

    def _event(self, event: dict[str, Any]) -> None:
        self._events.append(event)
        if (wanted := self._wanted) is not None and not wanted.done():
            wanted.set_result(None)

    async def receive(self) -> Message:
        events = self._events
        while not events:
            self._wanted = asyncio.get_running_loop().create_future()
            await self._wanted
        event = events.pop(0)
        if not events:
            self._proto.resume_reading()  # paused while a message waited, as uvicorn does
        return event

    # -- from the app -----------------------------------------------------------------

    async def send(self, message: Message) -> None:
        proto = self._proto
        await proto.writable()
        state = proto.state
        if state is CLOSED:
            raise ClientDisconnected("the client is gone")
        kind = message["type"]
        if kind == "websocket.send":
            if state not in (CONNECTING, OPEN):
                raise ClientDisconnected("the WebSocket is closing")
            text = message.get("text")
            if not proto.send_now(message["bytes"] if text is None else text):
                raise RuntimeError("websocket.send before websocket.accept")
        elif kind == "websocket.accept" and (response := self._response) is not None and self._denial is None:
            self._response = None  # not kept for the connection's life
            proto.accept(accepted(response, message))
        elif kind == "websocket.close" and self.app_accepted:
            proto.close(message.get("code", 1000), message.get("reason") or "")
        elif kind == "websocket.close":  # before accepting: refused, as uvicorn does
            self.disconnected(1006)
            proto.refuse(403)
        elif kind == "websocket.http.response.start" and not self.app_accepted and self._denial is None:
            self._denial = (message["status"], message.get("headers") or [])
        elif kind == "websocket.http.response.body" and self._denial is not None:
            self._body += message.get("body", b"")
            if not message.get("more_body", False):
                self.disconnected(1006)
                proto.respond(denial(*self._denial, self._body))
        else:
            raise RuntimeError(f"Unexpected ASGI message {kind!r} on a WebSocket")

"""``GET /ws``: the hypha-rpc WebSocket transport (protocol §2).

A client that stops reading fills its bounded send queue and is closed as a
slow consumer (1008). If it does not complete the close handshake within
``CLOSE_GRACE`` it is detached; if what was written to it (the close frame
included: a client that reads again by then still sees why) has not drained
``WRITER_GRACE`` after that, its connection is reset rather than closed
(:mod:`switchboard.server.common.connection_reset`). ASGI can only return, and the server then *closes*
its transport, which waits for the write buffer to drain first: a client that
never reads again would keep its socket, the buffers and the server's
connection entry (and hold up the server's shutdown) for ever. The same goes
for a client that sends its close frame but reads nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect

from switchboard.errors import BackendError, HandshakeError
from switchboard.hub.sessions.peer import Peer
from switchboard.protocol.hypha import handshake
from switchboard.server.common.connection_reset import current_transport, reset
from switchboard.server.common.session import ClientSession
from switchboard.server.process.server_state import ServerState
from switchboard.server.ws import ws_asgi
from switchboard.server.ws.inbox import Inbox
from switchboard.server.ws.ws_protocol import HubWebSocketProtocol
from switchboard.server.ws.ws_state import CLOSED

log = logging.getLogger(__name__)

_LEGACY_PARAMS = ("client_id", "workspace", "token")

# Seconds a peer the hub closed has to complete the close handshake before its
# connection is dropped without it (see ``_serve``).
CLOSE_GRACE = 2.0
# Seconds a closed peer's writer and the connection's write buffer have to
# finish once the peer is detached, before the connection is reset.
WRITER_GRACE = 5.0
_DRAIN_POLL = 0.05


class WebSocketTransport:
    """A :class:`~switchboard.hub.sessions.peer.ClientConnection` over a Starlette WebSocket."""

    def __init__(self, websocket: WebSocket, proto: HubWebSocketProtocol) -> None:
        self._ws = websocket
        self._proto = proto

    def try_send(self, frame: bytes | str) -> bool:
        return self._proto.send_now(frame)

    async def send_bytes(self, data: bytes) -> None:
        await self._ws.send_bytes(data)

    async def send_text(self, text: str) -> None:
        await self._ws.send_text(text)

    async def close(self, code: int, reason: str) -> None:
        proto = self._proto
        if proto.state is CLOSED:
            return  # the client is gone: no close frame to send (a crowd leaving skips an exception each)
        if code == handshake.CLOSE_RESTARTING and proto.hand_over(handshake.restarting_text(reason)):
            return  # a drain: the stream ends without a close frame (see ws_protocol)
        await self._ws.close(code, close_reason(reason))


def hub_protocol(websocket: WebSocket) -> HubWebSocketProtocol | None:
    """The connection itself, if it runs on the hub's protocol (``None``: another server's)."""
    extension = websocket.scope.get("extensions", {}).get(ws_asgi.EXTENSION)
    proto = extension.get("connection") if extension else None
    return proto if isinstance(proto, HubWebSocketProtocol) else None


def close_reason(text: str) -> str:
    """``text`` cut to the 123 bytes of UTF-8 a close frame has room for (RFC 6455 §5.5).

    Cut by characters instead, a refusal quoting a non-ASCII client id would
    not fit: the close would fail and the client would see 1006, not the code.
    """
    return text.encode()[:123].decode(errors="ignore")


async def _refuse(websocket: WebSocket, message: str, code: int) -> None:
    with contextlib.suppress(Exception):
        await websocket.send_text(handshake.error_text(message))
        await websocket.close(code, close_reason(message))


async def _refuse_upgrade(websocket: WebSocket, why: str) -> None:
    """Turn a client away while starting, draining or cut off from Redis, so that every client tries again.

    Before the upgrade, with HTTP 503 and ``Retry-After``: hypha-rpc's
    JavaScript client treats *any* close before ``connection_info`` as final
    (it redials a draining replica within milliseconds of its 1012, and an
    accepted-then-closed socket ended it for good), and its Python client and
    Switchboard's SDK retry a 5xx. Not 403, which the Python client answers by
    falling back to legacy query-string auth and giving up. Under an ASGI
    server without the denial-response extension: accept, then a bare 1013
    close (no error frame, which would be final for hypha-rpc too).
    Suppressed: the server's own shutdown may be closing this connection
    already (seen in bench/compare.py: websockets' "assert not self.eof_sent").
    """
    with contextlib.suppress(Exception):
        if "websocket.http.response" in websocket.scope.get("extensions", {}):
            denial = JSONResponse(
                {"success": False, "detail": why},
                status_code=503,
                headers={"Retry-After": "1"},
            )
            await websocket.send_denial_response(denial)
            return
        await websocket.accept()
        await websocket.close(handshake.CLOSE_TRY_AGAIN, close_reason(why))


#: The endpoint's path. The app keeps a Starlette route to it too; served by anything but the
#: hub's own protocol (:func:`served_directly`), it refuses the upgrade (:func:`_not_served`).
PATH = "/ws"


def served_directly(app: ASGIApp) -> ASGIApp:
    """The app the hub's WebSocket protocol runs: :data:`PATH` straight to its endpoint, any
    other upgrade through ``app`` (whose router refuses it).

    The endpoint's task lasts as long as its connection, and so does every frame it was
    called through: Starlette's middleware and router added eight (3.5 KiB per idle
    connection, and the CORS, error and exception middleware they run do nothing for a
    WebSocket whose endpoint raises nothing of theirs). The endpoint finds the app as under
    Starlette, in the scope.
    """

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket" or scope["path"] != PATH:
            await app(scope, receive, send)
            return
        scope["app"] = app
        await websocket_endpoint(WebSocket(scope, receive, send))

    return serve


async def websocket_endpoint(websocket: WebSocket) -> None:
    state: ServerState = websocket.app.state.switchboard
    hub = state.hub
    proto = hub_protocol(websocket)
    if proto is None:
        await _not_served(websocket)
        return
    if any(p in websocket.query_params for p in _LEGACY_PARAMS):
        await websocket.accept()
        await websocket.close(1008, "Connection rejected, please upgrade to hypha-rpc")
        return
    if (why := state.refusal()) is not None:
        await _refuse_upgrade(websocket, why)
        return
    await websocket.accept()
    # The upgrade request's headers served the handshake; the scope lasts as long as the
    # connection's task, and nothing reads them from here on (1.2 KiB per idle connection).
    websocket.scope["headers"] = []
    session: ClientSession | None = None
    peer: Peer | None = None
    writing = False
    try:
        hello = await _hello(websocket, hub.settings.handshake_timeout)
        if hello is None:
            return  # it left first
        session = ClientSession(state, hello, WebSocketTransport(websocket, proto))
        del hello  # the token in it is freed once the client is in, not kept for the connection's life
        # In the endpoint's own frame, not a function of its own: a coroutine's frame more for
        # every idle connection (half a KiB, tests/server/test_idle_connection.py).
        async with session:  # detaches the client however this ends, one that vanishes first included
            peer = session.peer
            inbox = _inbox(proto, peer, state)
            session.settle = inbox  # what the client sent before it left is routed before the detach
            try:
                info, session.info = session.info, None  # this frame lives as long as the connection
                await websocket.send_text(json.dumps(info))
                del info
                peer.start_writing()  # a writer task only while frames wait (see Peer.start_writing)
                writing = True
                await _serve(websocket, proto, peer, inbox)
            except WebSocketDisconnect:
                pass  # the client left before connection_info reached it: the session detaches it
    except (TimeoutError, HandshakeError, BackendError) as exc:
        if session is not None and session.attached:
            raise  # not a refusal: the connection's own failure
        await _refused(websocket, state, exc)
    except WebSocketDisconnect:
        pass  # it left before it was in
    finally:
        if writing and peer is not None and (writer := peer.writer) is not None:  # the one sending the close
            await _finish(peer, writer)


async def _not_served(websocket: WebSocket) -> None:
    """Refuse the upgrade: the hub reads a client's frames only on its own protocol.

    Its messages go straight from the callback that parsed them to the hub
    (:class:`~switchboard.server.ws.inbox.Inbox`), never through ASGI's queue: the one
    read path. ``switchboard serve`` and the test runner always use that protocol
    (:func:`switchboard.server.runner.uvicorn_config`); an app served some other
    way says so instead of serving clients by another path.
    """
    log.error("refused a WebSocket: /ws is served only on the hub's own protocol (switchboard serve)")
    with contextlib.suppress(Exception):
        await websocket.close(1011, "This server cannot serve /ws: run it with switchboard serve")


async def _hello(websocket: WebSocket, timeout: float) -> handshake.Hello | None:
    """The client's first frame, parsed (``None``: it left first). A function of its own, so that
    the frame and what was decoded of it are freed once read, not kept for the connection's life."""
    first = await asyncio.wait_for(websocket.receive(), timeout)
    if first["type"] == "websocket.disconnect":
        return None
    return handshake.parse_hello(first.get("text") or first.get("bytes") or b"")


async def _refused(websocket: WebSocket, state: ServerState, exc: Exception) -> None:
    """Tell a client the hub did not let in why, as a WebSocket can: an error frame and a close code."""
    hub = state.hub
    hub.metrics.handshake_failures.inc()
    if isinstance(exc, HandshakeError):
        log.info("handshake refused: %s", exc, extra={"replica": hub.replica_id})
        await _refuse(websocket, str(exc), exc.close_code)
    elif isinstance(exc, BackendError):
        # The shared registry did not answer in time: a retryable refusal (bare
        # close, no error frame, so the client tries again) rather than a crash.
        log.warning("handshake deferred, backend unavailable: %s", exc, extra={"replica": hub.replica_id})
        with contextlib.suppress(Exception):
            await websocket.close(handshake.CLOSE_TRY_AGAIN, "Hub backend unavailable, please retry")
    else:
        log.info("handshake timed out", extra={"replica": hub.replica_id})
        await _refuse(websocket, "Authentication payload timeout", handshake.CLOSE_POLICY)


def _inbox(proto: HubWebSocketProtocol, peer: Peer, state: ServerState) -> Inbox:
    """Where the client's messages go, in the callback that parsed each."""
    hub = state.hub

    def handle(message: bytes | str) -> Awaitable[None] | None:
        if isinstance(message, str):
            hub.handle_text(peer, message)
            return None
        return hub.route_binary(peer, message)

    def failed(exc: BaseException) -> None:
        peer.log.error("routing a frame failed: %r", exc, exc_info=exc)
        peer.close(1011, "Internal error")

    return Inbox(handle, pause=proto.pause_reading, resume=proto.resume_reading, on_error=failed)


async def _serve(websocket: WebSocket, proto: HubWebSocketProtocol, peer: Peer, inbox: Inbox) -> None:
    """Read until either side closes, and never wait for ever on a client that stopped reading.

    When the hub closes a peer (slow consumer, superseded, drain), the writer
    sends the close frame and the client's answer ends the read loop. A client
    that stopped reading never answers: the writer is stuck in a send and the
    read loop waits for a frame that never comes, which would keep the peer
    (its registrations, its connection slot) attached for as long as the socket
    lives. After ``CLOSE_GRACE`` both are stopped and the peer is detached; the
    writer's clean-up still offers the close frame, bounded, and a connection
    still stuck after that is reset (``_finish``).

    The read loop runs in the endpoint's own task, and the grace is a timer
    started by the close: no task of its own (about 1.5 KiB with the wait on
    it, for every idle connection).
    """
    loop = asyncio.get_running_loop()
    me = asyncio.current_task()
    assert me is not None
    timer: asyncio.TimerHandle | None = None
    dropped = over = False

    def overdue() -> None:
        nonlocal dropped
        if over:
            return
        dropped = True
        peer.log.warning(
            "no close handshake within %gs after %r: dropping the connection", CLOSE_GRACE, peer.close_reason
        )
        if (writer := peer.writer) is not None:
            writer.cancel()
        me.cancel()

    def on_close(_: object) -> None:
        nonlocal timer
        if not over:  # a future's callbacks run later: the read loop may have ended meanwhile
            timer = loop.call_later(CLOSE_GRACE, overdue)

    closed = peer.closing()
    closed.add_done_callback(on_close)
    try:
        await _read_loop(websocket, proto, peer, inbox)
    except asyncio.CancelledError:
        if not dropped or me.uncancel() > 0:  # a cancel of the endpoint's own (a shutdown) goes on
            raise
    finally:
        over = True
        closed.remove_done_callback(on_close)
        if timer is not None:
            timer.cancel()


async def _read_loop(websocket: WebSocket, proto: HubWebSocketProtocol, peer: Peer, inbox: Inbox) -> None:
    """Hand the client's messages to ``inbox`` and wait for either side to close.

    Every message goes to the inbox, those the client sent behind its first
    frame (waiting for ASGI's ``receive``) first (``hand_messages_to``); only the
    disconnect comes through here. When the hub closes a peer (slow consumer,
    superseded), its writer closes the socket, and ``receive`` then returns the
    disconnect. What a client sends while it is sent away still counts.
    """
    proto.hand_messages_to(inbox)
    try:
        message = await websocket.receive()
        while message["type"] != "websocket.disconnect":  # no other comes once the inbox takes them
            message = await websocket.receive()
        peer.client_closed(message.get("code", 1000))
    finally:
        proto.on_message = None


async def _finish(peer: Peer, writer: asyncio.Task[None]) -> None:
    """Let the writer end and the connection flush, bounded; reset a connection that will not.

    A client that stops reading (and may even have sent its close frame) keeps
    the writer blocked in a send, or leaves bytes in the write buffer that the
    server's close would wait on for ever: after ``WRITER_GRACE`` its
    connection is reset. A client that reads costs no wait here.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WRITER_GRACE
    await asyncio.wait((writer,), timeout=WRITER_GRACE)
    transport = current_transport()
    if transport is not None:
        for _ in range(int(WRITER_GRACE / _DRAIN_POLL) + 1):  # bounded by the deadline too
            if not transport.get_write_buffer_size() or loop.time() >= deadline:
                break
            await asyncio.sleep(_DRAIN_POLL)
        stuck = not writer.done() or transport.get_write_buffer_size()
        if stuck and reset(transport):
            peer.log.warning("connection not drained %gs after %r: dropping it", WRITER_GRACE, peer.close_reason)
            # the reset wakes a writer blocked in a send: it ends at once
            await asyncio.wait((writer,), timeout=1.0)
    if not writer.done():
        writer.cancel()
        await asyncio.wait((writer,), timeout=1.0)
    if writer.done() and not writer.cancelled():
        writer.exception()  # retrieved: a failed send to a departed client is no news

"""The hub's WebSocket connections: websockets' sans-I/O ``ServerProtocol`` on an asyncio transport.

uvicorn parses the HTTP upgrade request and hands the connection to the
protocol class given as ``Config(ws=...)``; from there on this class owns it,
and ``websockets``' public sans-I/O API does the framing: bytes in with
``receive_data``, events out with ``events_received``, bytes to write with
``data_to_send``. The app runs on ASGI for the handshake (:mod:`ws_asgi`), so
that ``/ws`` is an ordinary Starlette route, and finds the connection itself in
the scope's ``switchboard.websocket`` extension for the hot path:

* once the app calls :meth:`hand_messages_to`, each message is handed to its
  handler in the event-loop callback that parsed it (those that waited for
  ASGI's ``receive`` first): no ASGI queue, no task switch, no pause and
  resume of reading per message (bench/ab.py);
* :meth:`send_now` writes a frame without awaiting when nothing holds it back;
* :meth:`hand_over` sends a draining replica's client away: a text frame that
  says so, then the end of the stream (TCP FIN) without a close frame, reading
  on until the client closes its side (at most :data:`HAND_OVER_READ`). A
  close frame would put an unmodified hypha-rpc client in the closing state,
  where a call it sends fails; a stream that just ends makes it wait for its
  reconnection, and what it sent before it saw the end is still routed;

Once the 101 is written the frames go to a second ``ServerProtocol``, made in
the open state (a documented constructor argument): the first one's parser
keeps the upgrade request, headers and all, for as long as the connection
lives, a few KiB for each of thousands of idle clients, and no extension is
negotiated, so nothing of the handshake carries over.

A client also gets ``frame_timeout`` seconds to finish each message it starts
(a frame partly received, or a fragmented message): past the bound the
connection is failed with 1008. Whether a message is under way is read from
the frame headers (:mod:`switchboard.server.ws.frame_scan`); time the server
spends not reading (its own backpressure) does not count against the client.

What this needs from uvicorn is its documented ``ws=`` option and the way it
calls the class (keyword arguments ``config``, ``server_state``, ``app_state``,
then ``connection_made`` and ``data_received`` with the request head): checked
at start-up against the tested versions (:mod:`switchboard.server.process.versions`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any, ClassVar, cast

from starlette.types import ASGIApp
from websockets.exceptions import InvalidState
from websockets.frames import Close, CloseCode, Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import SEND_EOF, State
from websockets.server import ServerProtocol

from switchboard.server.process.connections import Connections
from switchboard.server.ws import ws_asgi
from switchboard.server.ws.frame_scan import FrameScanner
from switchboard.server.ws.ws_frames import BINARY, TEXT, close_in, data_frame
from switchboard.server.ws.ws_state import (
    CLOSED,
    CLOSING,
    CONNECTING,
    HANDED_OVER,
    NEVER_OPENED,
    OPEN,
    REFUSED,
    ConnectionState,
)

log = logging.getLogger(__name__)

# Seconds a client sent away by hand_over() has to close its side before the
# connection is closed anyway: what it sent before it saw the end arrives
# within a round trip, and a drain is held up by a client that does not close
# (a stalled one, or one whose loop is blocked) for no longer than this.
HAND_OVER_READ = 1.0
# Seconds a client has to answer the hub's close frame (as under uvicorn).
CLOSE_TIMEOUT = 10.0
# A ping after KEEPALIVE seconds without a word from the client, failed (1011) when its pong is
# KEEPALIVE late (uvicorn's defaults, but uvicorn pings every 20 s whatever the client sends).
# A hypha-rpc client pings every 20 s itself, and sends a {"type": "ping"} as often: a client
# heard from within the interval is there, and 10,000 idle ones cost the replica a tenth of a
# core less without the hub's pings and their pongs.
KEEPALIVE = 20.0

MessageHandler = Callable[[bytes | str], None]


class HubWebSocketProtocol(asyncio.Protocol):
    """One upgraded connection; the class given to uvicorn is made by :meth:`configured`."""

    #: a one-element tuple: a function kept as a plain class attribute would be bound as a method
    served: ClassVar[tuple[ASGIApp]]
    connections: ClassVar[Connections]
    max_size: ClassVar[int | None] = None
    frame_timeout: ClassVar[float | None] = None

    #: Takes every complete message from now on, instead of the ASGI queue; must not raise.
    on_message: MessageHandler | None = None

    @classmethod
    def configured(
        cls, *, app: ASGIApp, connections: Connections, max_size: int | None, frame_timeout: float | None
    ) -> type[HubWebSocketProtocol]:
        """A subclass bound to one server's app, its connections and the limits on what a client sends."""
        bound = {"served": (app,), "connections": connections, "max_size": max_size, "frame_timeout": frame_timeout}
        return type(cls.__name__, (cls,), bound)

    def __init__(self, *, app_state: dict[str, Any] | None = None, **_uvicorn: Any) -> None:
        self.loop = asyncio.get_running_loop()
        self.conn = ServerProtocol(max_size=self.max_size)  # logs to websockets' own "websockets.server"
        self.app_state = app_state or {}
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.address: tuple[str, int] | None = None
        self.asgi: ws_asgi.AsgiWebSocket | None = None  # once the request head is in
        self.state: ConnectionState = CONNECTING  # moved only by _advance(), forward (ws_state)
        self.read_paused = False
        # while the transport's buffer is full: done when it takes writes again (a future made
        # then, not an asyncio.Event: a deque of waiters, 760 bytes, for every idle connection)
        self._write_paused: asyncio.Future[None] | None = None
        self._frames: list[bytes] = []  # the fragments of the message under way
        self._text = False
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._ping: bytes | None = None
        self._heard = 0.0  # when the client's last bytes arrived, by the loop's clock
        self._scanner: FrameScanner | None = None
        self._message_since: float | None = None  # when the message under way began, by the loop's clock

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.address} {self.state.value}{' paused' if self.read_paused else ''}>"

    def _advance(self, new: ConnectionState) -> bool:
        """Move to ``new`` if that is forward from here; ``False``, and no move, if it is not."""
        if not self.state.allows(new):
            return False
        self.state = new
        return True

    # -- asyncio.Protocol -----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.address = (peer[0], peer[1]) if isinstance(peer, tuple) else None
        self.connections.add(self)

    def data_received(self, data: bytes) -> None:
        self._heard = self.loop.time()
        scanner = self._scanner
        if scanner is not None:
            was_busy, ended = scanner.busy, scanner.messages
            scanner.feed(data)
        conn = self.conn
        conn.receive_data(data)
        for event in conn.events_received():
            if isinstance(event, Frame):
                self._frame(event)
            elif isinstance(event, Request):  # the one event before the frames: the upgrade request
                self._upgrade(event)
        if writes := conn.data_to_send():
            self._write(writes)
            # websockets failed the connection (1002, 1009, ...)
            if SEND_EOF in writes and self._advance(CLOSING):
                sent = close_in(writes)
                self._disconnect(sent.code if sent is not None else 1006, sent.reason if sent is not None else "")
        if scanner is not None:
            if not scanner.busy:
                self._message_since = None
            elif not was_busy or scanner.messages != ended:  # a new message began in this read
                self._message_since = self.loop.time()
                if "message" not in self._timers and (timeout := self.frame_timeout) is not None:
                    self._later("message", timeout, self._message_overdue)

    def eof_received(self) -> None:
        return None  # the transport closes: the client ended its side

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        # 1006 if the 101 was never written (a client that closed or failed before it was let in
        # has told the app its code already: the app hears the first one)
        code = 1006 if self.state in NEVER_OPENED else 1005
        self._advance(CLOSED)
        self.resume_writing()  # wake a send waiting for a buffer that will never drain
        self._disconnect(code)

    def pause_writing(self) -> None:
        if self._write_paused is None:
            self._write_paused = self.loop.create_future()

    def resume_writing(self) -> None:
        paused, self._write_paused = self._write_paused, None
        if paused is not None and not paused.done():
            paused.set_result(None)

    # -- what the client sends --------------------------------------------------------

    def _upgrade(self, request: Request) -> None:
        """The request head uvicorn passed on: validate it, then run the app on its scope."""
        response = self.conn.accept(request)
        if response.status_code != 101:
            self.respond(response)
            return
        transport = self.transport
        server = transport.get_extra_info("sockname")
        scope = ws_asgi.scope(
            request,
            scheme="wss" if transport.get_extra_info("sslcontext") else "ws",
            server=tuple(server[:2]) if isinstance(server, tuple) else None,
            client=self.address,
            state=self.app_state,
            connection=self,
        )
        self.asgi = ws_asgi.AsgiWebSocket(self, response)
        self.asgi.run(self.served[0], scope)
        if self.frame_timeout is not None:
            self._scanner = FrameScanner()

    def _frame(self, frame: Frame) -> None:
        # websockets' reader builds every frame's payload as bytes (its type says BytesLike)
        payload = cast(bytes, frame.data)
        opcode = frame.opcode
        if opcode is Opcode.BINARY or opcode is Opcode.TEXT:
            self._text = opcode is Opcode.TEXT
            if frame.fin:
                self._message(payload)
            else:
                self._frames = [payload]
        elif opcode is Opcode.CONT:
            self._frames.append(payload)
            if frame.fin:
                data, self._frames = b"".join(self._frames), []
                self._message(data)
        elif opcode is Opcode.PONG:
            if self._ping is not None and bytes(frame.data) == self._ping:
                self._ping = None
                self._cancel("pong")
                self._later("ping", KEEPALIVE, self._send_ping)
        elif opcode is Opcode.CLOSE:
            self._closed_by_client(Close.parse(frame.data))

    def _message(self, data: bytes) -> None:
        message: bytes | str = data
        if self._text:
            try:
                message = data.decode()
            except UnicodeDecodeError:
                self.fail(CloseCode.INVALID_DATA, "invalid UTF-8")
                return
        handler = self.on_message
        if handler is not None:
            handler(message)
        elif self.state in (CONNECTING, OPEN) and self.asgi is not None:  # once closing, ASGI's reader is past caring
            self.asgi.received(message)
            self.pause_reading()  # until the app has taken it, as uvicorn does

    def _closed_by_client(self, close: Close) -> None:
        """The client's close frame: websockets answers it (or it answers ours) and ends the stream."""
        if self._advance(CLOSING):
            self._disconnect(close.code, close.reason)
        self._cancel("close")
        if self.state is HANDED_OVER:  # websockets' answer may not be written after the end of the stream
            self.transport.close()

    def _disconnect(self, code: int, reason: str = "") -> None:
        if self.asgi is not None:
            self.asgi.disconnected(code, reason)

    # -- for the app (ws_asgi) and the hub ----------------------------------------------

    async def writable(self) -> None:
        """Until the transport takes writes again (or the connection is gone)."""
        if (paused := self._write_paused) is not None:
            await asyncio.shield(paused)  # a sender cancelled leaves it for the others

    def accept(self, response: Response) -> None:
        """Write the 101 (``response``), unless the connection stopped connecting meanwhile."""
        if not self.respond(response):
            return
        # The handshake's parser keeps the upgrade request (its headers, a few KiB) for as
        # long as the connection lives; the frames go to a protocol that starts open instead
        # (no extension is ever negotiated, so nothing of the handshake carries over).
        self.conn = ServerProtocol(state=State.OPEN, max_size=self.max_size)
        self._later("ping", KEEPALIVE, self._send_ping)

    def respond(self, response: Response) -> bool:
        """Write the handshake's answer while connecting (``False`` if no longer); anything but
        a 101 ends the connection."""
        if not self._advance(OPEN if response.status_code == 101 else REFUSED):
            return False
        self.conn.send_response(response)
        self._write(self.conn.data_to_send())
        return True

    def refuse(self, status: int) -> None:
        """Answer an upgrade the app did not accept with ``status`` (403, 500)."""
        if self.state is CONNECTING:
            self.respond(self.conn.reject(status, "" if status == 403 else "Internal Server Error"))

    def app_done(self) -> None:
        """The app returned: close, unless a close under way does it in time."""
        if self.state in (CONNECTING, OPEN):
            self.transport.close()

    def hand_messages_to(self, handler: MessageHandler) -> None:
        """Give every message to ``handler`` from now on, those already waiting for ASGI's
        ``receive`` first, in order: from here on only the disconnect goes through ASGI.

        Messages wait there when the client sent them behind its first frame, before the hub
        let it in; reading paused while they waited, and resumes before they are handed on
        (no read can come between: this runs in one go), so that the handler may pause it again.
        """
        self.on_message = handler
        waiting = self.asgi.take_messages() if self.asgi is not None else []
        self.resume_reading()
        for message in waiting:
            handler(message)

    def send_now(self, message: bytes | str) -> bool:
        """Frame and write ``message`` if that need not wait; ``False`` while the client is not
        reading (then the caller awaits ASGI's ``send``, which reports why) or once closing.

        The frame header is written here rather than by websockets' ``send_binary``
        (a fifth of its cost, for every frame the hub sends): a server's data frame is
        one unmasked, unfragmented frame, no extension being negotiated, and websockets
        keeps no state about data frames it did not fragment. Its ``state`` says
        whether one may be sent: not after a close frame, sent or received.
        """
        if self.state is not OPEN or self._write_paused is not None or self.conn.state is not State.OPEN:
            return False
        if type(message) is str:
            self.transport.write(data_frame(TEXT, message.encode()))
        else:
            self.transport.write(data_frame(BINARY, message))  # type: ignore[arg-type]
        return True

    def close(self, code: int, reason: str) -> None:
        """Send a close frame; the client has :data:`CLOSE_TIMEOUT` to answer it."""
        if self.transport.is_closing() or not self._advance(CLOSING):
            return
        self._disconnect(code, reason)
        with contextlib.suppress(InvalidState):
            self.conn.send_close(code, reason)
        self._write(self.conn.data_to_send())
        self.resume_reading()  # the client's answer must be read
        self._later("close", CLOSE_TIMEOUT, self.transport.close)

    def hand_over(self, notice: str) -> bool:
        """Send ``notice``, then end the stream; keep reading until the client closes (bounded).

        ``False`` when the connection is already closing (then close it as usual).
        """
        if self.state is not OPEN or self.transport.is_closing() or not self.transport.can_write_eof():
            return False
        try:
            self.conn.send_text(notice.encode())
        except InvalidState:  # the client's close frame came in
            return False
        self._cancel("ping")
        self._cancel("pong")  # nothing may be written after the end of the stream
        self._advance(HANDED_OVER)
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.transport.write_eof()
        self._later("hand over", HAND_OVER_READ, self.transport.close)
        return True

    def fail(self, code: int, reason: str) -> None:
        """Fail the connection: a close frame if one may still be written, then close at once."""
        self._frames = []
        if self._advance(CLOSING):
            self._disconnect(code, reason)
            self.conn.fail(code, reason)
            self._write(self.conn.data_to_send())
        if self.transport.get_write_buffer_size():
            self.transport.abort()  # a client that is not reading would hold the close up
        else:
            self.transport.close()

    def shutdown(self) -> None:
        """The server stops: close an open connection (1012), refuse a handshake under way (500)."""
        if self.state is OPEN:
            self.close(CloseCode.SERVICE_RESTART, "")
            self.transport.close()
        else:
            self.refuse(500)
            self.transport.close()

    def pause_reading(self) -> None:
        """Stop reading the client while earlier messages are still being handled."""
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused and not self.transport.is_closing():
            self.read_paused = False
            self.transport.resume_reading()
            if self._message_since is not None:  # the time spent paused was the server's
                self._message_since = self.loop.time()

    # -- helpers ------------------------------------------------------------------------

    def _write(self, writes: list[bytes]) -> None:
        """Write what ``websockets`` has to send; its end-of-stream marker closes the transport."""
        if self.state is HANDED_OVER or self.state is CLOSED:
            return  # the stream has ended
        data = b"".join(writes)
        if data:
            self.transport.write(data)
        if b"" in writes:
            self.transport.close()

    def _send_ping(self) -> None:
        self._timers.pop("ping", None)
        if self.state is not OPEN or self.conn.state is not State.OPEN:
            return
        if (quiet := self.loop.time() - self._heard) < KEEPALIVE:  # heard from: no ping needed yet
            self._later("ping", KEEPALIVE - quiet, self._send_ping)
            return
        self._ping = os.urandom(4)
        self.conn.send_ping(self._ping)
        self._write(self.conn.data_to_send())
        self._later("pong", KEEPALIVE, self._pong_overdue)

    def _pong_overdue(self) -> None:
        self._timers.pop("pong", None)
        if self.state is OPEN:
            log.info("closing WebSocket from %s: keepalive ping timeout", self.address)
            self.fail(CloseCode.INTERNAL_ERROR, "keepalive ping timeout")

    def _message_overdue(self) -> None:
        """The frame timer: fail the connection if the message under way is late, else wait on."""
        self._timers.pop("message", None)
        since, timeout = self._message_since, self.frame_timeout
        if since is None or timeout is None or self.state not in (CONNECTING, OPEN) or self.transport.is_closing():
            return
        now = self.loop.time()
        if self.read_paused:  # the server is not reading: the client is not the one holding it up
            since = self._message_since = now
        if (left := since + timeout - now) > 0:
            self._later("message", left, self._message_overdue)
            return
        reason = f"Message not completed within {timeout:g}s"
        log.info("closing WebSocket from %s: %s", self.address, reason)
        self.fail(CloseCode.POLICY_VIOLATION, reason)

    def _later(self, name: str, delay: float, callback: Callable[[], object]) -> None:
        self._cancel(name)
        self._timers[name] = self.loop.call_later(delay, callback)

    def _cancel(self, name: str) -> None:
        if (timer := self._timers.pop(name, None)) is not None:
            timer.cancel()

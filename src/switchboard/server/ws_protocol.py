"""uvicorn's sans-I/O WebSocket protocol, with a synchronous path for a hub's hot loop.

Under plain ASGI every client message costs a queue, a task switch and two
system calls: uvicorn queues it for ``receive``, pauses reading until the app
has taken it, and resumes reading afterwards. Every frame the hub sends costs
a task switch too, since ASGI's ``send`` must be awaited. For a hub that does
little more than route each frame, those are a large share of its time
(bench/ab.py). Here, once the app has set :attr:`on_message`, each message
is handed to it in the event-loop callback that parsed it, and
:meth:`send_now` writes a frame without awaiting when nothing holds it back.
The handshake, the close and the disconnect still go through ASGI.

A draining replica sends its clients away with :meth:`HubWebSocketProtocol.hand_over`:
a text frame that says so and then the end of the stream (TCP FIN), no close
frame, reading on until the client closes its side. A close frame would put
an unmodified hypha-rpc client in the closing state until the TCP connection
is gone, and a call it sends meanwhile fails ("Failed to send the request");
a stream that simply ends makes it wait for its reconnection instead. What
the client sent before it saw the end is still routed, as it is after a
close frame the hub sent (uvicorn would drop it).

A client also gets ``frame_timeout`` seconds to finish each message it
starts (a frame partly received, or a fragmented message): one that stalls
inside a frame would otherwise keep it in memory until the keepalive notices
(up to 40 s), and one sent as fragments could trickle for ever, answering
pings between them. Past the bound the connection is failed with 1008, which drops what was
buffered. Whether a message is under way is read from the frame headers
(:mod:`switchboard.server.frame_scan`); time the server spends not reading
(its own backpressure) does not count against the client.

uvicorn is pinned (pyproject.toml); this relies on its protocol's parts
``frames``/``curr_msg_data_type`` (the message being assembled), ``conn`` (the
``websockets`` sans-I/O connection), ``queue`` (ASGI's), ``loop``,
``handshake_initiated``/``close_sent`` and ``writable``/``read_paused``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import ClassVar

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import InvalidState
from websockets.frames import CloseCode

from switchboard.server.frame_scan import FrameScanner

log = logging.getLogger(__name__)

# Seconds a client sent away by hand_over() has to close its side before the
# connection is closed anyway: what it sent before it saw the end arrives
# within a round trip, and a drain is held up by a client that does not close
# (a stalled one, or one whose loop is blocked) for no longer than this.
HAND_OVER_READ = 1.0

MessageHandler = Callable[[bytes | str], None]


class HubWebSocketProtocol(WebSocketsSansIOProtocol):
    """The protocol class given to uvicorn (``ws=``) by :func:`switchboard.server.runner.uvicorn_config`."""

    #: Takes every complete message from now on, instead of the ASGI queue; must not raise.
    on_message: MessageHandler | None = None
    #: Seconds a client has to finish a message it started; ``None``: no bound (see :meth:`configured`).
    frame_timeout: ClassVar[float | None] = None
    _scanner: FrameScanner | None = None
    _message_since: float | None = None  # when the message under way began, by the loop's clock
    _message_timer: asyncio.TimerHandle | None = None

    @classmethod
    def configured(cls, *, frame_timeout: float) -> type[HubWebSocketProtocol]:
        """A subclass that bounds the time a client may take to finish a message."""
        return type(cls.__name__, (cls,), {"frame_timeout": frame_timeout})

    def data_received(self, data: bytes) -> None:
        scanner = self._scanner
        if scanner is None:
            super().data_received(data)  # the opening handshake's request, in one piece from uvicorn
            if self.handshake_initiated and self.frame_timeout is not None:
                self._scanner = FrameScanner()
            return
        was_busy, ended = scanner.busy, scanner.messages
        scanner.feed(data)
        super().data_received(data)
        if not scanner.busy:
            self._message_since = None
        elif not was_busy or scanner.messages != ended:  # a new message began in this read
            self._message_since = self.loop.time()
            if self._message_timer is None and (timeout := self.frame_timeout) is not None:
                self._message_timer = self.loop.call_later(timeout, self._message_overdue)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._message_timer is not None:
            self._message_timer.cancel()
            self._message_timer = None
        super().connection_lost(exc)

    def _message_overdue(self) -> None:
        """The timer: fail the connection if the message under way is late, else wait on."""
        self._message_timer = None
        since, timeout = self._message_since, self.frame_timeout
        if since is None or timeout is None or self.close_sent or self.transport.is_closing():
            return
        now = self.loop.time()
        if self.read_paused:  # the server is not reading: the client is not the one holding it up
            since = self._message_since = now
        if (left := since + timeout - now) > 0:
            self._message_timer = self.loop.call_later(left, self._message_overdue)
            return
        reason = f"Message not completed within {timeout:g}s"
        log.info("closing WebSocket from %s: %s", self.client, reason)
        self.frames = []  # the fragments uvicorn holds; the connection drops its own buffer
        self.conn.fail(CloseCode.POLICY_VIOLATION, reason)
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        self.queue.put_nowait({"type": "websocket.disconnect", "code": 1008, "reason": reason})
        if self.transport.get_write_buffer_size():
            self.transport.abort()  # a client that is not reading would hold the close up
        else:
            self.transport.close()

    def hand_messages_to(self, handler: MessageHandler) -> bool:
        """Give messages to ``handler`` from now on, unless some wait in ASGI's queue:
        they would be overtaken, so ``False`` says to ``receive`` those first."""
        if not self.queue.empty():
            return False
        self.on_message = handler
        return True

    def send_receive_event_to_app(self) -> None:
        handler = self.on_message
        if handler is None:
            super().send_receive_event_to_app()  # uvicorn drops it once close_sent
            return
        data = self.frames[0] if len(self.frames) == 1 else b"".join(self.frames)
        if self.curr_msg_data_type == "text":
            try:
                message: bytes | str = data.decode()
            except UnicodeDecodeError:
                super().send_receive_event_to_app()  # uvicorn closes with 1007, as for any app
                return
        else:
            message = data
        self.frames = []
        handler(message)

    def hand_over(self, notice: str) -> bool:
        """Send ``notice``, then end the stream; keep reading until the client closes (bounded).

        ``False`` when the connection is already closing (then close it as usual).
        """
        if self.close_sent or self.disconnected or self.transport.is_closing() or not self.transport.can_write_eof():
            return False
        self.stop_keepalive()  # nothing may be written after the end of the stream
        try:
            self.conn.send_text(notice.encode())
        except InvalidState:  # the client's close frame came in
            return False
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.transport.write_eof()
        self.close_sent = True  # for uvicorn: no more writes, its shutdown only closes the transport
        self.close_timer = self.loop.call_later(HAND_OVER_READ, self.transport.close)
        return True

    def send_now(self, message: bytes | str) -> bool:
        """Frame and write ``message`` as ``send`` would, if that would not wait.

        ``send`` only ever waits while writing is paused (the client is not
        reading): then, or once the connection is closing, this says ``False``
        and the caller awaits ``send`` instead, which reports why.
        """
        if self.close_sent or self.disconnected or not self.writable.is_set():
            return False
        try:
            if isinstance(message, str):
                self.conn.send_text(message.encode())
            else:
                self.conn.send_binary(message)
        except InvalidState:  # the client's close frame came in
            return False
        self.transport.write(b"".join(self.conn.data_to_send()))
        return True

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

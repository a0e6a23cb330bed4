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

uvicorn is pinned (pyproject.toml); this relies on its protocol's parts
``frames``/``curr_msg_data_type`` (the message being assembled), ``conn`` (the
``websockets`` sans-I/O connection) and ``writable``/``read_paused``.
"""

from __future__ import annotations

from collections.abc import Callable

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import InvalidState

MessageHandler = Callable[[bytes | str], None]


class HubWebSocketProtocol(WebSocketsSansIOProtocol):
    """The protocol class given to uvicorn (``ws=``) by :func:`switchboard.server.runner.uvicorn_config`."""

    #: Takes every complete message from now on, instead of the ASGI queue; must not raise.
    on_message: MessageHandler | None = None

    def hand_messages_to(self, handler: MessageHandler) -> bool:
        """Give messages to ``handler`` from now on, unless some wait in ASGI's queue:
        they would be overtaken, so ``False`` says to ``receive`` those first."""
        if not self.queue.empty():
            return False
        self.on_message = handler
        return True

    def send_receive_event_to_app(self) -> None:
        handler = self.on_message
        if handler is None or self.close_sent:
            super().send_receive_event_to_app()
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

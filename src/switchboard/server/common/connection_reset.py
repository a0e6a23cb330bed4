"""Resetting a client's connection when closing it would never finish.

ASGI can only end a response (or leave it unfinished); the server then
*closes* its transport, which first flushes the write buffer. A client that
stopped reading never lets it: its socket, the buffer and the server's
connection entry would stay for as long as the client likes, and the server's
shutdown waits for every connection. So such a connection is reset instead
(linger 0: the kernel drops what it still holds too).

ASGI does not give the app its transport. :class:`~switchboard.server.http.http_protocol.HubHttpProtocol`
names it in :data:`CURRENT` while it parses a request, and a task copies
the context it was created in (asyncio's documented behaviour), so the app's
task for that request (or for the WebSocket it is upgraded to) sees it in
:func:`current_transport`. Under another server it is ``None``, and nothing
is reset: the server closes the connection as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from contextvars import ContextVar

#: Set by the server's protocol while it parses what a connection sent (``set``, then ``reset``).
CURRENT: ContextVar[asyncio.Transport | None] = ContextVar("switchboard_transport", default=None)


def current_transport() -> asyncio.Transport | None:
    """The transport of the connection the running request came on, if the server named it."""
    return CURRENT.get()


def reset(transport: asyncio.Transport | None = None) -> bool:
    """Reset ``transport`` (by default the current request's); ``False`` if there is nothing to
    reset (not known, or already closing with nothing left to write: it goes away by itself)."""
    transport = transport or current_transport()
    if transport is None or (transport.is_closing() and not transport.get_write_buffer_size()):
        return False
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
    return True

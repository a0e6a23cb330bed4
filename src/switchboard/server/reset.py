"""Resetting a client's connection when closing it would never finish.

ASGI can only end a response (or leave it unfinished); the server then
*closes* its transport, which first flushes the write buffer. A client that
stopped reading never lets it: its socket, the buffer and the server's
connection entry would stay for as long as the client likes, and uvicorn's
shutdown waits for every connection. So such a connection is reset instead
(linger 0: the kernel drops what it still holds too).

The transport is found through uvicorn's ``receive``, a method of its
protocol or request cycle that holds the asyncio transport. On a server
where it cannot be found, nothing is done and the server closes the
connection as before.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from typing import Any


def server_transport(receive: Any) -> Any:
    """The asyncio transport under an ASGI ``receive`` callable, or ``None``."""
    transport = getattr(getattr(receive, "__self__", None), "transport", None)
    return transport if callable(getattr(transport, "abort", None)) else None


def reset(receive: Any) -> bool:
    """Reset the connection under ``receive``; ``False`` if there is nothing to reset
    (not found, or already closing with nothing left to write: it goes away by itself)."""
    transport = server_transport(receive)
    if transport is None or (transport.is_closing() and not transport.get_write_buffer_size()):
        return False
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(Exception):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
    return True

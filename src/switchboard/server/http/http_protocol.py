"""uvicorn's httptools protocol, with bounds on clients that send their request head slowly.

uvicorn's only clock on an HTTP connection is the keep-alive timer, armed
after a response: a connection that sends a request head a line at a time
(slowloris), or never finishes one, holds its socket for as long as it likes,
and httptools keeps growing an unfinished header without limit. Here:

* the head (request line and headers) must be complete within
  ``header_timeout`` of the connection's start, or of the first byte of a later
  request on it; else the client gets ``408`` and the connection is closed
  (without the ``408`` when a response to an earlier request is still owed,
  since it would be taken for that one);
* a head larger than ``max_head_bytes`` gets ``431`` and the connection is closed;
* at most ``per_address`` connections from one address, and ``overall`` in all,
  wait for their heads at once: one more closes the longest-waiting one (``408``).
  Only a connection that has waited ``EVICT_AFTER`` can be closed so: honest
  clients send their head in the same round trip as the connect, so a burst of
  them is let in, over the bound, rather than refused.

It also lists its connections (:class:`~switchboard.server.process.connections.Connections`)
and names the connection's transport for the app's task (:mod:`switchboard.server.common.connection_reset`).

The class is handed to uvicorn as ``Config(http=...)`` (documented: an
``asyncio.Protocol`` class) by :func:`switchboard.server.runner.uvicorn_config`,
through :meth:`HubHttpProtocol.configured`, which binds the bounds. It hooks only
the parser callbacks and ``asyncio.Protocol`` methods uvicorn's class defines.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from switchboard.server.common import connection_reset
from switchboard.server.process.connections import Connections

log = logging.getLogger(__name__)

#: Seconds a connection must have waited for its head before a newer one may evict it.
EVICT_AFTER = 1.0


def _response(status: bytes) -> bytes:
    return b"HTTP/1.1 " + status + b"\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


TIMEOUT_408 = _response(b"408 Request Timeout")
TOO_LARGE_431 = _response(b"431 Request Header Fields Too Large")


class HeadWatch:
    """The connections still sending their request heads, oldest first, per address and in all."""

    def __init__(self, *, timeout: float, max_bytes: int, per_address: int, overall: int) -> None:
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.per_address = per_address
        self.overall = overall
        self.waiting: dict[HubHttpProtocol, None] = {}  # insertion order: oldest first
        self.by_address: dict[Any, dict[HubHttpProtocol, None]] = {}

    def add(self, conn: HubHttpProtocol, now: float) -> None:
        """``conn`` waits for a head from now on; make room by evicting the longest-waiting."""
        same = self.by_address.setdefault(conn.address, {})
        same[conn] = None
        self.waiting[conn] = None
        if len(same) > self.per_address:
            self._evict(next(iter(same)), now)
        if len(self.waiting) > self.overall:
            self._evict(next(iter(self.waiting)), now)

    def remove(self, conn: HubHttpProtocol) -> None:
        self.waiting.pop(conn, None)
        same = self.by_address.get(conn.address)
        if same is not None:
            same.pop(conn, None)
            if not same:
                del self.by_address[conn.address]

    @staticmethod
    def _evict(conn: HubHttpProtocol, now: float) -> None:
        if now - conn.head_since >= EVICT_AFTER:
            conn.head_failed(TIMEOUT_408, "evicted: too many connections waiting for a request head")


class HubHttpProtocol(HttpToolsProtocol):
    """The protocol class given to uvicorn (``http=``); use :meth:`configured` for one with bounds."""

    watch: ClassVar[HeadWatch]  # set on the subclass :meth:`configured` makes
    listed_in: ClassVar[Connections]  # (uvicorn's class has a ``connections`` of its own)

    @classmethod
    def configured(
        cls,
        *,
        header_timeout: float,
        max_head_bytes: int,
        per_address: int,
        overall: int,
        connections: Connections,
    ) -> type[HubHttpProtocol]:
        """A subclass bound to these limits, with its own count of waiting connections
        (one per server: servers in one process do not share it)."""
        watch = HeadWatch(
            timeout=header_timeout,
            max_bytes=max_head_bytes,
            per_address=per_address,
            overall=overall,
        )
        return type(cls.__name__, (cls,), {"watch": watch, "listed_in": connections})

    # -- asyncio.Protocol ---------------------------------------------------------

    # a TCP server hands its protocols an asyncio.Transport, not just a BaseTransport
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.head_transport = transport
        peer = transport.get_extra_info("peername")
        self.address = peer[0] if isinstance(peer, tuple) else peer
        self.peername = peer
        self.listed_in.opened(peer, transport)
        self.head_since = 0.0
        self.head_bytes = 0
        self.head_timer: asyncio.TimerHandle | None = None
        self.unanswered = 0  # requests whose head is in and whose response is not finished
        self.in_request = False  # the parser is inside a request (its head or its body)
        super().connection_made(transport)
        self._head_started()

    def data_received(self, data: bytes) -> None:
        if self.head_timer is None and not self.in_request and not self.unanswered:
            self._head_started()  # even bytes that begin no request (blank lines) start the clock
        waiting = self.head_timer
        token = connection_reset.CURRENT.set(self.head_transport)  # for the app's task, if a request starts here
        try:
            super().data_received(data)
        finally:
            connection_reset.CURRENT.reset(token)
        if waiting is not None and self.head_timer is waiting:  # the same head, still unfinished
            self.head_bytes += len(data)
            if self.head_bytes > self.watch.max_bytes:
                self.head_failed(TOO_LARGE_431, f"request head over {self.watch.max_bytes} bytes")

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_ended()
        self.listed_in.closed(self.peername, self.head_transport)
        super().connection_lost(exc)

    # -- httptools parser callbacks ---------------------------------------------------

    def on_message_begin(self) -> None:
        self.in_request = True
        self._head_started()  # a later request on a kept-alive connection, or a pipelined one
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._head_ended()
        self.unanswered += 1
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self.in_request = False
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self.unanswered -= 1
        super().on_response_complete()

    # -- the bounds ---------------------------------------------------------------

    def _head_started(self) -> None:
        if self.head_timer is not None or self.head_transport.is_closing():
            return
        loop = asyncio.get_running_loop()
        self.head_since = loop.time()
        self.head_bytes = 0
        self.head_timer = loop.call_later(self.watch.timeout, self._head_timed_out)
        self.watch.add(self, self.head_since)

    def _head_ended(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None
            self.watch.remove(self)

    def _head_timed_out(self) -> None:
        self.head_failed(TIMEOUT_408, f"no complete request head within {self.watch.timeout:g}s")

    def head_failed(self, response: bytes, why: str) -> None:
        """Answer ``response`` if no earlier response is owed, and close; reset if that would wait."""
        self._head_ended()
        transport = self.head_transport
        if transport.is_closing():
            return
        log.debug("closing HTTP connection from %s: %s", self.address, why)
        if not self.unanswered:
            transport.write(response)
        if transport.get_write_buffer_size():
            transport.abort()  # a client that is not reading would hold the close up
        else:
            transport.close()

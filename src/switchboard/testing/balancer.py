"""A loopback TCP load balancer: one address in front of several replicas.

What an unmodified hypha-rpc client (one ``server_url``) dials when a hub has
several replicas, as a Kubernetes Service is: each new connection goes to an
upstream that is *in* (a replica taken out, as a terminating pod leaves its
Service's endpoints, gets no new connections) and accepts the TCP
connection: the next in rotation, or with ``prefer_newest`` the one put back
most recently (in a rolling restart, the one that will be restarted last).
Connections already open stay where they are; bytes are copied unchanged in
both directions, and an end is passed on as a half-close, as a TCP proxy or a
Kubernetes Service passes it: a draining replica ends its side of a client's
stream and reads on until the client ends its own, so what the client sends
before it has taken in that end must still reach the replica. The pair is
closed once both directions have ended (or either was reset).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

logger = logging.getLogger(__name__)

_CHUNK = 65536


class Balancer:
    """Round-robin over ``ports`` on ``host``; run it in the test's event loop."""

    def __init__(
        self,
        ports: list[int],
        *,
        host: str = "127.0.0.1",
        connect_timeout: float = 2.0,
        prefer_newest: bool = False,
    ) -> None:
        self.host = host
        self.ports = list(ports)
        self.out: set[int] = set()
        self.prefer_newest = prefer_newest
        self._back: dict[int, int] = {}  # port -> how many put_back calls ago it came back (higher: newer)
        self.connect_timeout = connect_timeout
        self.accepted = 0
        self.refused = 0
        self._next = 0
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def take_out(self, port: int) -> None:
        """No new connections to ``port`` (existing ones are left alone)."""
        self.out.add(port)

    def put_back(self, port: int) -> None:
        self.out.discard(port)
        self._back[port] = max(self._back.values(), default=0) + 1

    async def start(self) -> Balancer:
        self._server = await asyncio.start_server(self._on_client, self.host, 0)
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._pumps):
            task.cancel()
        if self._pumps:
            await asyncio.wait(list(self._pumps), timeout=5)

    async def __aenter__(self) -> Balancer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """The upstream to use (see the module docstring) that accepts; ``None`` if none does."""
        start = self._next
        self._next += 1
        order = [self.ports[(start + k) % len(self.ports)] for k in range(len(self.ports))]
        if self.prefer_newest:
            order.sort(key=lambda port: -self._back.get(port, 0))  # stable: rotation among equals
        for port in order:
            if port in self.out:
                continue
            with contextlib.suppress(OSError, TimeoutError):
                return await asyncio.wait_for(asyncio.open_connection(self.host, port), self.connect_timeout)
        return None

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream = await self._upstream()
        if upstream is None:
            self.refused += 1
            writer.close()
            return
        self.accepted += 1
        task = asyncio.create_task(self._relay(reader, writer, *upstream))
        self._pumps.add(task)
        task.add_done_callback(self._pumps.discard)

    @property
    def open_connections(self) -> int:
        """Client connections whose two directions have not both ended yet."""
        return len(self._pumps)

    async def _relay(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> None:
        """Both directions of one connection; closed once both ended."""
        try:
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
        finally:
            for dst in (writer, up_writer):
                with contextlib.suppress(OSError, RuntimeError):
                    dst.close()

    @staticmethod
    async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        """Copy one direction; its end goes on as a half-close, a reset closes both."""
        try:
            while data := await src.read(_CHUNK):
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            dst.close()  # a reset is no half-close: the other direction ends too
            return
        with contextlib.suppress(OSError, RuntimeError):
            if dst.can_write_eof():
                dst.write_eof()
            else:
                dst.close()

    def __repr__(self) -> str:
        return f"<Balancer :{self._server and self.port} -> {self.ports} out={sorted(self.out)}>"

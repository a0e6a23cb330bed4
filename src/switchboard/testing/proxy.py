"""A loopback TCP proxy that injects network faults.

Put it between a replica and Redis to make the network misbehave on cue:
go silent (half-open connections), add latency, reset connections with a
TCP RST, or refuse new ones. Real sockets, so the client library's own
timeout and reconnect logic is what gets tested.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")
_CHUNK = 65536
_QUEUED_CHUNKS = 64
_LINGER_RST = struct.pack("ii", 1, 0)
# Loop turns stop() gives connections accepted just before the listener closed to reach the
# handler, which turns them away (the accept, connection_made, the handler's first step): a
# connection left in a loop that stops before then is an unclosed transport for the collector.
_TURNS_AFTER_CLOSE = 10


@dataclass
class ProxyStats:
    """Counters since start. ``up`` is client -> upstream, ``down`` the reverse."""

    accepted: int = 0
    refused: int = 0
    active: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    bytes_dropped: int = 0
    ends_held: int = 0  # FINs and resets a blackhole holds back right now (passed on when it heals)


@dataclass(frozen=True)
class ConnectionInfo:
    """A thread-safe snapshot of one proxied connection."""

    id: int
    client_addr: tuple[str, int]
    upstream_addr: tuple[str, int] | None
    bytes_up: int
    bytes_down: int


def _abort(writer: asyncio.StreamWriter | None, *, rst: bool) -> None:
    """Drop a socket now; with ``rst``, SO_LINGER 0 makes the kernel send RST, not FIN."""
    if writer is None:
        return
    if rst:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
    writer.transport.abort()


class ProxyConnection:
    """One accepted client connection and its upstream twin."""

    def __init__(
        self,
        proxy: FaultProxy,
        conn_id: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.id = conn_id
        self.client_addr: tuple[str, int] = writer.get_extra_info("peername")
        self.upstream_addr: tuple[str, int] | None = None  # our side, as Redis sees it
        self.bytes_up = 0
        self.bytes_down = 0
        self.closed = False
        self._proxy = proxy
        self._client_r = reader
        self._client_w = writer
        self._up_w: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None

    def reset(self) -> None:
        """Abort both sides with TCP RST, as a crashed middlebox would."""
        self._shutdown(rst=True)

    def close(self) -> None:
        """Close both sides (FIN), discarding anything still buffered."""
        self._shutdown(rst=False)

    def info(self) -> ConnectionInfo:
        return ConnectionInfo(self.id, self.client_addr, self.upstream_addr, self.bytes_up, self.bytes_down)

    def _shutdown(self, *, rst: bool) -> None:
        if self.closed:
            return
        self.closed = True
        _abort(self._client_w, rst=rst)
        _abort(self._up_w, rst=rst)
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()

    async def run(self) -> None:
        proxy = self._proxy
        try:
            await proxy._flowing.wait()  # a dead network holds new connections too
            up_r, up_w = await asyncio.wait_for(
                asyncio.open_connection(proxy.upstream_host, proxy.upstream_port),
                proxy.connect_timeout,
            )
        except (OSError, TimeoutError) as exc:
            logger.warning("proxy conn %s: upstream connect failed: %r", self.id, exc)
            self.reset()
            return
        if self.closed:  # closed while it dialled (a cancel that came as the dial completed is lost)
            _abort(up_w, rst=False)
            return
        self._up_w = up_w
        self.upstream_addr = up_w.get_extra_info("sockname")
        up = asyncio.create_task(self._pump(self._client_r, up_w, up=True))
        down = asyncio.create_task(self._pump(up_r, self._client_w, up=False))
        try:
            done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            # An RST on one side is passed on as an RST; a FIN as a close.
            self._shutdown(rst=any(task.result() for task in done))
        finally:
            up.cancel()
            down.cancel()
            await asyncio.gather(up, down, return_exceptions=True)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, up: bool) -> bool:
        """Copy one direction until EOF; True if it ended with a reset.

        Reading and writing are split by a queue so that added latency delays
        each chunk without delaying the reading of the next one.
        """
        proxy = self._proxy
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue(_QUEUED_CHUNKS)

        async def feed() -> None:
            last: bytes | None = b""
            try:
                while data := await reader.read(_CHUNK):
                    if up and proxy._recorded is not None:
                        proxy._recorded.append((self.id, data))
                    await queue.put((loop.time() + proxy._latency, data))
            except OSError:
                last = None
            await queue.put((loop.time() + proxy._latency, last))

        feeder = asyncio.create_task(feed())
        try:
            while True:
                due, data = await queue.get()
                if (wait := due - loop.time()) > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if not proxy._flowing.is_set():  # a FIN or RST is lost in a blackhole too
                        proxy._stats.ends_held += 1
                        try:
                            await proxy._flowing.wait()
                        finally:
                            proxy._stats.ends_held -= 1
                    return data is None
                if not proxy._flowing.is_set():
                    proxy._stats.bytes_dropped += len(data)
                    continue
                writer.write(data)
                await writer.drain()
                if up:
                    self.bytes_up += len(data)
                    proxy._stats.bytes_up += len(data)
                else:
                    self.bytes_down += len(data)
                    proxy._stats.bytes_down += len(data)
        except OSError:
            return True
        finally:
            feeder.cancel()
            await asyncio.gather(feeder, return_exceptions=True)


class FaultProxy:
    """An asyncio TCP proxy on ``127.0.0.1`` whose faults tests switch on and off.

    All methods must be called on the loop that ran :meth:`start`; use
    :class:`ThreadedFaultProxy` to drive it from another thread.
    """

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        *,
        port: int = 0,
        connect_timeout: float = 5.0,
    ) -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.connect_timeout = connect_timeout
        self._want_port = port
        self._server: asyncio.Server | None = None
        self._conns: dict[int, ProxyConnection] = {}
        self._next_id = 1
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._latency = 0.0
        self._drop_new = False
        self._stats = ProxyStats()
        self._recorded: deque[tuple[int, bytes]] | None = None

    @staticmethod
    def in_thread(upstream_host: str, upstream_port: int, **kwargs: Any) -> ThreadedFaultProxy:
        """The same proxy on its own loop thread (not yet started)."""
        return ThreadedFaultProxy(upstream_host, upstream_port, **kwargs)

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("FaultProxy is not started")
        return int(self._server.sockets[0].getsockname()[1])

    def url_for_redis(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    async def start(self) -> FaultProxy:
        if self._server is None:
            # A fresh Event: one that waited on an earlier loop cannot be reused.
            flowing, self._flowing = self._flowing, asyncio.Event()
            if flowing.is_set():
                self._flowing.set()
            self._server = await asyncio.start_server(self._on_client, "127.0.0.1", self._want_port, reuse_address=True)
            logger.info("fault proxy :%s -> %s:%s", self.port, self.upstream_host, self.upstream_port)
        return self

    async def stop(self) -> None:
        """Stop listening and close every connection."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
            for _ in range(_TURNS_AFTER_CLOSE):
                await asyncio.sleep(0)
        conns = list(self._conns.values())
        for conn in conns:
            conn.close()
        tasks = [conn._task for conn in conns if conn._task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=self.connect_timeout)
        if server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), self.connect_timeout)

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # -- faults -------------------------------------------------------------

    def pass_through(self) -> None:
        """Back to normal: forward, no latency, accept new connections."""
        self._latency = 0.0
        self._drop_new = False
        self._flowing.set()

    def blackhole(self) -> None:
        """Go silent both ways: bytes (and FINs) are dropped, sockets stay open."""
        self._flowing.clear()

    def delay(self, seconds: float) -> None:
        """Forward every chunk ``seconds`` late, in order (ends a blackhole)."""
        if seconds < 0:
            raise ValueError(f"delay must be >= 0, got {seconds}")
        self._latency = float(seconds)
        self._flowing.set()

    def drop_new(self, enabled: bool = True) -> None:
        """Reset new connections as soon as they are accepted."""
        self._drop_new = enabled

    def reset_all(self) -> int:
        """RST every current connection (both sides); returns how many."""
        conns = list(self._conns.values())
        for conn in conns:
            conn.reset()
        logger.info("fault proxy :%s reset %d connections", self.port, len(conns))
        return len(conns)

    def reset_connection(self, conn_id: int) -> bool:
        """RST one connection by its ``id``; False if it is already gone."""
        conn = self._conns.get(conn_id)
        if conn is None:
            return False
        conn.reset()
        return True

    @property
    def connections(self) -> list[ProxyConnection]:
        """Open connections, oldest first."""
        return [conn for conn in self._conns.values() if not conn.closed]

    @property
    def stats(self) -> ProxyStats:
        """A snapshot: later traffic does not change it."""
        return replace(self._stats, active=len(self.connections))

    def record(self, limit: int = 10_000) -> None:
        """Keep what clients send upstream from now on (the last ``limit`` reads), for :meth:`recorded`.

        One entry per read of a client's socket: a request, or several a client wrote at once
        (a pipeline). A request sent after the reply to an earlier one is always a read of its
        own, so the entries that concern something count its round trips (at least).
        """
        self._recorded = deque(maxlen=limit)

    def recorded(self) -> list[tuple[int, bytes]]:
        """``(connection id, bytes)`` of each read since :meth:`record`, oldest first."""
        return list(self._recorded or ())

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._drop_new or self._server is None:
            self._stats.refused += 1
            _abort(writer, rst=True)
            return
        self._stats.accepted += 1
        conn = ProxyConnection(self, self._next_id, reader, writer)
        self._next_id += 1
        conn._task = asyncio.current_task()
        self._conns[conn.id] = conn
        try:
            await conn.run()
        except asyncio.CancelledError:
            pass  # reset()/close() cancel the connection's task on purpose
        finally:
            conn.close()
            del self._conns[conn.id]


class ThreadedFaultProxy:
    """A :class:`FaultProxy` on a private event-loop thread.

    For sync tests, or tests whose replica is another process: every method
    blocks until the change has taken effect on the proxy's loop.
    """

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        *,
        port: int = 0,
        connect_timeout: float = 5.0,
        call_timeout: float = 10.0,
    ) -> None:
        self.proxy = FaultProxy(upstream_host, upstream_port, port=port, connect_timeout=connect_timeout)
        self.call_timeout = call_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> ThreadedFaultProxy:
        if self._thread is not None:
            return self
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="switchboard-fault-proxy", daemon=True)
        self._thread.start()
        try:
            self._run(self.proxy.start())
        except BaseException:
            self._stop_loop()
            raise
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        try:
            self._run(self.proxy.stop())
        finally:
            self._stop_loop()

    def __enter__(self) -> ThreadedFaultProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self.proxy.port

    def url_for_redis(self, db: int = 0) -> str:
        return self.proxy.url_for_redis(db)

    def pass_through(self) -> None:
        self._call(self.proxy.pass_through)

    def blackhole(self) -> None:
        self._call(self.proxy.blackhole)

    def delay(self, seconds: float) -> None:
        self._call(self.proxy.delay, seconds)

    def drop_new(self, enabled: bool = True) -> None:
        self._call(self.proxy.drop_new, enabled)

    def reset_all(self) -> int:
        return self._call(self.proxy.reset_all)

    def reset_connection(self, conn_id: int) -> bool:
        return self._call(self.proxy.reset_connection, conn_id)

    @property
    def connections(self) -> list[ConnectionInfo]:
        return self._call(lambda: [conn.info() for conn in self.proxy.connections])

    @property
    def stats(self) -> ProxyStats:
        return self._call(lambda: self.proxy.stats)

    def record(self, limit: int = 10_000) -> None:
        self._call(self.proxy.record, limit)

    def recorded(self) -> list[tuple[int, bytes]]:
        return self._call(self.proxy.recorded)

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        async def call() -> T:
            return fn(*args)

        return self._run(call())

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            coro.close()
            raise RuntimeError("ThreadedFaultProxy is not started")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(self.call_timeout)
        except TimeoutError:
            future.cancel()
            raise

    def _stop_loop(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(self.call_timeout)
        if not thread.is_alive():
            loop.close()

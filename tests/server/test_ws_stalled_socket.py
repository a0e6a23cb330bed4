"""A WebSocket client that stops reading for good loses its peer *and* its socket, in bounded time.

tests/security/test_slow_consumer.py checks the peer side of this (1008, detach,
memory), but its stalled client reads again at the end, which drains the
server's buffers and lets a plain close finish. Here the stalled client is a
WebSocket on a bare socket with a tiny receive buffer: it does the upgrade and
the hypha hello, reads its connection_info and then never reads again, not
even after the server gave up on it. A flooder sends it 256 KiB calls; real
hypha-rpc clients (one per transport) keep calling each other. What must hold:

* the stalled peer is closed with 1008 "Send queue full" and detached in
  bounded time, and the flooder's calls to it are answered "not connected";
* what the server holds for it stays bounded: its send queue never passes the
  limit, its connection's write buffer stays small, and so does the RSS;
* the server lets go of the TCP connection in bounded time, while the client
  still does not read: it leaves the server's connections and the server's socket
  leaves the process (psutil); a *close* would wait for ever for the client to
  drain the write buffer;
* shutting the server down afterwards, with that client still connected and
  still not reading, does not hang (it waits for every connection);
* the steady clients keep working.

A second test has the stalled client send its close frame (still without
reading) while the server has bytes buffered for it: the peer goes at once,
and the connection must not outlive it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import psutil
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.uri import parse_uri

from support.stalled import (
    FRAME,
    MAX_FLOOD,
    RSS_BOUND,
    SEND_QUEUE,
    WRITE_BUFFER_BOUND,
    MiB,
    Peaks,
    bystanders,
    collect_rejects,
    connection_transport,
    flood_call,
    read_until_closed,
)
from switchboard.server.ws import websocket
from switchboard.testing.hub import RunningServer, running, settings_for_tests
from switchboard.testing.wait import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

# What is tested is that the server lets go of the socket on its own, not the length of the
# writer's grace before it resets the connection (5 s): a shorter one shows the same, sooner.
WRITER_GRACE = 1.0


@pytest.fixture(autouse=True)
def _short_writer_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(websocket, "WRITER_GRACE", WRITER_GRACE)


DROP_WITHIN = 15.0  # seconds for the stalled peer to be closed, then detached
RELEASE_WITHIN = 10.0  # seconds from the detach to the server letting go of the socket
SHUTDOWN_WITHIN = 6.0  # seconds for the server to stop afterwards (``running`` gives up at 10)


class StalledWebSocket:
    """A WebSocket on a bare socket: upgrade, hello, connection_info, then it never reads again."""

    def __init__(self, url: str) -> None:
        self.uri = parse_uri(url.replace("http", "ws", 1) + "/ws")
        assert self.uri.host == "127.0.0.1", url  # traffic stays on the loopback
        self.proto = ClientProtocol(self.uri, max_size=None)
        self.sock = socket.socket()
        # a small receive window: the server's writes back up after a few KiB
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.setblocking(False)
        self.local_address: tuple[str, int] = ("", 0)  # the client's end, as the server sees it

    async def _flush(self) -> None:
        data = b"".join(self.proto.data_to_send())
        await asyncio.wait_for(asyncio.get_running_loop().sock_sendall(self.sock, data), 5)

    async def handshake(self, client_id: str) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        await asyncio.wait_for(loop.sock_connect(self.sock, (self.uri.host, self.uri.port)), 5)
        self.local_address = self.sock.getsockname()[:2]
        self.proto.send_request(self.proto.connect())
        await self._flush()
        said_hello = False
        for _ in range(100):  # a handful of reads in practice
            data = await asyncio.wait_for(loop.sock_recv(self.sock, 65536), 5)
            assert data, "the server closed during the handshake"
            self.proto.receive_data(data)
            for event in self.proto.events_received():
                if isinstance(event, Frame) and event.opcode == Opcode.TEXT:
                    info = json.loads(event.data)
                    assert info["type"] == "connection_info", info
                    return info
            if not said_hello and self.proto.state is State.OPEN:
                self.proto.send_text(json.dumps({"client_id": client_id}).encode())
                await self._flush()
                said_hello = True
        raise AssertionError("no connection_info")

    async def read_to_end(self, timeout: float) -> tuple[int, str]:
        """Read again at last: ``(bytes read, how the connection ended)``."""
        return await read_until_closed(self.sock, timeout)

    async def send_close(self) -> None:
        """Say goodbye (a close frame), still without reading anything."""
        self.proto.send_close(1000, "bye")
        await self._flush()

    def close(self) -> None:
        self.sock.close()


def server_socket_open(server_port: int, client: tuple[str, int]) -> bool:
    """Whether this process (the server runs in it) still has the server's end of ``client``'s connection."""
    for conn in psutil.Process().net_connections(kind="tcp"):
        if conn.laddr and conn.raddr and conn.laddr[1] == server_port and tuple(conn.raddr) == client:
            return True
    return False


async def serve_then_time_shutdown(
    body: Callable[[RunningServer], Awaitable[None]],
) -> tuple[float | None, str]:
    """Run ``body`` against a fresh server, then stop it: ``(seconds the stop took, "")``, or ``(None, why)``."""
    shutdown_started: float | None = None
    try:
        async with running(settings_for_tests(send_queue_bytes=SEND_QUEUE)) as srv:
            assert urlsplit(srv.url).hostname == "127.0.0.1", srv.url
            await body(srv)
            shutdown_started = time.monotonic()
    # ``running`` gives up (TimeoutError) on a server that does not stop within 10 s
    except Exception as exc:
        if shutdown_started is None:
            raise
        # The abandoned server leaves tasks pending (uvicorn's lifespan); collect them
        # now, not while pytest formats the failure: their dying words (a logged
        # traceback) would re-enter Python 3.11's ast.parse and crash the report.
        gc.collect()
        return None, "hung" if isinstance(exc, TimeoutError) else f"failed: {exc!r}"
    return time.monotonic() - shutdown_started, ""


def assert_let_go(released: float | None, shutdown_took: float | None, shutdown_failure: str, who: str) -> None:
    """The server released ``who``'s connection, and its shutdown was not held up by it."""
    assert released is not None, f"the server still holds the {who}'s TCP connection"
    assert shutdown_took is not None, f"server shutdown with a {who} connected: {shutdown_failure}"
    assert shutdown_took < SHUTDOWN_WITHIN, shutdown_took


def server_port(srv: RunningServer) -> int:
    port = urlsplit(srv.url).port
    assert port is not None, srv.url
    return port


async def test_a_stalled_websocket_is_dropped_and_its_socket_released_in_bounded_time() -> None:
    stalled: StalledWebSocket | None = None
    report: dict[str, Any] = {}

    async def body(srv: RunningServer) -> None:
        nonlocal stalled
        stalled = StalledWebSocket(srv.url)
        await _exercise(srv, stalled, server_port(srv), report)
        # the stalled client is still connected and still not reading while the server stops

    try:
        shutdown_took, shutdown_failure = await serve_then_time_shutdown(body)
        assert stalled is not None
        report["ending"] = await stalled.read_to_end(timeout=5)
    finally:
        if stalled is not None:
            stalled.close()

    peer = report["peer"]
    released = report["released_after"]
    print(  # noqa: T201 - the measurement (-s shows it)
        f"\nWS stalled socket: sent {report['sent']} × 256 KiB, {len(report['rejects'])} rejected; "
        f"closed {peer.close_code} {peer.close_reason!r}; detached after {report['detached_after']:.1f}s; "
        f"socket released {'never' if released is None else f'{released:.1f}s after the detach'}; "
        f"shutdown {shutdown_failure if shutdown_took is None else f'took {shutdown_took:.1f}s'}; "
        f"the stalled client then read {report.get('ending')}; peaks: queue "
        f"{report['peaks']['queued'] / MiB:.2f} MiB, write buffer {report['peaks']['write_buffer'] / 1024:.0f} KiB, "
        f"RSS +{report['rss_growth'] / MiB:.1f} MiB"
    )
    assert_let_go(released, shutdown_took, shutdown_failure, "stalled client")
    assert peer.close_code == 1008, (peer.close_code, peer.close_reason)
    assert "Send queue full" in peer.close_reason
    assert all("is not connected" in r for r in report["rejects"]), report["rejects"][:3]
    assert report["peaks"]["queued"] <= SEND_QUEUE
    assert report["peaks"]["write_buffer"] <= WRITE_BUFFER_BOUND, report["peaks"]["write_buffer"]
    assert report["rss_growth"] < RSS_BOUND, f"RSS grew by {report['rss_growth'] / MiB:.1f} MiB"
    assert report["ending"][1] in ("eof", "reset"), report["ending"]  # the server is gone for it too


async def _exercise(srv: RunningServer, stalled: StalledWebSocket, port: int, report: dict[str, Any]) -> None:
    """Stall, flood, watch the drop and the release; fills ``report``; leaves ``stalled`` open."""
    clients: list[Any] = []
    background: list[asyncio.Task[None]] = []
    try:
        info = await stalled.handshake("stalled")
        target = f"{info['workspace']}/stalled"
        peer = srv.hub.peers[target]
        report["peer"] = peer
        assert connection_transport(srv, stalled.local_address) is not None, (
            "the stalled client's connection is not known to the server"
        )
        assert server_socket_open(port, stalled.local_address)

        steady_ws, steady_http, calc = await bystanders(srv.url, clients, provider="ws")

        peaks = Peaks(srv, peer, stalled.local_address)
        report["peaks"] = peaks.values

        async with ws_connect(srv.url.replace("http", "ws", 1) + "/ws", max_size=None) as flooder:
            await flooder.send(json.dumps({"client_id": "flooder"}))
            assert json.loads(await asyncio.wait_for(flooder.recv(), 5))["type"] == "connection_info"
            rejects: list[str] = []
            report["rejects"] = rejects

            background += [asyncio.create_task(collect_rejects(flooder, rejects)), asyncio.create_task(peaks.run())]
            blob = b"\xab" * FRAME
            started = time.monotonic()
            sent = 0
            first_reject: int | None = None
            for n in range(MAX_FLOOD):
                await asyncio.wait_for(flooder.send(flood_call(target, n, blob)), 10)
                sent += 1
                if n % 40 == 20:
                    assert await steady_http.echo(n) == n
                if rejects and first_reject is None:
                    first_reject = sent
                if first_reject is not None and sent >= first_reject + 40:
                    break  # it was dropped, and the flood went on a while
            report["sent"] = sent
            await eventually(lambda: peer.closed, timeout=DROP_WITHIN, what="the stalled peer to be closed")
            await eventually(
                lambda: target not in srv.hub.peers,
                timeout=DROP_WITHIN,
                what="the stalled peer to be detached",
            )
            detached = time.monotonic()
            report["detached_after"] = detached - started
            await eventually(lambda: rejects, timeout=DROP_WITHIN, what="the flooder's calls to be rejected")
            # Still not reading: the server must let go of the socket on its own.
            report["released_after"] = None
            with contextlib.suppress(AssertionError):  # asserted by the caller, after the report
                await eventually(
                    lambda: (
                        connection_transport(srv, stalled.local_address) is None
                        and not server_socket_open(port, stalled.local_address)
                    ),
                    timeout=RELEASE_WITHIN,
                    what="the server to release the stalled client's TCP connection",
                )
                report["released_after"] = time.monotonic() - detached
            for task in background:
                task.cancel()
            peaks.sample()
        report["rss_growth"] = peaks.rss_growth
        # the others never noticed
        assert await calc.add(2, 3) == 5
        assert await steady_ws.echo("unaffected") == "unaffected"
        assert await steady_http.echo("unaffected") == "unaffected"
    finally:
        for task in background:
            task.cancel()
        # gone before the shutdown: only the stalled client is left
        for client in reversed(clients):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.disconnect(), 5)


async def test_a_client_that_closes_without_reading_does_not_keep_its_socket() -> None:
    """The client's close frame ends the peer, but the server's write buffer for it never drains."""
    stalled: StalledWebSocket | None = None
    report: dict[str, Any] = {}

    async def body(srv: RunningServer) -> None:
        nonlocal stalled
        stalled = StalledWebSocket(srv.url)
        port = server_port(srv)
        info = await stalled.handshake("half-closed")
        target = f"{info['workspace']}/half-closed"
        peer = srv.hub.peers[target]
        transport = connection_transport(srv, stalled.local_address)
        assert transport is not None
        async with ws_connect(srv.url.replace("http", "ws", 1) + "/ws", max_size=None) as flooder:
            await flooder.send(json.dumps({"client_id": "flooder"}))
            assert json.loads(await asyncio.wait_for(flooder.recv(), 5))["type"] == "connection_info"
            blob = b"\xab" * FRAME
            sent = 0
            # Fill the kernel's buffers, stopping as soon as the server has to buffer
            # bytes itself: well short of the send queue limit, so the hub keeps it.
            for n in range(MAX_FLOOD):
                await asyncio.wait_for(flooder.send(flood_call(target, n, blob)), 10)
                sent += 1
                with contextlib.suppress(AssertionError):
                    await eventually(
                        lambda: transport.get_write_buffer_size() > 0,
                        timeout=0.5,
                        what="bytes buffered in the server for the stalled client",
                    )
                    break
            report["sent"] = sent
            assert transport.get_write_buffer_size() > 0, "never backed up"
            assert not peer.closed, (peer.close_code, peer.close_reason)
            await stalled.send_close()
            await eventually(
                lambda: target not in srv.hub.peers,
                timeout=DROP_WITHIN,
                what="the peer to be detached",
            )
            detached = time.monotonic()
            report["peer"] = peer
            report["released_after"] = None
            with contextlib.suppress(AssertionError):  # asserted below, after the report
                await eventually(
                    lambda: (
                        connection_transport(srv, stalled.local_address) is None
                        and not server_socket_open(port, stalled.local_address)
                    ),
                    timeout=RELEASE_WITHIN,
                    what="the server to release the half-closed client's TCP connection",
                )
                report["released_after"] = time.monotonic() - detached

    try:
        shutdown_took, shutdown_failure = await serve_then_time_shutdown(body)
    finally:
        if stalled is not None:
            stalled.close()
    peer = report["peer"]
    released = report["released_after"]
    print(  # noqa: T201 - the measurement (-s shows it)
        f"\nWS half-closed client: sent {report['sent']} × 256 KiB; closed {peer.close_code} {peer.close_reason!r}; "
        f"socket released {'never' if released is None else f'{released:.1f}s after the detach'}; "
        f"shutdown {shutdown_failure if shutdown_took is None else f'took {shutdown_took:.1f}s'}"
    )
    assert_let_go(released, shutdown_took, shutdown_failure, "half-closed client")

"""A client of the HTTP streaming transport that stops reading costs a bounded amount, and only itself.

The WebSocket version of this is tests/security/test_slow_consumer.py. Here the
stalled client is a raw ``GET /rpc`` on a bare socket with a tiny receive
buffer: it reads its connection_info and then never reads again. A flooder
sends it 256 KiB calls. Steady hypha-rpc clients (one per transport) keep
calling each other throughout. What must hold:

* the stalled peer is closed with 1008 "Send queue full" and detached in
  bounded time, although it never reads (nor ends) its stream;
* what the server holds for it stays bounded: its send queue never passes the
  limit and its connection's write buffer stays small, as does the RSS;
* the server closes its TCP connection in bounded time too, while the client
  still does not read: a stuck stream must not hold a socket (nor the server's
  shutdown, which waits for every connection) for ever;
* the flooder's calls to it are answered "not connected" instead of piling up;
* the steady clients keep working, with low latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import statistics
import struct
import time
from typing import Any
from urllib.parse import urlsplit

import h11
import msgpack
import pytest
from websockets.asyncio.client import connect as ws_connect

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
    echo_p50,
    flood_call,
    read_until_closed,
)
from switchboard.server.http import http_rpc
from switchboard.testing.hub import running, settings_for_tests
from switchboard.testing.wait import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

# What is tested is that the stream is dropped in bounded time, not the length of the grace its
# last frame gets before the connection is dropped (5 s): a shorter one shows the same, sooner.
WRITER_GRACE = 1.0


@pytest.fixture(autouse=True)
def _short_writer_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_rpc, "_WRITER_GRACE", WRITER_GRACE)


DROP_WITHIN = 15.0  # seconds from the flood's start to the peer being detached


class StalledStream:
    """``GET /rpc`` on a bare socket: it reads the connection_info frame, then stops reading."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        assert parts.hostname == "127.0.0.1", url  # traffic stays on the loopback
        self.address = (parts.hostname, parts.port)
        self.sock = socket.socket()
        # a small receive window: the server's writes back up after a few KiB
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.setblocking(False)
        self.http = h11.Connection(our_role=h11.CLIENT)
        self.body = b""
        # the client's end, as the server sees it, once connected
        self.local_address: tuple[str, int] = ("", 0)

    async def open(self, client_id: str) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        await asyncio.wait_for(loop.sock_connect(self.sock, self.address), 5)
        self.local_address = self.sock.getsockname()[:2]
        request = h11.Request(
            method="GET",
            target=f"/rpc?client_id={client_id}",
            headers=[
                ("Host", "{}:{}".format(*self.address)),
                ("Accept", "application/x-msgpack-stream"),
            ],
        )
        await loop.sock_sendall(self.sock, self.http.send(request) + self.http.send(h11.EndOfMessage()))
        for _ in range(1000):  # a handful of events in practice
            event = self.http.next_event()
            if event is h11.NEED_DATA:
                data = await asyncio.wait_for(loop.sock_recv(self.sock, 65536), 5)
                assert data, "the server closed the stream before connection_info"
                self.http.receive_data(data)
            elif isinstance(event, h11.Response):
                assert event.status_code == 200, event
            elif isinstance(event, h11.Data):
                self.body += event.data
                if len(self.body) >= 4:
                    (length,) = struct.unpack(">I", self.body[:4])
                    if len(self.body) >= 4 + length:
                        return msgpack.unpackb(self.body[4 : 4 + length])
            else:
                raise AssertionError(f"unexpected {event!r} before connection_info")
        raise AssertionError("no connection_info")

    async def read_to_end(self, timeout: float) -> tuple[int, str]:
        """Read again at last: ``(body bytes, how the stream ended)`` once the server is done with it."""
        return await read_until_closed(self.sock, timeout)

    def close(self) -> None:
        self.sock.close()


async def test_a_stalled_http_stream_is_dropped_in_bounded_time_and_memory() -> None:
    async with running(settings_for_tests(send_queue_bytes=SEND_QUEUE)) as srv:
        stalled = StalledStream(srv.url)
        clients: list[Any] = []
        background: list[asyncio.Task[None]] = []
        try:
            info = await stalled.open("stalled")
            target = f"{info['workspace']}/stalled"
            peer = srv.hub.peers[target]
            connection = connection_transport(srv, stalled.local_address)
            assert connection is not None, "the stalled stream's connection is not known to the server"

            steady_ws, steady_http, calc = await bystanders(srv.url, clients, provider="http")

            p50_before = max(await echo_p50(steady_http), await echo_p50(steady_ws))
            peaks = Peaks(srv, peer, stalled.local_address)

            async with ws_connect(srv.url.replace("http", "ws", 1) + "/ws", max_size=None) as flooder:
                await flooder.send(json.dumps({"client_id": "flooder"}))
                assert json.loads(await flooder.recv())["type"] == "connection_info"
                rejects: list[str] = []

                collector = asyncio.create_task(collect_rejects(flooder, rejects))
                sampling = asyncio.create_task(peaks.run())
                background += [collector, sampling]
                blob = b"\xab" * FRAME
                started = time.monotonic()
                sent = 0
                first_reject: int | None = None
                during: list[float] = []
                for n in range(MAX_FLOOD):
                    await flooder.send(flood_call(target, n, blob))
                    sent += 1
                    if n % 40 == 20:
                        during.append(await echo_p50(steady_http, 3))
                        during.append(await echo_p50(steady_ws, 3))
                    if rejects and first_reject is None:
                        first_reject = sent
                    if first_reject is not None and sent >= first_reject + 40:
                        break  # it was dropped, and the flood went on a while
                await eventually(lambda: peer.closed, timeout=DROP_WITHIN, what="the stalled peer to be closed")
                await eventually(
                    lambda: target not in srv.hub.peers,
                    timeout=DROP_WITHIN,
                    what="the stalled peer to be detached",
                )
                detached_after = time.monotonic() - started
                await eventually(lambda: rejects, timeout=DROP_WITHIN, what="the flooder's calls to be rejected")
                # Still not reading: the server must let go of the socket on its own.
                closed_after: float | None = None
                with contextlib.suppress(AssertionError):  # asserted below, after the report
                    await eventually(
                        lambda: connection_transport(srv, stalled.local_address) is None,
                        timeout=DROP_WITHIN,
                        what="the server to close the stalled client's TCP connection",
                    )
                    closed_after = time.monotonic() - started
                sampling.cancel()
                peaks.sample()
                collector.cancel()
            p50_after = max(await echo_p50(steady_http), await echo_p50(steady_ws))
            received, ending = await stalled.read_to_end(timeout=10)  # it reads again, at last
            growth = peaks.rss_growth
            p50_during = statistics.median(during) if during else 0.0
            socket_closed = "never" if closed_after is None else f"after {closed_after:.1f}s"
            print(  # noqa: T201 - the measurement (-s shows it)
                f"\nHTTP slow consumer: sent {sent} × 256 KiB, {len(rejects)} rejected; "
                f"closed {peer.close_code} {peer.close_reason!r}; detached after {detached_after:.1f}s, "
                f"socket closed {socket_closed}; the stalled client then read {received} B ({ending}); "
                f"peaks: queue {peaks.values['queued'] / MiB:.2f} MiB, write buffer "
                f"{peaks.values['write_buffer'] / 1024:.0f} KiB, RSS +{growth / MiB:.1f} MiB; echo p50 "
                f"{p50_before * 1e3:.1f} ms before, {p50_during * 1e3:.1f} ms during, "
                f"{p50_after * 1e3:.1f} ms after"
            )
            assert closed_after is not None, "the server still holds the stalled client's connection"
            assert peer.close_code == 1008, (peer.close_code, peer.close_reason)
            assert "Send queue full" in peer.close_reason
            assert all("is not connected" in r for r in rejects), rejects[:3]
            assert peaks.values["queued"] <= SEND_QUEUE
            assert peaks.values["write_buffer"] <= WRITE_BUFFER_BOUND, peaks.values["write_buffer"]
            assert growth < RSS_BOUND, f"RSS grew by {growth / MiB:.1f} MiB"
            assert ending in ("eof", "reset"), ending
            assert p50_after < max(5 * p50_before, 0.05), (p50_before, p50_after)
            assert p50_during < max(5 * p50_before, 0.25), (p50_before, p50_during)
            assert await calc.add(2, 3) == 5
            assert await steady_http.echo("unaffected") == "unaffected"
        finally:
            for task in background:
                task.cancel()
            stalled.close()
            for client in reversed(clients):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.disconnect(), 5)

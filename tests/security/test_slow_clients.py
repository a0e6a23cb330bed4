"""Clients that are slow or chatty on purpose are cut off within a bound, and nobody else notices.

Each test serves a real hub in the test's loop with its bounds set small,
attacks it over real sockets, and checks both sides:

* slowloris: HTTP connections that send their request head a line at a time
  get ``408`` and are closed within ``--header-timeout`` (also on a kept-alive
  connection), an endless header gets ``431``, and past
  ``--max-incomplete-heads-per-address`` the longest-waiting ones are closed;
  an honest HTTP client and a hypha-rpc client keep working throughout;
* a flood of ``refresh_token`` text frames takes from the client's rate bucket:
  at most burst + rate × time answers, "Rate limit exceeded" for the rest, all
  with the token the connection already had; the flooder stays connected and
  another client's calls still work;
* WebSocket frames announced at 14 MiB and then stalled (or trickled) are
  closed with 1008 within ``--frame-timeout``, and the memory they held is
  released (traced allocations back near where they started).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from hypha_rpc import connect_to_server
from websockets.asyncio.client import connect as ws_connect
from websockets.client import ClientProtocol
from websockets.frames import Frame
from websockets.uri import parse_uri

from switchboard.server.http import http_protocol
from switchboard.testing.hub import RunningServer, running, settings_for_tests
from switchboard.testing.wait import eventually

pytestmark = pytest.mark.timeout(60)

MiB = 1024 * 1024
HEADER_TIMEOUT = 1.0
FRAME_TIMEOUT = 1.0
SLACK = 1.5  # what a loaded 2-core machine may add to a timer before the close is seen


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def open_connections(server: RunningServer) -> int:
    return len(server.app.state.switchboard.connections.transports)


@contextlib.asynccontextmanager
async def bystander(url: str) -> AsyncIterator[Any]:
    """A hypha-rpc client that must not notice the attack."""
    client = await connect_to_server({"server_url": url, "client_id": "bystander", "method_timeout": 10})
    try:
        yield client
    finally:
        await client.disconnect()


class SlowHead:
    """An HTTP client that sends its request head one header line at a time (slowloris)."""

    def __init__(self, url: str) -> None:
        self.host, self.port = address(url)
        self.sock = socket.socket()
        self.sock.setblocking(False)
        self.opened = 0.0

    async def open(self, first: bytes = b"GET /health/liveness HTTP/1.1\r\nHost: x\r\n") -> None:
        loop = asyncio.get_running_loop()
        await loop.sock_connect(self.sock, (self.host, self.port))
        self.opened = loop.time()
        await loop.sock_sendall(self.sock, first)

    async def trickle(self, *, interval: float, lines: int) -> None:
        """One more header line every ``interval`` s (the attacker's pace), until cut off."""
        loop = asyncio.get_running_loop()
        for n in range(lines):
            await asyncio.sleep(interval)
            try:
                await loop.sock_sendall(self.sock, b"X-Slow-%d: y\r\n" % n)
            except OSError:
                return

    async def answer(self, timeout: float) -> tuple[bytes, float | None]:
        """What the server wrote within ``timeout`` s from now, and seconds from the connect
        until it closed (``None``: still open)."""
        loop = asyncio.get_running_loop()
        received = b""
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            try:
                data = await asyncio.wait_for(loop.sock_recv(self.sock, 65536), deadline - loop.time())
            except TimeoutError:
                break
            except ConnectionResetError:
                return received, loop.time() - self.opened
            if not data:
                return received, loop.time() - self.opened
            received += data
        return received, None

    def close(self) -> None:
        self.sock.close()


async def test_slowloris_connections_get_408_within_the_header_timeout_while_others_work() -> None:
    async with (
        running(settings_for_tests(header_timeout=HEADER_TIMEOUT)) as server,
        bystander(server.url) as client,
        httpx.AsyncClient(base_url=server.url, timeout=5) as honest,
    ):
        slow = [SlowHead(server.url) for _ in range(20)]
        try:
            for s in slow:
                await s.open()
            trickles = [asyncio.create_task(s.trickle(interval=0.3, lines=30)) for s in slow]
            answers = asyncio.gather(*(s.answer(HEADER_TIMEOUT + SLACK + 2) for s in slow))
            served = 0
            for i in range(200):  # honest traffic for as long as the attack lasts
                if answers.done():
                    break
                assert (await honest.get("/health/liveness")).status_code == 200
                assert await client.echo(i) == i
                served += 1
            results = await answers
            await asyncio.gather(*trickles)
        finally:
            for s in slow:
                s.close()
        assert served > 0
        for data, closed_after in results:
            assert data.startswith(b"HTTP/1.1 408 "), data[:80]
            assert closed_after is not None
            assert closed_after < HEADER_TIMEOUT + SLACK, closed_after
        assert (await honest.get("/health/liveness")).status_code == 200
        assert await client.echo("after") == "after"
        watch = server.server.config.http_protocol_class.watch
        assert (watch.waiting, watch.by_address) == ({}, {})  # nothing of the slow ones kept


async def test_a_slow_head_on_a_kept_alive_connection_is_cut_off_too() -> None:
    async with running(settings_for_tests(header_timeout=HEADER_TIMEOUT)) as server:
        slow = SlowHead(server.url)
        try:
            # one honest request, then a slow one
            await slow.open(b"GET /health/liveness HTTP/1.1\r\nHost: x\r\n\r\n")
            loop = asyncio.get_running_loop()
            first = await asyncio.wait_for(loop.sock_recv(slow.sock, 65536), 5)
            assert first.startswith(b"HTTP/1.1 200 ")
            await loop.sock_sendall(slow.sock, b"GET /health/liveness HTTP/1.1\r\n")
            slow.opened = loop.time()
            trickle = asyncio.create_task(slow.trickle(interval=0.3, lines=30))
            data, closed_after = await slow.answer(HEADER_TIMEOUT + SLACK + 2)
            await trickle
        finally:
            slow.close()
        assert data.startswith(b"HTTP/1.1 408 "), data[:80]
        assert closed_after is not None
        assert closed_after < HEADER_TIMEOUT + SLACK


async def test_an_endless_request_header_gets_431_instead_of_being_buffered() -> None:
    async with running(settings_for_tests(max_head_bytes=16 * 1024)) as server:
        slow = SlowHead(server.url)
        try:
            await slow.open(b"GET /health/liveness HTTP/1.1\r\nX-Endless: ")
            loop = asyncio.get_running_loop()
            with contextlib.suppress(OSError):  # the server stops reading: reset, or a full buffer
                for _ in range(64):  # 4 MiB at most
                    await asyncio.wait_for(loop.sock_sendall(slow.sock, b"a" * 65536), 2)
            data, closed_after = await slow.answer(5)
        finally:
            slow.close()
        assert data.startswith(b"HTTP/1.1 431 "), data[:80]
        assert closed_after is not None


async def test_past_the_per_address_bound_the_longest_waiting_heads_are_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http_protocol, "EVICT_AFTER", 0.0)  # the test's heads are all young
    bound = 4
    settings = settings_for_tests(header_timeout=30, max_incomplete_heads_per_address=bound)
    async with running(settings) as server:
        slow = [SlowHead(server.url) for _ in range(10)]
        try:
            for n, s in enumerate(slow):
                await s.open()
                await eventually(
                    lambda n=n: open_connections(server) == min(n + 1, bound),
                    timeout=5,
                    what=f"at most {bound} waiting heads after {n + 1} connects",
                )
            evicted = await asyncio.gather(*(s.answer(5) for s in slow[:-bound]))
            kept = await asyncio.gather(*(s.answer(0.3) for s in slow[-bound:]))
            async with httpx.AsyncClient(base_url=server.url, timeout=5) as honest:
                assert (await honest.get("/health/liveness")).status_code == 200
        finally:
            for s in slow:
                s.close()
        assert all(data.startswith(b"HTTP/1.1 408 ") and after is not None for data, after in evicted)
        assert kept == [(b"", None)] * bound


REFRESH = json.dumps({"type": "refresh_token"})


async def test_a_refresh_token_flood_is_rate_limited_and_gets_no_new_tokens() -> None:
    rate, burst, flood = 50, 100, 2000
    settings = settings_for_tests(max_messages_per_second=rate, message_burst=burst)
    async with running(settings) as server, bystander(server.url) as client:
        url = server.url.replace("http", "ws", 1) + "/ws"
        async with ws_connect(url, max_size=None) as flooder:
            await flooder.send(json.dumps({"client_id": "flooder"}))
            info = json.loads(await flooder.recv())
            loop = asyncio.get_running_loop()
            started = loop.time()
            for _ in range(flood):
                await flooder.send(REFRESH)
            replies = [json.loads(await asyncio.wait_for(flooder.recv(), 5)) for _ in range(flood)]
            window = loop.time() - started
            assert await client.echo("during") == "during"
            assert f"{info['workspace']}/flooder" in server.hub.peers  # refused, not disconnected
            tokens = [r["reconnection_token"] for r in replies if r["type"] == "reconnection_token"]
            errors = [r["message"] for r in replies if r["type"] == "error"]
        assert len(tokens) + len(errors) == flood
        assert len(tokens) <= burst + rate * window + 1, (len(tokens), window)
        assert errors
        assert all(e.startswith("Rate limit exceeded") for e in errors)
        assert set(tokens) == {info["reconnection_token"]}  # reused, not signed again per request
        assert await client.echo("after") == "after"


class RawWebSocket:
    """A hypha-rpc client on a bare socket, to send frames the way no library would."""

    def __init__(self, url: str) -> None:
        self.uri = parse_uri(url.replace("http", "ws", 1) + "/ws")
        self.proto = ClientProtocol(self.uri, max_size=None)
        self.sock = socket.socket()
        self.sock.setblocking(False)

    async def send(self, data: bytes) -> None:
        await asyncio.get_running_loop().sock_sendall(self.sock, data)

    async def handshake(self, client_id: str) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        await loop.sock_connect(self.sock, (self.uri.host, self.uri.port))
        self.proto.send_request(self.proto.connect())
        await self.send(b"".join(self.proto.data_to_send()))
        response = await asyncio.wait_for(loop.sock_recv(self.sock, 65536), 5)
        self.proto.receive_data(response)  # the 101
        self.proto.events_received()
        self.proto.send_text(json.dumps({"client_id": client_id}).encode())
        await self.send(b"".join(self.proto.data_to_send()))
        self.proto.receive_data(await asyncio.wait_for(loop.sock_recv(self.sock, 65536), 5))
        return json.loads(next(e for e in self.proto.events_received() if isinstance(e, Frame)).data)

    async def close_frame(self, timeout: float) -> tuple[int | None, str, float]:
        """The close code and reason the server sent, and the loop's time when they came."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        for _ in range(1 << 20):  # reads, all before the deadline
            data = await asyncio.wait_for(loop.sock_recv(self.sock, 65536), deadline - loop.time())
            if data:
                self.proto.receive_data(data)
            else:
                self.proto.receive_eof()
            close = self.proto.close_rcvd
            if close is not None or not data:
                return (close.code if close else None), (close.reason if close else ""), loop.time()
        raise AssertionError("no close frame within 2**20 reads")

    def close(self) -> None:
        self.sock.close()


def frame_header(length: int) -> bytes:
    """A masked binary frame's header (mask 0: the payload goes as it is)."""
    return bytes([0x82, 0x80 | 127]) + struct.pack("!Q", length) + b"\0\0\0\0"


async def test_stalled_partial_frames_are_closed_in_time_and_their_memory_is_freed() -> None:
    announced, sent = 14 * MiB, 4 * MiB
    part = bytes(sent)  # allocated before tracing: the server's copies are what is counted
    async with (
        running(settings_for_tests(frame_timeout=FRAME_TIMEOUT)) as server,
        bystander(server.url) as client,
    ):
        stallers = [RawWebSocket(server.url) for _ in range(4)]
        trickler = RawWebSocket(server.url)
        tracemalloc.start()
        try:
            for n, ws in enumerate([*stallers, trickler]):
                await ws.handshake(f"staller-{n}")
            assert len(server.hub.peers) == 6
            before = tracemalloc.get_traced_memory()[0]
            started = asyncio.get_running_loop().time()
            for ws in stallers:
                await ws.send(frame_header(announced) + part)  # 4 of 14 MiB, then nothing

            async def trickle() -> None:  # 1 KiB every 0.1 s: never done, never silent
                await trickler.send(frame_header(announced))
                for _ in range(100):
                    with contextlib.suppress(OSError):
                        await trickler.send(bytes(1024))
                    await asyncio.sleep(0.1)

            trickling = asyncio.create_task(trickle())
            await eventually(
                lambda: tracemalloc.get_traced_memory()[0] - before > 3 * sent,
                timeout=5,
                what="the server to hold the partial frames",
            )
            closes = await asyncio.gather(*(ws.close_frame(FRAME_TIMEOUT + SLACK + 3) for ws in stallers))
            trickled = await trickler.close_frame(FRAME_TIMEOUT + SLACK + 3)
            trickling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await trickling
            await eventually(
                lambda: len(server.hub.peers) == 1 and open_connections(server) == 1,
                timeout=5,
                what="the stalled clients to be detached (the bystander's connection left)",
            )
            held_after = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
            for ws in [*stallers, trickler]:
                ws.close()
        for code, reason, at in [*closes, trickled]:
            assert (code, reason) == (1008, f"Message not completed within {FRAME_TIMEOUT:g}s")
            assert at - started < FRAME_TIMEOUT + SLACK, at - started
        assert held_after < sent, f"{held_after / MiB:.1f} MiB still held after the close"
        assert await client.echo("after") == "after"

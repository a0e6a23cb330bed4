"""Helpers for tests of clients that stop reading: the flood, the server's side, the end."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import statistics
import time
from typing import Any

import msgpack

# One stalled-client scenario for the HTTP-stream and WebSocket tests: a 2 MiB
# send queue flooded with 256 KiB calls, and what the server may hold besides.
MiB = 1024 * 1024
SEND_QUEUE = 2 * MiB
FRAME = 256 * 1024
MAX_FLOOD = 400  # 100 MiB at most: 50 × the send queue
# outside its send queue: the transport pauses the writer at 64 KiB, plus the frame in flight
WRITE_BUFFER_BOUND = 64 * 1024 + 2 * FRAME
RSS_BOUND = 3 * SEND_QUEUE + 48 * MiB  # the flood is up to 100 MiB: buffering it would show


def flood_call(target: str, n: int, blob: bytes) -> bytes:
    """A raw call frame carrying ``blob`` to ``target``'s ``sink.take`` (session ``flood-<n>``)."""
    main = {"type": "method", "to": target, "method": "services.sink.take", "session": f"flood-{n}"}
    return msgpack.packb(main) + msgpack.packb({"args": [blob], "with_kwargs": False, "promise": "*", "t": 30})


def uvicorn_connection(server: Any, client: tuple[str, int]) -> Any:
    """uvicorn's protocol object for the connection from ``client``, or ``None`` once it is gone."""
    for connection in list(server.server.server_state.connections):
        if tuple(getattr(connection, "client", None) or ()) == client:
            return connection
    return None


async def read_until_closed(sock: socket.socket, timeout: float) -> tuple[int, str]:
    """Read again at last: ``(bytes read, how the connection ended)`` — "reset", "eof" or still open."""
    loop = asyncio.get_running_loop()
    received = 0
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        try:
            data = await asyncio.wait_for(loop.sock_recv(sock, 1 << 20), deadline - loop.time())
        except ConnectionResetError:
            return received, "reset"
        except TimeoutError:
            break
        if not data:
            return received, "eof"
        received += len(data)
    return received, f"still open after {timeout}s"


async def echo_p50(api: Any, n: int = 15) -> float:
    """Median seconds of ``n`` calls to ``api.echo``: what a bystander client feels."""
    samples = []
    for i in range(n):
        started = time.perf_counter()
        assert await api.echo(i) == i
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


async def collect_rejects(flooder: Any, into: list[str], bound: int = 100_000) -> None:
    """Append the message of each ``.reject`` the flooder gets, until its connection closes
    (at most ``bound`` frames)."""
    from websockets.exceptions import ConnectionClosed

    with contextlib.suppress(ConnectionClosed):
        for _ in range(bound):
            unpacker = msgpack.Unpacker(raw=False)
            unpacker.feed(await flooder.recv())
            main, extra = next(unpacker), next(unpacker, None)
            if str(main.get("method", "")).endswith(".reject"):
                into.append(extra["args"][0]["_rvalue"])


class Peaks:
    """The most this process (the server runs in it) held while a client was stalled:
    its RSS, the peer's send queue and the stalled connection's write buffer.

    :meth:`run` samples every 10 ms until cancelled; call :meth:`sample` once
    more at the end so that the last moment counts too.
    """

    def __init__(self, server: Any, peer: Any, client: tuple[str, int]) -> None:
        import psutil  # a test dependency, like the rest of this module's users

        self._process = psutil.Process()
        self._server, self._peer, self._client = server, peer, client
        self.rss_before = self._process.memory_info().rss
        self.values = {"rss": self.rss_before, "queued": 0, "write_buffer": 0}

    @property
    def rss_growth(self) -> int:
        return self.values["rss"] - self.rss_before

    def sample(self) -> None:
        v = self.values
        v["rss"] = max(v["rss"], self._process.memory_info().rss)
        v["queued"] = max(v["queued"], self._peer.queued_bytes)
        live = uvicorn_connection(self._server, self._client)
        if live is not None and live.transport is not None:
            v["write_buffer"] = max(v["write_buffer"], live.transport.get_write_buffer_size())

    async def run(self) -> None:
        for _ in range(20_000):  # 200 s at most; cancelled long before
            self.sample()
            await asyncio.sleep(0.01)  # the sampling period, not a wait for anything


async def bystanders(url: str, into: list[Any], *, provider: str) -> tuple[Any, Any, Any]:
    """``(steady_ws, steady_http, calc)``: a WebSocket and an HTTP-streaming hypha-rpc client
    (appended to ``into`` for closing) that must not notice a stalled client. The one named by
    ``provider`` ("ws" or "http") connects first and offers ``calc.add``; ``calc`` is the
    other's proxy of it, checked once."""
    from hypha_rpc import connect_to_server

    configs = {
        "ws": {"server_url": url, "client_id": "steady-ws", "method_timeout": 20},
        "http": {"server_url": url, "client_id": "steady-http", "transport": "http", "method_timeout": 20},
    }
    other = "http" if provider == "ws" else "ws"
    connected = {}
    for name in (provider, other):
        connected[name] = await connect_to_server(configs[name])
        into.append(connected[name])
    offering = connected[provider]
    await offering.register_service({"id": "calc", "config": {"visibility": "public"}, "add": lambda a, b: a + b})
    calc = await connected[other].get_service(f"{offering.config['workspace']}/steady-{provider}:calc")
    assert await calc.add(1, 2) == 3
    return connected["ws"], connected["http"], calc

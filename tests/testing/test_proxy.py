"""FaultProxy: each fault does to a real Redis connection what the real network would."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest
import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from switchboard.testing import FaultProxy, ThreadedFaultProxy, ValkeyServer
from switchboard.testing.wait import eventually

PING = b"*1\r\n$4\r\nPING\r\n"
PONG = b"+PONG\r\n"

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@pytest.fixture
def valkey() -> Iterator[ValkeyServer]:
    with ValkeyServer() as server:
        yield server


@pytest.fixture
async def proxy(valkey: ValkeyServer) -> AsyncIterator[FaultProxy]:
    async with FaultProxy("127.0.0.1", valkey.port) as fault_proxy:
        yield fault_proxy


def client_for(proxy: FaultProxy, socket_timeout: float = 5.0) -> aredis.Redis:
    """A client that fails on the first error instead of hiding it behind retries."""
    return aredis.Redis.from_url(
        proxy.url_for_redis(),
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_timeout,
        retry=AsyncRetry(NoBackoff(), 0),
    )


async def raw_connect(proxy: FaultProxy) -> Stream:
    return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", proxy.port), 5.0)


async def raw_ping(stream: Stream, within: float = 5.0) -> bytes:
    reader, writer = stream
    writer.write(PING)
    await writer.drain()
    return await asyncio.wait_for(reader.readexactly(len(PONG)), within)


async def fresh_ping(proxy: FaultProxy) -> bytes:
    """PING over a new connection, closed afterwards."""
    stream = await raw_connect(proxy)
    try:
        return await raw_ping(stream)
    finally:
        stream[1].close()


async def closing(client: aredis.Redis, check: Callable[[aredis.Redis], Awaitable[None]]) -> None:
    try:
        await check(client)
    finally:
        await client.aclose()


async def test_bytes_pass_through_and_are_counted(proxy: FaultProxy) -> None:
    stream = await raw_connect(proxy)
    assert await raw_ping(stream) == PONG
    stats = proxy.stats
    assert (stats.accepted, stats.active) == (1, 1)
    assert (stats.bytes_up, stats.bytes_down, stats.bytes_dropped) == (len(PING), len(PONG), 0)
    assert proxy.url_for_redis(3) == f"redis://127.0.0.1:{proxy.port}/3"

    async def ping(client: aredis.Redis) -> None:
        assert await client.ping() is True

    await closing(client_for(proxy), ping)
    stream[1].close()


async def test_blackhole_times_out_while_the_connection_stays_open(proxy: FaultProxy, valkey: ValkeyServer) -> None:
    stream = await raw_connect(proxy)
    assert await raw_ping(stream) == PONG
    upstream = proxy.connections[0].upstream_addr
    assert upstream is not None
    addr = f"{upstream[0]}:{upstream[1]}"

    proxy.blackhole()
    with pytest.raises(TimeoutError):  # neither a reply nor an EOF nor a reset
        await raw_ping(stream, within=0.5)
    assert proxy.stats.bytes_dropped >= len(PING)
    stream[1].close()  # the client gives up; its FIN is lost in the blackhole too
    await eventually(lambda: proxy.stats.ends_held == 1, "the client's FIN held in the blackhole")
    assert proxy.stats.active == 1
    with valkey.client() as admin:
        assert addr in {entry["addr"] for entry in admin.client_list()}

    proxy.pass_through()  # healed: the FIN arrives and Redis drops the connection
    await eventually(lambda: proxy.stats.active == 0, "proxy to close the connection")


async def test_blackhole_makes_redis_client_time_out(proxy: FaultProxy) -> None:
    async def check(client: aredis.Redis) -> None:
        assert await client.ping() is True
        proxy.blackhole()
        with pytest.raises(redis.TimeoutError):
            await client.ping()
        assert proxy.stats.active == 1
        proxy.pass_through()
        assert await client.ping() is True  # a fresh connection works again

    await closing(client_for(proxy, socket_timeout=0.5), check)


async def test_blackhole_accepts_new_connections_but_forwards_nothing(proxy: FaultProxy) -> None:
    proxy.blackhole()
    stream = await raw_connect(proxy)
    stream[1].write(PING)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(stream[0].readexactly(len(PONG)), 0.5)
    assert proxy.stats.accepted == 1
    proxy.pass_through()  # the held connection now reaches Redis, with its PING
    assert await asyncio.wait_for(stream[0].readexactly(len(PONG)), 5.0) == PONG
    stream[1].close()


async def test_delay_adds_latency_each_way_and_keeps_order(proxy: FaultProxy) -> None:
    async def check(client: aredis.Redis) -> None:
        await client.ping()  # connect and handshake without delay
        proxy.delay(0.2)
        started = time.monotonic()
        assert await client.ping() is True
        assert time.monotonic() - started >= 0.4 - 0.01  # request and reply each delayed
        pipe = client.pipeline(transaction=False)
        for _ in range(50):
            pipe.incr("counter")
        assert await pipe.execute() == list(range(1, 51))

    await closing(client_for(proxy), check)
    with pytest.raises(ValueError, match=">= 0"):
        proxy.delay(-1)


async def test_reset_all_sends_rst_and_new_connections_work(proxy: FaultProxy, valkey: ValkeyServer) -> None:
    stream = await raw_connect(proxy)
    assert await raw_ping(stream) == PONG
    with valkey.client() as admin:
        before = len(admin.client_list())

    assert proxy.reset_all() == 1

    with pytest.raises(ConnectionResetError):  # an RST, not a polite FIN
        await asyncio.wait_for(stream[0].read(1), 5.0)
    with valkey.client() as admin:  # Redis side was reset as well

        def redis_dropped_it() -> bool:
            return len(admin.client_list()) == before - 1

        await eventually(redis_dropped_it, "redis to drop the reset connection")
    assert await fresh_ping(proxy) == PONG
    stream[1].close()


async def test_reset_all_gives_redis_client_a_connection_error(proxy: FaultProxy) -> None:
    async def check(client: aredis.Redis) -> None:
        assert await client.ping() is True
        proxy.reset_all()
        with pytest.raises(redis.ConnectionError):
            await client.ping()
        assert await client.ping() is True  # next call reconnects

    await closing(client_for(proxy), check)


async def test_reset_connection_resets_only_that_one(proxy: FaultProxy) -> None:
    first, second = await raw_connect(proxy), await raw_connect(proxy)
    assert await raw_ping(first) == PONG
    assert await raw_ping(second) == PONG
    ids = [conn.id for conn in proxy.connections]
    assert len(ids) == 2

    assert proxy.reset_connection(ids[0]) is True

    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(first[0].read(1), 5.0)
    assert await raw_ping(second) == PONG
    assert proxy.reset_connection(ids[0]) is False
    first[1].close()
    second[1].close()


async def test_drop_new_refuses_new_connections_but_keeps_existing(proxy: FaultProxy) -> None:
    existing = await raw_connect(proxy)
    assert await raw_ping(existing) == PONG

    proxy.drop_new(True)

    async def refused(client: aredis.Redis) -> None:
        with pytest.raises(redis.ConnectionError):
            await client.ping()

    await closing(client_for(proxy), refused)
    assert proxy.stats.refused >= 1
    assert await raw_ping(existing) == PONG

    proxy.drop_new(False)
    assert await fresh_ping(proxy) == PONG
    existing[1].close()


async def test_unreachable_upstream_resets_the_client(valkey: ValkeyServer) -> None:
    port = valkey.port
    valkey.stop()
    async with FaultProxy("127.0.0.1", port, connect_timeout=2.0) as proxy:
        reader, writer = await raw_connect(proxy)
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(1), 5.0)
        writer.close()


async def test_stop_closes_everything(valkey: ValkeyServer) -> None:
    proxy = await FaultProxy("127.0.0.1", valkey.port).start()
    port = proxy.port
    reader, writer = await raw_connect(proxy)
    assert await raw_ping((reader, writer)) == PONG

    await proxy.stop()

    assert await asyncio.wait_for(reader.read(1), 5.0) == b""
    with pytest.raises(ConnectionRefusedError):
        await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5.0)
    writer.close()


def test_threaded_proxy_works_from_sync_code(valkey: ValkeyServer) -> None:
    def client(proxy: ThreadedFaultProxy) -> redis.Redis:
        # One held connection, no retries: the pool would otherwise quietly
        # replace a connection it finds reset before using it.
        return redis.Redis.from_url(
            proxy.url_for_redis(),
            socket_timeout=0.5,
            retry=Retry(NoBackoff(), 0),
            single_connection_client=True,
        )

    with FaultProxy.in_thread("127.0.0.1", valkey.port) as proxy:
        assert isinstance(proxy, ThreadedFaultProxy)
        with client(proxy) as sync_client:
            assert sync_client.ping() is True
            assert proxy.stats.accepted == 1
            (conn,) = proxy.connections
            assert conn.bytes_up > 0

            proxy.blackhole()
            with pytest.raises(redis.TimeoutError):
                sync_client.ping()
            proxy.delay(0.05)
            assert sync_client.ping() is True

            assert proxy.reset_all() >= 1
            with pytest.raises(redis.ConnectionError):
                sync_client.ping()

            proxy.drop_new(True)
            with pytest.raises(redis.ConnectionError):
                sync_client.ping()
            proxy.pass_through()
            assert sync_client.ping() is True
            assert proxy.reset_connection(proxy.connections[0].id) is True
    assert not any(t.name == "switchboard-fault-proxy" for t in threading.enumerate())

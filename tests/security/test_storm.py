"""A connection storm: 1,000 clients arrive, register, and all leave at once; nothing may stay behind.

A replica process on a real Valkey takes 1,000 raw clients (50 handshakes at a
time), each of which registers its ``built-in`` service, as every hypha-rpc
client does. The RSS they cost is measured. Then every socket closes at the
same moment, as when a load balancer or a network drops them, and the server's
own counters and Redis are checked: no client, service, subscription,
ownership entry or connection count of theirs may be left.
"""

from __future__ import annotations

import asyncio
import json
import re
import resource
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import msgpack
import psutil
import pytest
import pytest_asyncio
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect

from switchboard.testing import ValkeyServer
from switchboard.testing.replica import ReplicaProcess
from switchboard.testing.wait import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(180)]

CLIENTS = 1000
AT_ONCE = 50
KiB = 1024


def raise_open_files_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def gauge(text: str, name: str) -> float:
    match = re.search(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE)
    assert match, f"no {name} in /metrics"
    return float(match.group(1))


@dataclass
class Storm:
    replica: ReplicaProcess
    redis: Any  # a sync redis client on the Valkey the replica uses
    http: httpx.AsyncClient
    baseline_subscriptions: float
    rss_idle: int
    rss_loaded: int
    connect_seconds: float

    async def metrics(self) -> str:
        return (await self.http.get("/metrics")).text


async def join(url: str, n: int) -> ClientConnection:
    """Handshake, then register the built-in service through the manager, as hypha-rpc does."""
    ws = await ws_connect(url, open_timeout=30, close_timeout=5)
    await ws.send(json.dumps({"client_id": f"storm-{n}"}))
    info = json.loads(await asyncio.wait_for(ws.recv(), 30))
    assert info["type"] == "connection_info", info
    session = f"reg-{n}"
    await ws.send(
        msgpack.packb(
            {
                "type": "method",
                "to": f"*/{info['manager_id']}",
                "method": "services.default.register_service",
                "session": session,
            }
        )
        + msgpack.packb(
            {
                "args": [
                    {
                        "id": "built-in",
                        "type": "built-in",
                        "name": f"storm {n}",
                        "config": {"visibility": "public", "api_version": 3},
                    }
                ],
                "with_kwargs": False,
                "promise": "*",
                "t": 30,
            }
        )
    )
    for _ in range(1000):  # frames skipped, each within 30 s
        frame = await asyncio.wait_for(ws.recv(), 30)
        if isinstance(frame, str):
            continue
        unpacker = msgpack.Unpacker(raw=False)
        unpacker.feed(frame)
        main = next(unpacker)
        if main.get("method") in (f"{session}.resolve", f"{session}.reject"):
            assert main["method"].endswith(".resolve"), next(unpacker, None)
            return ws
    raise AssertionError(f"no reply to {session} within 1000 frames")


@pytest.fixture(scope="module")
def valkey() -> Iterator[ValkeyServer]:
    with ValkeyServer() as server:
        yield server


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def storm(valkey: ValkeyServer) -> AsyncIterator[Storm]:
    raise_open_files_limit()
    replica = ReplicaProcess(replica_id="storm", redis_url=valkey.url)
    replica.start()
    try:
        server = psutil.Process(replica.proc.pid)  # type: ignore[union-attr]
        url = replica.url.replace("http", "ws", 1) + "/ws"
        async with httpx.AsyncClient(base_url=replica.url, timeout=10) as http:
            baseline = gauge((await http.get("/metrics")).text, "switchboard_subscriptions_desired")
            warm = await join(url, -1)  # first-connection costs (imports, pools) are not per connection
            await warm.close()
            await eventually(lambda: not valkey.client().hlen("sb:owner"), timeout=10, what="the warm-up client gone")
            rss_idle = server.memory_info().rss
            gate = asyncio.Semaphore(AT_ONCE)

            async def one(n: int) -> ClientConnection:
                async with gate:
                    return await join(url, n)

            started = time.monotonic()
            sockets = await asyncio.gather(*(one(n) for n in range(CLIENTS)))
            connect_seconds = time.monotonic() - started
            text = (await http.get("/metrics")).text
            assert gauge(text, "switchboard_connected_clients") == CLIENTS
            assert gauge(text, "switchboard_registered_services") == CLIENTS
            rss_loaded = server.memory_info().rss
            # all of them leave at the same moment
            await asyncio.gather(*(ws.close() for ws in sockets))
            storm = Storm(replica, valkey.client(), http, baseline, rss_idle, rss_loaded, connect_seconds)
            print(  # noqa: T201 - the measurement the issue asks for (-s shows it)
                f"\nstorm: {CLIENTS} clients connected and registered in {connect_seconds:.1f}s "
                f"({AT_ONCE} at a time); server RSS {rss_idle / KiB / KiB:.1f} -> {rss_loaded / KiB / KiB:.1f} MiB, "
                f"{(rss_loaded - rss_idle) / CLIENTS / KiB:.1f} KiB per idle connection"
            )
            yield storm
    finally:
        replica.kill()


async def test_every_client_is_detached_and_its_subscriptions_released(storm: Storm) -> None:
    async def settled() -> bool:
        text = await storm.metrics()
        return (
            gauge(text, "switchboard_connected_clients") == 0
            and gauge(text, "switchboard_subscriptions_desired") == storm.baseline_subscriptions
        )

    await eventually(settled, timeout=30, what="no client and only the replica's own subscriptions left")
    text = await storm.metrics()
    assert gauge(text, "switchboard_subscriptions_confirmed") == storm.baseline_subscriptions
    assert storm.redis.pubsub_channels("sb:client:*") == []
    assert storm.redis.pubsub_channels("sb:ws:*") == []
    assert storm.replica.is_running()


async def test_an_idle_connection_costs_little_memory(storm: Storm) -> None:
    per_connection = (storm.rss_loaded - storm.rss_idle) / CLIENTS
    assert per_connection < 256 * KiB, f"{per_connection / KiB:.0f} KiB per idle connection"


async def test_no_registration_or_ownership_is_left_in_redis(storm: Storm) -> None:
    await eventually(lambda: _registry_leftovers(storm) == {}, timeout=20, what="no registration left in Redis")
    assert gauge(await storm.metrics(), "switchboard_registered_services") == 0


async def test_no_connection_count_is_left_in_redis(storm: Storm) -> None:
    def counters() -> list[bytes]:
        return _keys(storm, "sb:conns:u:*") + _keys(storm, "sb:conns:w:*")

    await eventually(lambda: not counters(), timeout=20, what="no connection counter left in Redis")


async def test_the_replica_keeps_no_index_entry_of_departed_clients(storm: Storm) -> None:
    index = "sb:conns:keys:storm"
    await eventually(lambda: not storm.redis.scard(index), timeout=5, what=f"{index} to be empty")


def _keys(storm: Storm, pattern: str) -> list[bytes]:
    return list(storm.redis.scan_iter(match=pattern, count=1000))


def _registry_leftovers(storm: Storm) -> dict[str, Any]:
    r = storm.redis
    left = {
        "sb:owner": r.hlen("sb:owner"),
        "sb:replica:storm:clients": r.scard("sb:replica:storm:clients"),
        "sb:workspaces": r.scard("sb:workspaces"),
        "sb:svc:*": len(_keys(storm, "sb:svc:*")),
    }
    return {key: n for key, n in left.items() if n}

"""Hundreds of clients leaving one replica at once: Redis's work is batched, bounded and complete.

One real replica on a real Valkey 5 ms away each way (the fault proxy's
latency: Redis in another zone), with two command connections
(``--redis-max-connections 2``), so that a departure sending one command per
client per step runs out of them the way 10,000 clients did on the default
pool and loopback ("No connection available" for the transit mark, the count
release and the registrations' removal; 18-24 s back to baseline, and nobody
checked that everything was cleaned). Half the clients drop (in transit, then
announced gone after the grace), half say goodbye; then Redis itself is read:
every registration, owner and holder entry, transit mark and connection count
of theirs must be gone, within 5 s of the grace's end.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from switchboard.hub.identity.users import user_workspace
from switchboard.testing import ThreadedFaultProxy, ValkeyServer
from switchboard.testing.crowd import RawClient, admin_token, let_go, open_raw
from switchboard.testing.replica import ReplicaProcess
from switchboard.testing.wait import eventually, scaled

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

CLIENTS = 400
POOL = 2  # --redis-max-connections: one command at a time each, 200 a second with Redis 10 ms away
LATENCY = 0.005  # each way, between the replica and Valkey
GRACE = 1.0  # --transit-grace: the dropped half is announced gone after it
BACK_WITHIN = 5.0  # after the grace, everything is cleaned within this
CONNECTING = 50  # handshakes at a time


def leftovers(redis: ValkeyServer, workspace: str, user: str, replica: str, ids: set[str]) -> dict[str, Any]:
    """What Redis still holds of the clients ``ids`` (``<ws>/<cid>``) and of the replica's counts."""
    with redis.client() as r:
        fields = [f.decode() for f in r.hkeys(f"sb:svc:{workspace}")]
        left: dict[str, Any] = {
            "registrations": [f for f in fields if f"{workspace}/{f.partition(':')[0]}" in ids],
            "owners": [o.decode() for o in r.hkeys("sb:owner") if o.decode() in ids],
            "holders": [h.decode() for h in r.hkeys("sb:holder") if h.decode() in ids],
            "owned": r.scard(f"sb:replica:{replica}:clients"),
            "in transit": r.zcard("sb:transit") + r.hlen("sb:transit:left"),
            "user count": r.hget(f"sb:conns:u:{user}", replica),
            "workspace count": r.hget(f"sb:conns:w:{workspace}", replica),
        }
    return {k: v for k, v in left.items() if v}


async def open_crowd(url: str, token: str, count: int) -> list[RawClient]:
    """``count`` raw clients ``c0``, ``c1``, ... on ``url``, at most ``CONNECTING`` connecting at once."""
    gate = asyncio.Semaphore(CONNECTING)

    async def one(cid: str) -> Any:
        async with gate:
            return await open_raw(url, cid, token)

    return await asyncio.gather(*(one(f"c{i}") for i in range(count)))


async def test_hundreds_leaving_at_once_are_cleaned_from_redis_without_running_out_of_connections(redis_server):
    user = "crowd"
    workspace = user_workspace(user)
    proxy = ThreadedFaultProxy("127.0.0.1", redis_server.port).start()
    replica = ReplicaProcess(
        replica_id="ra",
        redis_url=proxy.url_for_redis(),
        args=["--transit-grace", str(GRACE), "--redis-max-connections", str(POOL), "--no-links"],
    ).start()
    clients: list[RawClient] = []
    try:
        clients = await open_crowd(replica.url, admin_token(user), CLIENTS)  # on a fast Redis
        everyone = {client.address for client in clients}

        def all_registered() -> bool:
            return len(leftovers(redis_server, workspace, user, "ra", everyone).get("registrations", [])) == CLIENTS

        await eventually(all_registered, "every client's built-in service registered", timeout=30)
        proxy.delay(LATENCY)
        started = time.monotonic()
        for i, client in enumerate(clients):
            client.leave(goodbye=i % 2 == 0)
        await eventually(
            lambda: not leftovers(redis_server, workspace, user, "ra", everyone),
            "every registration, owner and holder entry, transit mark and count cleaned",
            timeout=GRACE + BACK_WITHIN + 30,  # bounded; the time it took is asserted below
            interval=0.05,
        )
        took = time.monotonic() - started
        log = replica.log_tail(limit=10_000_000)
        assert "No connection available" not in log, log[-3000:]
        for failure in (
            "not released yet",
            "registrations not removed yet",
            "cannot put the client in transit",
            "not settled",
        ):
            assert failure not in log, (
                f"{failure!r} in the replica's log:\n"
                + "\n".join(line for line in log.splitlines() if failure in line)[:3000]
            )
        assert took < scaled(GRACE + BACK_WITHIN), f"Redis back to baseline {took:.1f} s after the crowd left"
    finally:
        await let_go(clients)
        replica.kill()
        proxy.stop()


CROWD = 300  # clients leaving at once, each with its own channel to unsubscribe
UNSUBSCRIBES_AT_MOST = CROWD // 20  # UNSUBSCRIBE commands they may cost (one each: 300)
# young collections they may cost (4, at one each 2,000 objects; with CPython's defaults, 13 to 20)
YOUNG_COLLECTIONS_AT_MOST = CROWD // 50


def command_calls(redis: ValkeyServer) -> dict[str, int]:
    """Redis's own count of the commands it ran since the last reset, by name."""
    with redis.client() as r:
        stats = r.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(fields["calls"]) for name, fields in stats.items()}


async def collections(replica: ReplicaProcess) -> list[int]:
    """The replica process's garbage collections so far, by generation (from its metrics; none: not reported)."""
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{replica.url}/metrics", timeout=5)).text
    counts = {}
    for line in text.splitlines():
        if line.startswith("switchboard_gc_collections_total{"):
            counts[int(line.partition('generation="')[2][0])] = int(float(line.rpartition(" ")[2]))
    return [counts[generation] for generation in sorted(counts)]


async def test_a_crowd_leaving_at_once_costs_a_few_unsubscribes_and_garbage_collections(redis_server):
    """A crowd leaving at once is a burst of work, and its cost is bounded in two places found by
    profiling 10,000 clients leaving. Each client's channel is unsubscribed: a crowd's go out
    together (one UNSUBSCRIBE naming many channels), not a command each. And each departure's
    short-lived objects die young (server/process/collector.py): with CPython's defaults they were promoted
    and set off full collections, half the replica's CPU while the crowd left. Read from Valkey's
    own command statistics and from the replica's metrics."""
    user = "leavers"
    workspace = user_workspace(user)
    replica = ReplicaProcess(replica_id="ra", redis_url=redis_server.url, args=["--no-links"]).start()
    clients: list[RawClient] = []
    try:
        clients = await open_crowd(replica.url, admin_token(user), CROWD)
        everyone = {client.address for client in clients}

        def all_registered() -> bool:
            return len(leftovers(redis_server, workspace, user, "ra", everyone).get("registrations", [])) == CROWD

        await eventually(all_registered, "every client's built-in service registered", timeout=30)
        with redis_server.client() as r:
            r.config_resetstat()
        before = await collections(replica)
        for client in clients:
            client.leave(goodbye=True)
        await eventually(
            lambda: not leftovers(redis_server, workspace, user, "ra", everyone),
            "every registration, owner and holder entry and count cleaned",
            timeout=30,
            interval=0.05,
        )
        after = await collections(replica)
        # the channel is unsubscribed before the registrations are removed: all sent by now
        unsubscribes = command_calls(redis_server).get("unsubscribe", 0)
        assert 1 <= unsubscribes <= UNSUBSCRIBES_AT_MOST, (
            f"{CROWD} clients leaving at once cost {unsubscribes} UNSUBSCRIBE commands"
        )
        assert len(before) == len(after) == 3, f"garbage collections by generation: {before}, {after}"
        young, full = after[0] - before[0], after[2] - before[2]
        cost = f"{CROWD} clients leaving at once cost {young} young and {full} full garbage collections"
        assert young <= YOUNG_COLLECTIONS_AT_MOST, cost
        assert full == 0, cost
    finally:
        await let_go(clients)
        replica.kill()

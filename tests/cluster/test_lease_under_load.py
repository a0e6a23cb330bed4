"""Client work that saturates a replica's Redis connections never costs it the leader lease.

Once a leader lost its lease while clients kept it busy: its renewal waited
behind their commands. Here one real replica leads on a real Valkey 20 ms away
(the fault proxy's latency) with one command connection
(``--redis-max-connections 1``), and clients registering services all at once
queue many seconds of commands on it (most wait longer than the pool's 2 s: their
checks of singleton namesakes are skipped, or they are deferred). The lease (3 s, renewed every second, given up 2.4 s after the
last renewal) and the presence record (rewritten every 2 s) must keep their
deadlines through it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from switchboard.testing import ThreadedFaultProxy, ValkeyServer
from switchboard.testing.crowd import admin_token, open_raw
from switchboard.testing.replica import ReplicaProcess
from switchboard.testing.wait import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.alone, pytest.mark.timeout(120)]

LEASE_TTL = 3.0
LATENCY = 0.02  # each way, between the replica and Valkey
CLIENTS = 20
SERVICES_EACH = 25  # 500 registrations: 20 s of commands one at a time over one connection
LOADED_FOR = 6.0  # seconds watched while the commands queue: two lease lifetimes
PRESENCE_EVERY = 2.0  # replicas/upkeep/cluster.py PRESENCE_INTERVAL


def leader(redis: ValkeyServer) -> str | None:
    with redis.client() as r:
        holder = r.get("sb:leader")
    return holder.decode().partition("#")[0] if holder else None


def seen(redis: ValkeyServer) -> float | None:
    """When the replica last wrote its presence record (None: the record expired)."""
    with redis.client() as r:
        raw = r.hget("sb:presence:ra", "seen")
    return float(raw) if raw else None


async def test_a_leader_keeps_its_lease_and_presence_while_clients_saturate_its_redis_connections(redis_server):
    proxy = ThreadedFaultProxy("127.0.0.1", redis_server.port).start()
    replica = ReplicaProcess(
        replica_id="ra",
        redis_url=proxy.url_for_redis(),
        args=["--leader-lease-ttl", str(LEASE_TTL), "--redis-max-connections", "1", "--no-links"],
    ).start()
    conns: list[Any] = []
    try:
        await eventually(lambda: leader(redis_server) == "ra", "ra leads", timeout=10)
        token = admin_token("busy")
        conns = [await open_raw(replica.url, f"b{i}", token) for i in range(CLIENTS)]  # on a fast Redis
        await eventually(lambda: seen(redis_server) is not None, "a presence record", timeout=10)
        proxy.delay(LATENCY)
        await asyncio.gather(*(client.register(f"s{n}") for client in conns for n in range(SERVICES_EACH)))
        loop = asyncio.get_running_loop()
        until = loop.time() + LOADED_FOR
        holders: set[str | None] = set()
        writes: list[float | None] = []
        while loop.time() < until:  # bounded: LOADED_FOR seconds, a read every 100 ms
            holders.add(await asyncio.to_thread(leader, redis_server))
            writes.append(await asyncio.to_thread(seen, redis_server))
            await asyncio.sleep(0.1)
        log = replica.log_tail(limit=10_000_000)
        waited = log.count("deferred") + log.count("singleton check of")
        assert waited >= CLIENTS, "the clients' registrations never waited: the test did not load the replica"
        troubles = "\n".join(line for line in log.splitlines() if "lease" in line or "presence" in line)
        assert holders == {"ra"}, f"lease holders seen under load: {holders}\n{troubles}"
        assert None not in writes, f"the presence record expired under load\n{troubles}"
        times = sorted({w for w in writes if w is not None})
        gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
        assert len(times) >= 3, f"presence written {len(times)} times in {LOADED_FOR} s\n{troubles}"
        assert max(gaps) < PRESENCE_EVERY + 1.0, f"presence rewritten only after {max(gaps):.1f} s\n{troubles}"
        for trouble in ("lost lease", "renew failed", "presence update failed"):
            assert trouble not in log, f"{trouble!r} in the replica's log:\n{troubles}"
    finally:
        for client in conns:
            client.leave(goodbye=False)
        replica.kill()
        proxy.stop()

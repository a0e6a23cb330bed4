"""Faults injected for real between a replica process and Redis."""

from __future__ import annotations

import httpx
import pytest

from switchboard.testing import ThreadedFaultProxy
from switchboard.testing.replica import ReplicaProcess
from switchboard.testing.wait import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(90)]


def readiness(replica: ReplicaProcess) -> int:
    return httpx.get(f"{replica.url}/health/readiness", timeout=2).status_code


async def test_a_silently_dead_pubsub_connection_turns_readiness_503_then_heals(redis_server):
    with ThreadedFaultProxy("127.0.0.1", redis_server.port) as proxy:
        replica = ReplicaProcess(replica_id="rp", redis_url=proxy.url_for_redis()).start()
        try:
            assert readiness(replica) == 200
            proxy.blackhole()  # no error, no close: bytes just stop flowing
            await eventually(lambda: readiness(replica) == 503, timeout=15, what="readiness 503")
            proxy.pass_through()
            await eventually(lambda: readiness(replica) == 200, timeout=15, what="readiness back to 200")
        finally:
            replica.kill()


async def test_metrics_show_subscription_health_and_leadership(replicas, clients):
    a = replicas.start("ra")
    await clients(a.url, client_id="someone")
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{a.url}/metrics", timeout=5)).text
    for name in (
        "switchboard_subscriptions_desired",
        "switchboard_subscriptions_confirmed",
        "switchboard_subscription_repairs",
        "switchboard_bus_publishes_to_nobody",
        "switchboard_is_leader",
        "switchboard_reaper_suspects",
        "switchboard_reaped_clients",
        "switchboard_redis_reconnects",
    ):
        assert f'{name}{{replica="ra"}}' in text or f'{name}_total{{replica="ra"}}' in text, name


async def test_pubsub_connections_killed_on_the_redis_side_are_rewired(replicas, clients, redis_server):
    a, b = replicas.start("ra"), replicas.start("rb")
    provider = await clients(a.url, client_id="prov")
    ws = provider.config["workspace"]
    await provider.register_service({"id": "s", "config": {"visibility": "public"}, "f": lambda: "ok"})
    caller = await clients(b.url, client_id="caller")
    svc = await caller.get_service(f"{ws}/prov:s")
    assert redis_server.kill_clients(type_="pubsub") >= 2
    await eventually(lambda: _works(svc), timeout=10, what="cross-replica call after CLIENT KILL TYPE pubsub")


async def _works(svc) -> bool:
    return await svc.f() == "ok"

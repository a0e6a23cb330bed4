"""Replicas come and go, and Redis may lose everything: the hub converges without help."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from switchboard.backends.redis.stores.presence import LEADER_KEY, PRESENCE_PREFIX
from switchboard.testing.wait import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def owners(redis_server) -> dict[str, str]:
    raw = redis_server.client().hgetall("sb:owner")
    return {k.decode(): v.decode() for k, v in raw.items()}


async def test_a_booting_replica_leaves_shared_state_alone(replicas, clients, redis_server):
    a = replicas.start("ra")
    provider = await clients(a.url, client_id="prov")
    ws = provider.config["workspace"]
    await provider.register_service({"id": "s", "config": {"visibility": "public"}, "f": lambda: 1})
    before = owners(redis_server)
    b = replicas.start("rb")  # boots while A serves
    assert owners(redis_server) == before
    caller = await clients(b.url, client_id="caller")
    assert await (await caller.get_service(f"{ws}/prov:s")).f() == 1


async def test_sigterm_removes_only_the_replicas_own_state(replicas, clients, redis_server):
    grace = ("--transit-grace", "1")
    a, b = replicas.start("ra", *grace), replicas.start("rb", *grace)
    on_a = await clients(a.url, client_id="on-a")
    on_b = await clients(b.url, client_id="on-b")
    ws_a, ws_b = on_a.config["workspace"], on_b.config["workspace"]
    await eventually(lambda: len(owners(redis_server)) == 2, timeout=5, what="both owners")
    assert a.terminate() == 0
    await on_a.disconnect()  # would otherwise keep reconnecting to the dead address
    assert not redis_server.client().exists(PRESENCE_PREFIX + "ra")
    assert redis_server.client().exists(PRESENCE_PREFIX + "rb")
    # on-a was sent away in transit: its registration goes once the grace is over, not before
    await eventually(
        lambda: f"{ws_a}/on-a" not in owners(redis_server),
        timeout=6,
        what="the client that never came back removed after its grace",
    )
    assert owners(redis_server).get(f"{ws_b}/on-b") == "rb"


async def test_redis_restarted_empty_under_traffic_heals_without_a_manual_step(replicas, clients, redis_server):
    a, b = replicas.start("ra"), replicas.start("rb")
    provider = await clients(a.url, client_id="prov")
    ws = provider.config["workspace"]
    await provider.register_service({"id": "s", "config": {"visibility": "public"}, "f": lambda x: x})
    caller = await clients(b.url, client_id="caller")
    svc = await caller.get_service(f"{ws}/prov:s")
    assert await svc.f(1) == 1
    redis_server.restart()  # same port, no data: registrations and subscriptions are gone
    loop = asyncio.get_running_loop()
    started = loop.time()
    await eventually(lambda: _call(svc, 2), timeout=15, what="cross-replica call after the restart")
    healed_in = loop.time() - started
    await eventually(lambda: _listed(caller, f"{ws}/prov:s"), timeout=10, what="registration re-asserted")
    print(f"Redis restart -> cross-replica call works again in {healed_in:.2f}s")


async def _call(svc, value):
    return await asyncio.wait_for(svc.f(value), 3) == value


async def _listed(client, service_id):
    return service_id in {s["id"] for s in await client.list_services(ws_of(service_id))}


async def test_a_sigkilled_leader_is_replaced_within_the_lease_ttl(replicas, redis_server):
    ttl = "1.5"
    first = replicas.start("r1", "--leader-lease-ttl", ttl)
    second = replicas.start("r2", "--leader-lease-ttl", ttl)
    r = redis_server.client()
    holder = await eventually(lambda: r.get(LEADER_KEY), timeout=10, what="a leader")
    leader, follower = (first, second) if holder.decode().startswith("r1#") else (second, first)
    loop = asyncio.get_running_loop()
    leader.kill()
    killed = loop.time()
    await eventually(
        lambda: (r.get(LEADER_KEY) or b"").decode().startswith(follower.replica_id + "#"),
        timeout=6,
        what="the follower taking the lease",
    )
    took = loop.time() - killed
    assert took <= 1.5 + 0.5 + 1.0, f"failover took {took:.2f}s"  # ttl + renew interval + polling slack
    print(f"leader SIGKILL -> new leader in {took:.2f}s (ttl 1.5s)")


async def test_a_dead_replicas_registrations_are_reaped_not_left_forever(replicas, clients, redis_server):
    fast = ("--orphan-reap-interval", "0.5", "--orphan-reap-min-failures", "2", "--leader-lease-ttl", "1.5")
    a = replicas.start("ra", *fast)
    b = replicas.start("rb", *fast)
    victim = await clients(a.url, client_id="victim")
    ws = victim.config["workspace"]
    await victim.register_service({"id": "s", "config": {"visibility": "public"}, "f": lambda: 1})
    watcher = await clients(b.url, client_id="watcher")
    a.kill()
    await victim.disconnect()
    await eventually(lambda: _gone(watcher, f"{ws}/victim:s"), timeout=20, what="the dead replica's service reaped")
    assert f"{ws}/victim" not in owners(redis_server)


async def _gone(client, service_id):
    return service_id not in {s["id"] for s in await client.list_services(ws_of(service_id))}


def ws_of(service_id: str) -> str:
    return service_id.partition("/")[0]


async def test_live_clients_are_never_reaped_though_probed(replicas, clients, redis_server):
    fast = ("--orphan-reap-interval", "0.3", "--orphan-reap-min-failures", "2", "--leader-lease-ttl", "1.5")
    a = replicas.start("ra", *fast)
    alive = await clients(a.url, client_id="alive")
    ws = alive.config["workspace"]
    await alive.register_service({"id": "s", "config": {"visibility": "public"}, "f": lambda: 1})
    # make it a candidate: its owner's presence vanishes while the client lives on
    r = redis_server.client()
    r.hset("sb:owner", f"{ws}/alive", "ghost-replica")
    await eventually(lambda: _reaper_passes(a) >= 4, timeout=15, what="several reaper passes")
    assert f"{ws}/alive" in owners(redis_server)


def _reaper_passes(replica) -> int:
    return replica.log_tail(200_000).count("reaper pass:")


def test_status_prints_every_replica_and_the_leader(replicas, redis_server):
    replicas.start("ra")
    replicas.start("rb")
    out = subprocess.run(
        [sys.executable, "-m", "switchboard", "status", "--redis-url", redis_server.url],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert "REPLICA" in out
    assert "ra" in out
    assert "rb" in out
    assert "2 replicas; leader: r" in out


async def test_a_redis_outage_costs_calls_but_never_the_connections(replicas, clients, redis_server):
    a, b = replicas.start("ra"), replicas.start("rb")
    provider = await clients(a.url, client_id="prov")
    ws = provider.config["workspace"]
    await provider.register_service({"id": "s", "config": {"visibility": "public"}, "f": lambda: "ok"})
    caller = await clients(b.url, client_id="caller", method_timeout=5)
    svc = await caller.get_service(f"{ws}/prov:s")
    peers_before = _connections(b)
    redis_server.kill()
    # the call takes the direct link between the replicas, and its answer comes back the same way
    # (the caller's channel offered with the call): it needs no Redis (issue 40); it used to fail
    assert await asyncio.wait_for(svc.f(), 10) == "ok"
    await caller.register_service({"id": "mine", "config": {"visibility": "public"}, "g": lambda: 1})
    redis_server.start()
    await eventually(lambda: _call_ok(svc), timeout=15, what="calls after Redis came back")
    await eventually(
        lambda: _listed(provider, f"{caller.config['workspace']}/caller:mine"),
        timeout=10,
        what="the registration made during the outage",
    )
    assert _connections(b) == peers_before, "the caller must not have been disconnected"
    assert "Exception in ASGI application" not in b.log_tail(100_000)


def _connections(replica) -> int:
    return replica.log_tail(1_000_000).count("connected (reconnecting=")


async def _call_ok(svc) -> bool:
    return await asyncio.wait_for(svc.f(), 3) == "ok"


async def test_clients_of_one_workspace_leaving_together_are_all_cleaned_up(replicas, clients, redis_server):
    a = replicas.start("ra")
    owner = await clients(a.url, client_id="owner")
    token = await owner.generate_token()
    ws = owner.config["workspace"]
    crowd = [await clients(a.url, client_id=f"m{i}", token=token) for i in range(12)]
    await eventually(lambda: len(owners(redis_server)) == 13, timeout=10, what="13 registered clients")
    await asyncio.gather(*(c.disconnect() for c in [owner, *crowd]))
    await eventually(lambda: not owners(redis_server), timeout=10, what="every registration removed")
    assert not redis_server.client().keys(f"sb:svc:{ws}")
    log = a.log_tail(1_000_000)
    assert "Traceback" not in log, log[-3000:]

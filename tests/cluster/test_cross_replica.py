"""Two replicas sharing one Valkey behave as one hub."""

from __future__ import annotations

import asyncio

import pytest
from hypha_rpc.rpc import RemoteException

from switchboard.testing.wait import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(90)]


async def gen(n):
    for i in range(n):
        yield i


def provider_service():
    def fail():
        raise RuntimeError("provider says no")

    return {
        "id": "svc",
        "config": {"visibility": "public"},
        "add": lambda a, b=1: a + b,
        "size": lambda data: len(data),
        "give": lambda n: b"z" * n,
        "call_back": lambda f, x: f(x),
        "count": gen,
        "fail": fail,
    }


async def test_a_client_on_one_replica_uses_every_feature_of_a_service_on_another(replicas, clients):
    a, b = replicas.start("ra"), replicas.start("rb")
    provider = await clients(a.url, client_id="prov")
    ws = provider.config["workspace"]
    await provider.register_service(provider_service())
    token = await provider.generate_token()  # generated on A ...
    caller = await clients(b.url, client_id="caller", token=token)  # ... accepted on B
    assert caller.config["workspace"] == ws
    assert caller.config["manager_id"] == provider.config["manager_id"]
    svc = await caller.get_service("prov:svc")
    assert await svc.add(2, b=5) == 7
    assert await svc.size(b"\x01" * (10 * 1024 * 1024)) == 10 * 1024 * 1024
    assert len(await svc.give(10 * 1024 * 1024)) == 10 * 1024 * 1024
    assert await svc.call_back(lambda v: v * 3, 5) == 15
    assert [i async for i in await svc.count(4)] == [0, 1, 2, 3]
    with pytest.raises(RemoteException, match="provider says no"):
        await svc.fail()
    listed = {s["id"] for s in await caller.list_services()}
    assert {f"{ws}/prov:svc", f"{ws}/prov:built-in", f"{ws}/caller:built-in"} <= listed
    assert f"{ws}/prov" in {c["id"] for c in await caller.list_clients()}
    assert await caller.ping("prov") == "pong"


async def test_events_reach_subscribers_on_every_replica(replicas, clients):
    a, b = replicas.start("ra"), replicas.start("rb")
    alice = await clients(a.url, client_id="alice")
    token = await alice.generate_token()
    bob = await clients(b.url, client_id="bob", token=token)
    got: list = []
    bob.on("news", got.append)
    bob.on("service_added", got.append)
    await bob.subscribe(["news", "service_added"])
    await alice.emit({"type": "news", "to": "*", "data": {"n": 1}})
    await alice.register_service({"id": "late", "f": lambda: 1})
    await eventually(lambda: len(got) >= 2, timeout=5, what="both events on B")
    kinds = {e["type"] for e in got}
    assert kinds == {"news", "service_added"}


async def test_callbacks_cross_replicas_and_workspaces_in_both_directions(replicas, clients):
    a, b = replicas.start("ra"), replicas.start("rb")
    provider = await clients(a.url, client_id="prov")
    await provider.register_service(provider_service())
    stranger = await clients(b.url, client_id="stranger")  # another workspace, on B
    assert stranger.config["workspace"] != provider.config["workspace"]

    async def stranger_double(v):
        return v * 2

    svc = await stranger.get_service(f"{provider.config['workspace']}/prov:svc")
    assert await svc.call_back(stranger_double, 21) == 42
    # and the other way round: B's public service, called from A with a callback
    await stranger.register_service(provider_service())
    back = await provider.get_service(f"{stranger.config['workspace']}/stranger:svc")
    assert await back.call_back(lambda v: v + 1, 1) == 2


async def test_a_call_to_a_client_no_replica_holds_fails_fast_not_at_the_timeout(replicas, clients):
    # a retry window of 1 s, not the default 6: what is tested is failing well before the call's timeout
    window = ("--undeliverable-retry-window", "1")
    a, b = replicas.start("ra", *window), replicas.start("rb", *window)
    provider = await clients(a.url, client_id="prov")
    await provider.register_service(provider_service())
    token = await provider.generate_token()
    caller = await clients(b.url, client_id="caller", token=token, method_timeout=30)
    svc = await caller.get_service("prov:svc")
    a.kill()  # the provider's replica dies: its registration stays until reaped
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(Exception, match="not connected"):
        await svc.add(1)
    elapsed = loop.time() - started
    # nobody received the publish: retried for the window, then failed, far below 30 s
    assert elapsed < 12, f"took {elapsed:.1f}s"


async def test_a_client_resumes_its_identity_on_another_replica_after_its_own_died(replicas, clients):
    a, b = replicas.start("ra"), replicas.start("rb")
    provider = await clients(a.url, client_id="phoenix")
    ws = provider.config["workspace"]
    token = provider.config["reconnection_token"]
    a.kill()
    await provider.disconnect()  # this client object would keep retrying A; use its token on B
    again = await clients(b.url, client_id="phoenix", reconnection_token=token)
    assert again.config["workspace"] == ws
    await again.register_service({"id": "s", "config": {"visibility": "public"}, "f": lambda: "back"})
    caller = await clients(b.url, client_id="caller")
    assert await (await caller.get_service(f"{ws}/phoenix:s")).f() == "back"


async def test_connection_limits_count_across_replicas(replicas, clients):
    a = replicas.start("ra", "--max-connections-per-user", "2")
    b = replicas.start("rb", "--max-connections-per-user", "2")
    owner = await clients(a.url, client_id="owner")
    token = await owner.generate_token()  # its holders count as the owner (the root of the chain)
    await clients(b.url, client_id="w1", token=token)
    with pytest.raises(ConnectionAbortedError, match="Too many connections"):
        await clients(b.url, client_id="w2", token=token)
    with pytest.raises(ConnectionAbortedError, match="Too many connections"):
        await clients(a.url, client_id="w3", token=token)


async def test_connections_of_a_sigkilled_replica_stop_counting(replicas, clients):
    a = replicas.start("ra", "--max-connections-per-user", "1")
    b = replicas.start("rb", "--max-connections-per-user", "1", "--leader-lease-ttl", "1.5")
    owner = await clients(b.url, client_id="owner")
    token = await owner.generate_token()
    await owner.disconnect()  # the token's holders count as its maker: the maker leaves the one place to them
    holder = await eventually(  # once B counted the maker gone
        lambda: clients(a.url, client_id="w1", token=token), timeout=10, what="the token's holder admitted"
    )
    with pytest.raises(ConnectionAbortedError, match="Too many connections"):
        await clients(b.url, client_id="w2", token=token)
    a.kill()  # its count of w1 stays in Redis until the leader sees A's presence expire
    await holder.disconnect()

    async def joins() -> bool:
        try:
            await clients(b.url, client_id="w2", token=token)
        except ConnectionAbortedError:
            return False
        return True

    await eventually(joins, timeout=20, what="the dead replica's connection count forgotten")

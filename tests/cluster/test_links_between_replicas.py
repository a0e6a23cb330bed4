"""Replica processes send each other's clients' frames over direct links, and never depend on them."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest

from switchboard.testing import FaultProxy
from switchboard.testing.ports import free_port
from switchboard.testing.wait import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(90)]


async def counter(replica, name: str) -> float:
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{replica.url}/metrics", timeout=5)).text
    found = re.search(rf'^{name}(?:_total)?{{replica="[^"]+"}} ([0-9.e+]+)$', text, re.M)
    assert found, f"{name} missing from /metrics"
    return float(found.group(1))


async def provider_and_caller(replicas, clients, a, b):
    provider = await clients(a.url, client_id="prov")
    await provider.register_service({"id": "svc", "config": {"visibility": "public"}, "add": lambda x: x + 1})
    caller = await clients(b.url, client_id="caller", token=await provider.generate_token())
    return provider, caller, await caller.get_service("prov:svc")


async def test_calls_between_replicas_travel_over_the_link_once_it_is_learned(replicas, clients):
    a, b = replicas.start("ra"), replicas.start("rb")
    _, _, svc = await provider_and_caller(replicas, clients, a, b)
    for i in range(30):
        assert await svc.add(i) == i + 1

    assert await counter(b, "switchboard_link_frames_sent") >= 25  # the calls, B -> A
    assert await counter(a, "switchboard_link_frames_sent") >= 25  # the replies, A -> B
    assert await counter(a, "switchboard_link_frames_received") >= 25


async def test_a_call_through_a_stale_link_to_a_provider_that_left_fails_fast(replicas, clients):
    a, b = replicas.start("ra"), replicas.start("rb")
    provider, caller, svc = await provider_and_caller(replicas, clients, a, b)
    for i in range(5):
        assert await svc.add(i) == i + 1
    ws = provider.config["workspace"]
    await provider.disconnect()  # A forgets the channel; B's route to it is now stale

    async def cleaned_up() -> bool:  # A has finished cleaning up after it
        return f"{ws}/prov" not in {c["id"] for c in await caller.list_clients()}

    await eventually(cleaned_up, timeout=5, what="the provider gone from the listing")

    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(Exception, match="not connected"):
        await svc.add(1)
    assert loop.time() - started < 5  # sent back by A, then nobody on Redis: failed, not timed out
    assert await counter(a, "switchboard_link_frames_returned") >= 1


async def test_calls_keep_working_while_the_link_is_cut_and_after(replicas, clients):
    link_port = free_port()
    async with FaultProxy("127.0.0.1", link_port, connect_timeout=2.0) as proxy:
        # the first cross-replica frame is the caller's (B -> A, through Redis): A then
        # dials B's link, here through the proxy, and both directions share that link
        a = replicas.start("ra")
        b = replicas.start("rb", "--link-port", str(link_port), "--link-advertise", f"127.0.0.1:{proxy.port}")
        _, _, svc = await provider_and_caller(replicas, clients, a, b)
        for i in range(5):
            assert await svc.add(i) == i + 1
        assert await counter(b, "switchboard_link_frames_sent") >= 3
        assert len(proxy.connections) == 1  # the link really runs through the proxy

        proxy.blackhole()  # silent: no FIN, no RST
        loop = asyncio.get_running_loop()
        started = loop.time()
        results = [await asyncio.wait_for(svc.add(i), 10) for i in range(10)]  # each bounded
        assert results == [i + 1 for i in range(10)]  # none lost: unacked frames went through Redis
        assert loop.time() - started < 8  # the first call waited out the dead link's 3 s, the rest did not
        assert await counter(b, "switchboard_link_frames_replayed") >= 1  # the call sent into the void

        proxy.pass_through()
        proxy.reset_all()

        async def direct_again() -> bool:
            before = await counter(b, "switchboard_link_frames_sent")
            assert await svc.add(1) == 2
            return await counter(b, "switchboard_link_frames_sent") > before

        # the route is re-learned within a few calls
        await eventually(direct_again, timeout=5, what="calls over the link again")


async def test_replicas_with_links_off_still_reach_each_other_through_redis(replicas, clients):
    a, b = replicas.start("ra", "--no-links"), replicas.start("rb")
    _, _, svc = await provider_and_caller(replicas, clients, a, b)
    for i in range(10):
        assert await svc.add(i) == i + 1
    assert await counter(b, "switchboard_link_frames_sent") == 0  # B never learned a route from A


async def test_a_point_to_point_event_never_overtakes_the_broadcast_sent_before_it(replicas, clients):
    a, b = replicas.start("ra"), replicas.start("rb")
    sender = await clients(a.url, client_id="sender")
    receiver = await clients(b.url, client_id="receiver", token=await sender.generate_token())
    await receiver.register_service({"id": "svc", "config": {"visibility": "public"}, "f": lambda: 1})
    svc = await sender.get_service("receiver:svc")
    for _ in range(5):  # calls teach A the link to B for the receiver's frames
        assert await svc.f() == 1
    assert await counter(a, "switchboard_link_frames_sent") >= 3

    got: list = []
    receiver.on("news", lambda event: got.append(event["data"]))
    await receiver.subscribe(["news"])
    for i in range(20):
        await sender.emit({"type": "news", "to": "*", "data": f"broadcast {i}"})  # through Redis
        await sender.emit({"type": "news", "to": f"{receiver.config['workspace']}/receiver", "data": f"direct {i}"})
    await eventually(lambda: len(got) >= 40, timeout=10, what="all 40 events")
    assert got == [f"{kind} {i}" for i in range(20) for kind in ("broadcast", "direct")]


async def test_manager_calls_answered_through_another_replica_are_not_left_in_flight(replicas, clients):
    a, b = replicas.start("ra"), replicas.start("rb")
    provider = await clients(a.url, client_id="prov")
    await provider.register_service({"id": "svc", "config": {"visibility": "public"}, "f": lambda: 1})
    caller = await clients(b.url, client_id="caller", token=await provider.generate_token())
    for _ in range(10):  # B's manager asks the provider (on A) for its service: replies come back via A
        svc = await caller.get_service("prov:svc")
        assert await svc.f() == 1

    async def nothing_in_flight() -> bool:  # the last reply may still be on its way
        return await counter(b, "switchboard_calls_in_flight") == 0

    await eventually(nothing_in_flight, timeout=5, what="no call left in flight on B")


@pytest.mark.parametrize("links", ["--links", "--no-links"])
async def test_calls_start_in_the_order_the_caller_sent_them(replicas, clients, links):
    """Through Redis every frame waits for its PUBLISH: the caller's next ones queue behind it."""
    a, b = replicas.start("ra", links), replicas.start("rb", links)
    started: list[int] = []
    provider = await clients(a.url, client_id="prov")
    await provider.register_service(
        {"id": "svc", "config": {"visibility": "public"}, "note": lambda i: started.append(i)}
    )
    caller = await clients(b.url, client_id="caller", token=await provider.generate_token())
    svc = await caller.get_service("prov:svc")
    await asyncio.gather(*(svc.note(i) for i in range(200)))  # sent back to back, in this order
    assert started == list(range(200))

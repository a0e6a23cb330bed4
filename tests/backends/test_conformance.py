"""What every ``Registry`` and ``EventBus`` must do, run against each backend.

The suite talks to the backends only through the interfaces in
``switchboard.backends.base``: any implementation that passes it can stand in
for any other behind the hub.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from support.listen import on
from switchboard.backends.base import EventBus, Registry
from switchboard.backends.memory import MemoryBus, MemoryRegistry
from switchboard.backends.redis import RedisBus, RedisRegistry
from switchboard.backends.redis.assemble import redis_backends
from switchboard.clock import SystemClock
from switchboard.protocol.hypha.services import ServiceQuery
from switchboard.testing import ValkeyServer
from switchboard.testing.valkey_cluster import ValkeyCluster
from switchboard.testing.wait import eventually


# ---------------------------------------------------------------------------
# THE BACKEND FACTORY: the only place that knows concrete backends.
#
# To run the whole suite against another backend (e.g. Redis/Valkey), add its
# name to ``params`` and a branch below that builds a *fresh, empty* registry
# and bus for one test; anything it starts (a server, a connection) is torn
# down after the ``yield``. For Redis, ``switchboard.testing.ValkeyServer``
# provides a real server process. Nothing else in this file needs to change.
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def valkey_conformance() -> Iterator[ValkeyServer]:
    with ValkeyServer() as server:
        yield server


@pytest.fixture(params=["memory", "redis", "cluster"])
async def backend(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[Registry, EventBus]]:
    closing: list[Any] = []
    if request.param == "memory":
        registry: Registry = MemoryRegistry()
        bus: EventBus = MemoryBus()
    elif request.param == "redis":
        server = request.getfixturevalue("valkey_conformance")
        server.client().flushall()  # a fresh, empty backend per test (test-owned server)
        registry = RedisRegistry(server.url, replica_id="conformance")
        bus = RedisBus(server.url, clock=SystemClock(), replica_id="conformance")
        assert await bus.start()
    elif request.param == "cluster":
        cluster: ValkeyCluster = request.getfixturevalue("valkey_cluster")
        for port in cluster.masters_ports():
            with cluster.client(port) as admin:
                admin.flushall()
        parts = redis_backends(cluster.url, cluster=None, clock=SystemClock(), replica_id="conformance")
        assert parts.cluster, "detected from the one node named"
        registry, bus = parts.registry, parts.bus
        assert await bus.start()
        closing.append(parts.client)
    else:  # pragma: no cover - a new param without a branch
        raise AssertionError(f"no factory for backend {request.param!r}")
    try:
        yield registry, bus
    finally:
        await bus.close()
        await registry.close()
        for client in closing:
            await client.aclose()


@pytest.fixture
def registry(backend: tuple[Registry, EventBus]) -> Registry:
    return backend[0]


@pytest.fixture
def bus(backend: tuple[Registry, EventBus]) -> EventBus:
    return backend[1]


def svc(full_id: str, app_id: str = "*", **config: Any) -> dict[str, Any]:
    """A stored service info, as ``prepare_registration`` would produce it."""
    ws = full_id.partition("/")[0]
    name = full_id.rpartition(":")[2]
    return {
        "id": full_id,
        "name": name,
        "type": "generic",
        "description": None,
        "docs": None,
        "app_id": app_id,
        "config": {"visibility": "protected", "workspace": ws, **config},
    }


def ids(infos: list[dict[str, Any]]) -> list[str]:
    return sorted(i["id"] for i in infos)


async def settle(bus: EventBus) -> None:
    """Until everything published before has been delivered, wanted or not: a marker published
    after it, on a channel of its own, has come (a bus delivers to a subscriber in publish order)."""
    seen: list[bytes] = []
    await on(bus).subscribe("settle:marker", seen.append)
    assert await bus.publish("settle:marker", b"marker") == 1
    await eventually(lambda: seen, "the marker published after the rest")
    await bus.unsubscribe("settle:marker")


# -- Registry ----------------------------------------------------------------


class TestRegister:
    async def test_first_register_replaces_nothing(self, registry: Registry) -> None:
        assert await registry.register(svc("ws1/cA:echo")) is None

    async def test_register_returns_the_replaced_info(self, registry: Registry) -> None:
        first = svc("ws1/cA:echo", description_v=1)
        second = svc("ws1/cA:echo", description_v=2)
        await registry.register(first)

        assert await registry.register(second) == first
        assert await registry.find(ServiceQuery("ws1")) == [second]

    async def test_same_service_name_in_other_clients_is_separate(self, registry: Registry) -> None:
        await registry.register(svc("ws1/cA:echo"))

        assert await registry.register(svc("ws1/cB:echo")) is None
        assert await registry.register(svc("ws2/cA:echo")) is None
        assert ids(await registry.find(ServiceQuery("*"))) == [
            "ws1/cA:echo",
            "ws1/cB:echo",
            "ws2/cA:echo",
        ]

    async def test_stores_the_whole_info(self, registry: Registry) -> None:
        info = svc("ws1/cA:echo", app_id="app", flags=["x"], authorized_workspaces=["ws2"])
        info["service_schema"] = {"echo": {"type": "function", "function": {"name": "echo"}}}
        await registry.register(info)

        assert await registry.find(ServiceQuery("ws1", "cA", "echo")) == [info]


class TestUnregister:
    async def test_returns_the_removed_info(self, registry: Registry) -> None:
        info = svc("ws1/cA:echo")
        await registry.register(info)

        assert await registry.unregister("ws1/cA:echo") == info
        assert await registry.find(ServiceQuery("ws1")) == []

    async def test_unknown_id_returns_none(self, registry: Registry) -> None:
        assert await registry.unregister("ws1/cA:echo") is None

    async def test_unknown_id_in_a_known_workspace_returns_none(self, registry: Registry) -> None:
        await registry.register(svc("ws1/cA:echo"))

        assert await registry.unregister("ws1/cA:other") is None
        assert ids(await registry.find(ServiceQuery("ws1"))) == ["ws1/cA:echo"]

    async def test_second_unregister_returns_none(self, registry: Registry) -> None:
        await registry.register(svc("ws1/cA:echo"))
        await registry.unregister("ws1/cA:echo")

        assert await registry.unregister("ws1/cA:echo") is None

    async def test_removes_only_that_service(self, registry: Registry) -> None:
        for sid in ("ws1/cA:echo", "ws1/cA:echo2", "ws1/cB:echo", "ws2/cA:echo"):
            await registry.register(svc(sid))

        await registry.unregister("ws1/cA:echo")

        assert ids(await registry.find(ServiceQuery("*"))) == [
            "ws1/cA:echo2",
            "ws1/cB:echo",
            "ws2/cA:echo",
        ]


class TestRemoveClient:
    async def test_removes_exactly_that_clients_services(self, registry: Registry) -> None:
        mine = [svc("ws1/a:built-in"), svc("ws1/a:echo"), svc("ws1/a:calc")]
        others = [
            svc("ws1/ab:built-in"),  # a client whose id has "a" as a prefix
            svc("ws1/ab:echo"),
            svc("ws1/b:echo"),
            svc("ws2/a:echo"),  # the same client id in another workspace
        ]
        for info in mine + others:
            await registry.register(info)

        removed = await registry.remove_client("ws1", "a")

        assert ids(removed) == ids(mine)
        assert sorted(removed, key=lambda i: i["id"]) == sorted(mine, key=lambda i: i["id"])
        assert ids(await registry.find(ServiceQuery("*"))) == ids(others)

    async def test_longer_id_does_not_take_the_prefix(self, registry: Registry) -> None:
        await registry.register(svc("ws1/a:echo"))
        await registry.register(svc("ws1/ab:echo"))

        assert ids(await registry.remove_client("ws1", "ab")) == ["ws1/ab:echo"]
        assert ids(await registry.find(ServiceQuery("ws1"))) == ["ws1/a:echo"]

    async def test_unknown_client_removes_nothing(self, registry: Registry) -> None:
        await registry.register(svc("ws1/a:echo"))

        assert await registry.remove_client("ws1", "zz") == []
        assert await registry.remove_client("ws9", "a") == []
        assert ids(await registry.find(ServiceQuery("*"))) == ["ws1/a:echo"]

    async def test_twice_removes_nothing_the_second_time(self, registry: Registry) -> None:
        await registry.register(svc("ws1/a:echo"))
        await registry.remove_client("ws1", "a")

        assert await registry.remove_client("ws1", "a") == []

    async def test_client_can_register_again(self, registry: Registry) -> None:
        await registry.register(svc("ws1/a:echo"))
        await registry.remove_client("ws1", "a")

        assert await registry.register(svc("ws1/a:echo")) is None
        assert ids(await registry.find(ServiceQuery("ws1", "a"))) == ["ws1/a:echo"]


class TestSingletons:
    """The singletons of a name: what a registration of that name checks, without reading its namesakes."""

    async def test_only_singleton_services_of_that_name_are_found(self, registry: Registry) -> None:
        for i in range(20):
            await registry.register(svc(f"ws1/c{i}:echo"))
        await registry.register(svc("ws1/solo:echo", singleton=True))
        await registry.register(svc("ws1/other:tool", singleton=True))
        await registry.register(svc("ws2/solo:echo", singleton=True))

        assert ids(await registry.singletons("ws1", "echo")) == ["ws1/solo:echo"]
        assert await registry.singletons("ws1", "nothing") == []
        assert await registry.singletons("ws3", "echo") == []

    async def test_a_singleton_that_left_or_dropped_the_flag_is_found_no_more(self, registry: Registry) -> None:
        await registry.register(svc("ws1/a:echo", singleton=True))
        await registry.register(svc("ws1/b:echo", singleton=True))
        await registry.register(svc("ws1/c:echo", singleton=True))
        await registry.unregister("ws1/a:echo")
        await registry.remove_client("ws1", "b")
        await registry.register(svc("ws1/c:echo"))  # registered again, without the flag

        assert await registry.singletons("ws1", "echo") == []
        await registry.register(svc("ws1/c:echo", singleton=True))
        assert ids(await registry.singletons("ws1", "echo")) == ["ws1/c:echo"]


class TestTransit:
    """A client in transit keeps its registrations until it is back or its grace is over.

    Graces are short and real (the store's own clock decides); waits are bounded.
    """

    async def test_back_within_the_grace_keeps_everything(self, registry: Registry) -> None:
        await registry.register(svc("ws1/a:built-in"))
        await registry.register(svc("ws1/a:echo"))
        assert await registry.begin_transit("ws1", "a", owner="conformance", grace=5.0)
        assert ids(await registry.find(ServiceQuery("ws1", "a"))) == ["ws1/a:built-in", "ws1/a:echo"]
        away = await registry.end_transit("ws1", "a", owner="conformance")
        assert away is not None
        assert 0 <= away < 2.0
        assert await registry.end_transit("ws1", "a", owner="conformance") is None  # once
        assert (await registry.expire_transit("ws1", "a")).state == "none"
        assert ids(await registry.find(ServiceQuery("ws1", "a"))) == ["ws1/a:built-in", "ws1/a:echo"]

    async def test_not_back_within_the_grace_is_removed_once(self, registry: Registry) -> None:
        mine = [svc("ws1/a:built-in"), svc("ws1/a:echo")]
        for info in [*mine, svc("ws1/b:echo")]:
            await registry.register(info)
        assert await registry.begin_transit("ws1", "a", owner="conformance", grace=0.2)
        early = await registry.expire_transit("ws1", "a")
        assert early.state == "waiting"
        assert 0 < early.remaining <= 0.2
        assert early.removed == []
        assert await registry.transits_due() == []
        # polled, bounded: the grace ends on the store's clock (Redis's own TIME for Redis)
        assert await eventually(registry.transits_due, "the grace is over") == ["ws1/a"]
        late = await registry.expire_transit("ws1", "a")
        assert late.state == "expired"
        assert sorted(late.removed, key=lambda i: i["id"]) == mine
        assert ids(await registry.find(ServiceQuery("*"))) == ["ws1/b:echo"]
        assert (await registry.expire_transit("ws1", "a")).state == "none"  # one replica announces it
        assert await registry.end_transit("ws1", "a", owner="conformance") is None

    async def test_a_second_begin_keeps_the_first_deadline(self, registry: Registry) -> None:
        await registry.register(svc("ws1/a:echo"))
        assert await registry.begin_transit("ws1", "a", owner="conformance", grace=0.2)
        assert await registry.begin_transit("ws1", "a", owner="conformance", grace=60.0)
        assert (await registry.expire_transit("ws1", "a")).remaining <= 0.2

    async def test_removing_the_client_ends_its_transit(self, registry: Registry) -> None:
        await registry.register(svc("ws1/a:echo"))
        await registry.begin_transit("ws1", "a", owner="conformance", grace=5.0)
        await registry.remove_client("ws1", "a")
        assert (await registry.expire_transit("ws1", "a")).state == "none"
        assert await registry.end_transit("ws1", "a", owner="conformance") is None


class TestClaims:
    """A client id belongs to the user that first connected with it, until the client leaves."""

    async def test_the_first_user_holds_the_id_and_another_is_told_who(self, registry: Registry) -> None:
        assert await registry.holder("ws1", "a") is None
        assert (await registry.claim("ws1", "a", user="alice", owner="conformance")).holder is None
        assert (await registry.claim("ws1", "a", user="alice", owner="conformance")).holder is None  # again
        assert (await registry.claim("ws1", "a", user="mallory", owner="conformance")).holder == "alice"
        assert await registry.holder("ws1", "a") == "alice", "a refused claim changes nothing"
        assert await registry.holder("ws1", "b") is None
        assert await registry.holder("ws2", "a") is None

    async def test_the_id_is_free_again_once_the_client_left(self, registry: Registry) -> None:
        await registry.claim("ws1", "a", user="alice", owner="conformance")
        await registry.register(svc("ws1/a:built-in"))
        await registry.remove_client("ws1", "a", owner="conformance")
        assert await registry.holder("ws1", "a") is None
        assert (await registry.claim("ws1", "a", user="bob", owner="conformance")).holder is None

    async def test_the_id_stays_held_in_transit_and_is_free_once_the_grace_is_over(self, registry: Registry) -> None:
        await registry.claim("ws1", "a", user="alice", owner="conformance")
        await registry.register(svc("ws1/a:built-in"))
        assert await registry.begin_transit("ws1", "a", owner="conformance", grace=0.2)
        assert await registry.holder("ws1", "a") == "alice"
        await eventually(registry.transits_due, "the grace is over")
        assert (await registry.expire_transit("ws1", "a")).state == "expired"
        assert await registry.holder("ws1", "a") is None


class TestFind:
    SERVICES = (
        svc("ws1/cA:built-in"),
        svc("ws1/cA:echo", app_id="app1"),
        svc("ws1/cB:built-in"),
        svc("ws1/cB:echo"),
        svc("ws1/cB:calc", app_id="app1"),
        svc("ws2/cA:built-in"),
        svc("ws2/cC:echo", app_id="app2"),
    )

    @pytest.fixture
    async def filled(self, registry: Registry) -> Registry:
        for info in self.SERVICES:
            await registry.register(copy.deepcopy(info))
        return registry

    @pytest.mark.parametrize(
        ("query", "expected"),
        [
            pytest.param(
                ServiceQuery("ws1"),
                ["ws1/cA:built-in", "ws1/cA:echo", "ws1/cB:built-in", "ws1/cB:calc", "ws1/cB:echo"],
                id="workspace",
            ),
            pytest.param(ServiceQuery("ws2"), ["ws2/cA:built-in", "ws2/cC:echo"], id="other-workspace"),
            pytest.param(ServiceQuery("ws3"), [], id="empty-workspace"),
            pytest.param(
                ServiceQuery("ws1", "cB"),
                ["ws1/cB:built-in", "ws1/cB:calc", "ws1/cB:echo"],
                id="client",
            ),
            pytest.param(ServiceQuery("ws1", "c"), [], id="client-prefix-is-not-a-match"),
            pytest.param(ServiceQuery("ws1", "*", "echo"), ["ws1/cA:echo", "ws1/cB:echo"], id="service"),
            pytest.param(ServiceQuery("ws1", "cB", "echo"), ["ws1/cB:echo"], id="exact"),
            pytest.param(ServiceQuery("ws1", "cB", "nope"), [], id="exact-missing"),
            pytest.param(ServiceQuery("ws1", "*", "*", "app1"), ["ws1/cA:echo", "ws1/cB:calc"], id="app-id"),
            pytest.param(ServiceQuery("ws1", "*", "echo", "app1"), ["ws1/cA:echo"], id="service-and-app"),
            pytest.param(ServiceQuery("*"), sorted(s["id"] for s in SERVICES), id="all-workspaces"),
            pytest.param(
                ServiceQuery("*", "*", "built-in"),
                ["ws1/cA:built-in", "ws1/cB:built-in", "ws2/cA:built-in"],
                id="all-workspaces-service",
            ),
            pytest.param(
                ServiceQuery("*", "cA"),
                ["ws1/cA:built-in", "ws1/cA:echo", "ws2/cA:built-in"],
                id="all-workspaces-client",
            ),
            pytest.param(ServiceQuery("*", "*", "*", "app2"), ["ws2/cC:echo"], id="all-workspaces-app"),
        ],
    )
    async def test_query(self, filled: Registry, query: ServiceQuery, expected: list[str]) -> None:
        assert ids(await filled.find(query)) == expected

    async def test_returns_the_stored_infos(self, filled: Registry) -> None:
        [found] = await filled.find(ServiceQuery("ws2", "cC", "echo"))

        assert found == self.SERVICES[-1]

    async def test_empty_registry(self, registry: Registry) -> None:
        assert await registry.find(ServiceQuery("*")) == []


# -- EventBus ------------------------------------------------------------------------


class TestBus:
    async def test_publish_without_subscriber_reaches_nobody(self, bus: EventBus) -> None:
        assert await bus.publish("chan", b"hello") == 0

    async def test_publish_with_one_subscriber(self, bus: EventBus) -> None:
        received: list[bytes] = []
        await on(bus).subscribe("chan", received.append)

        assert await bus.publish("chan", b"hello") == 1
        await eventually(lambda: len(received) == 1, "delivery")
        assert received == [b"hello"]

    async def test_handler_receives_exact_bytes(self, bus: EventBus) -> None:
        received: list[bytes] = []
        await on(bus).subscribe("chan", received.append)
        payloads = [b"", b"\x00", bytes(range(256)), b"\x93\x01\x02\x03" * 10_000]

        for data in payloads:
            assert await bus.publish("chan", data) == 1
        await eventually(lambda: len(received) == len(payloads), "delivery")

        assert [bytes(r) for r in received] == payloads
        assert all(isinstance(r, bytes) for r in received)

    async def test_subscriptions_count_what_is_wanted_and_what_is_confirmed(self, bus: EventBus) -> None:
        before = bus.subscriptions
        await on(bus).subscribe("chan", lambda _: None)
        if before is None:  # one process: nothing to confirm, nothing counted
            assert bus.subscriptions is None
            return
        desired, confirmed = before
        await eventually(lambda: bus.subscriptions == (desired + 1, confirmed + 1), "the confirmation")
        await bus.unsubscribe("chan")
        assert bus.subscriptions == (desired, confirmed)

    async def test_channels_are_separate(self, bus: EventBus) -> None:
        a: list[bytes] = []
        b: list[bytes] = []
        await on(bus).subscribe("client:ws1/a", a.append)
        await on(bus).subscribe("client:ws1/ab", b.append)

        assert await bus.publish("client:ws1/a", b"for a") == 1
        assert await bus.publish("client:ws1/ab", b"for ab") == 1
        assert await bus.publish("client:ws1/abc", b"for nobody") == 0
        await eventually(lambda: len(a) == 1 and len(b) == 1, "delivery")
        await settle(bus)

        assert a == [b"for a"]
        assert b == [b"for ab"]

    async def test_unsubscribe_stops_delivery(self, bus: EventBus) -> None:
        received: list[bytes] = []
        await on(bus).subscribe("chan", received.append)
        assert await bus.publish("chan", b"before") == 1
        await eventually(lambda: received == [b"before"], "delivery")

        await bus.unsubscribe("chan")

        assert await bus.publish("chan", b"after") == 0
        await settle(bus)
        assert received == [b"before"]

    async def test_unsubscribe_leaves_other_channels(self, bus: EventBus) -> None:
        kept: list[bytes] = []
        await on(bus).subscribe("gone", lambda data: None)
        await on(bus).subscribe("kept", kept.append)

        await bus.unsubscribe("gone")

        assert await bus.publish("kept", b"still here") == 1
        await eventually(lambda: kept == [b"still here"], "delivery")

    async def test_unsubscribe_unknown_channel_is_harmless(self, bus: EventBus) -> None:
        await bus.unsubscribe("never-subscribed")

        assert await bus.publish("never-subscribed", b"x") == 0

    async def test_subscribe_again_after_unsubscribe(self, bus: EventBus) -> None:
        received: list[bytes] = []
        await on(bus).subscribe("chan", received.append)
        await bus.unsubscribe("chan")
        await on(bus).subscribe("chan", received.append)

        assert await bus.publish("chan", b"back") == 1
        await eventually(lambda: received == [b"back"], "delivery")

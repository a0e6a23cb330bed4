"""RedisRegistry against a real Valkey: the Registry behaviours, ownership, and recovery."""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from switchboard.backends.redis import RedisRegistry, make_client
from switchboard.errors import BackendError
from switchboard.protocol.hypha.services import ServiceQuery
from switchboard.testing import ValkeyServer


def svc(full_id: str, app_id: str = "*", **config: Any) -> dict[str, Any]:
    ws = full_id.partition("/")[0]
    return {
        "id": full_id,
        "name": full_id.rpartition(":")[2],
        "type": "generic",
        "description": None,
        "docs": None,
        "app_id": app_id,
        "config": {"visibility": "protected", "workspace": ws, **config},
    }


def ids(infos: list[dict[str, Any]]) -> list[str]:
    return sorted(i["id"] for i in infos)


@pytest.fixture(scope="module")
def valkey_registry() -> Iterator[ValkeyServer]:
    with ValkeyServer() as srv:
        yield srv


@pytest.fixture
async def make_registry(
    valkey_registry: ValkeyServer,
) -> AsyncIterator[Callable[[str], RedisRegistry]]:
    """Registries for replicas sharing one fresh key prefix (no FLUSH between tests)."""
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    made: list[RedisRegistry] = []

    def make(replica_id: str) -> RedisRegistry:
        registry = RedisRegistry(valkey_registry.url, replica_id=replica_id, key_prefix=prefix)
        made.append(registry)
        return registry

    yield make
    for registry in made:
        await registry.close()


@pytest.fixture
def registry(make_registry: Callable[[str], RedisRegistry]) -> RedisRegistry:
    return make_registry("r1")


# -- Registry behaviours ---------------------------------------------------------------


async def test_register_returns_the_replaced_info(registry: RedisRegistry) -> None:
    first = svc("ws1/cA:echo", v=1)
    second = svc("ws1/cA:echo", v=2)
    second["service_schema"] = {"echo": {"type": "function", "function": {"name": "echo"}}}

    assert await registry.register(first) is None
    assert await registry.register(second) == first
    assert await registry.find(ServiceQuery("ws1")) == [second]


async def test_a_registration_stores_the_json_it_was_given(
    registry: RedisRegistry, valkey_registry: ValkeyServer
) -> None:
    """The service directory encodes an info once, to bound its size, and that text is what is
    stored: a hypha-rpc connect no longer encodes its built-in service a second time."""
    info = svc("ws1/cA:echo", v=1)
    encoded = json.dumps(info, separators=(",", ":"))
    await registry.register(info, encoded=encoded)

    with valkey_registry.client() as admin:
        assert admin.hget(f"{registry._p}svc:ws1", "cA:echo") == encoded.encode()
    assert await registry.find(ServiceQuery("ws1")) == [info]


async def test_unregister_returns_the_removed_info_once(registry: RedisRegistry) -> None:
    info = svc("ws1/cA:echo")
    await registry.register(info)
    await registry.register(svc("ws1/cA:other"))

    assert await registry.unregister("ws1/cA:echo") == info
    assert await registry.unregister("ws1/cA:echo") is None
    assert await registry.unregister("ws9/cA:echo") is None
    assert await registry.unregister("not-an-id") is None
    assert ids(await registry.find(ServiceQuery("*"))) == ["ws1/cA:other"]


async def test_an_emptied_workspace_leaves_the_workspace_set(
    registry: RedisRegistry, valkey_registry: ValkeyServer
) -> None:
    await registry.register(svc("ws1/cA:echo"))
    await registry.register(svc("ws2/cA:echo"))

    await registry.unregister("ws1/cA:echo")
    await registry.remove_client("ws2", "cA")

    with valkey_registry.client() as admin:
        assert admin.smembers(f"{registry._p}workspaces") == set()
        assert admin.keys(f"{registry._p}svc:*") == []


async def test_remove_client_removes_exactly_that_client(registry: RedisRegistry) -> None:
    mine = [svc("ws1/a:built-in"), svc("ws1/a:echo")]
    others = [svc("ws1/ab:echo"), svc("ws1/b:echo"), svc("ws2/a:echo"), svc("ws1/a.x:x"), svc("ws1/a-:x")]
    for info in mine + others:
        await registry.register(info)

    removed = await registry.remove_client("ws1", "a")

    assert sorted(removed, key=lambda i: i["id"]) == sorted(mine, key=lambda i: i["id"])
    assert ids(await registry.find(ServiceQuery("*"))) == ids(others)
    assert await registry.remove_client("ws1", "a") == []
    assert ("ws1", "a") not in await registry.owned_by("r1")


SERVICES = (
    svc("ws1/cA:built-in"),
    svc("ws1/cA:echo", app_id="app1"),
    svc("ws1/cB:built-in"),
    svc("ws1/cB:echo"),
    svc("ws1/cB:calc", app_id="app1"),
    svc("ws2/cA:built-in"),
    svc("ws2/cC:echo", app_id="app2"),
)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (
            ServiceQuery("ws1"),
            ["ws1/cA:built-in", "ws1/cA:echo", "ws1/cB:built-in", "ws1/cB:calc", "ws1/cB:echo"],
        ),
        (ServiceQuery("ws1", "cB"), ["ws1/cB:built-in", "ws1/cB:calc", "ws1/cB:echo"]),
        (ServiceQuery("ws1", "c"), []),
        (ServiceQuery("ws1", "*", "echo"), ["ws1/cA:echo", "ws1/cB:echo"]),
        (ServiceQuery("ws1", "cB", "echo"), ["ws1/cB:echo"]),
        (ServiceQuery("ws1", "cB", "nope"), []),
        (ServiceQuery("ws1", "*", "*", "app1"), ["ws1/cA:echo", "ws1/cB:calc"]),
        (ServiceQuery("ws1", "cA", "echo", "app2"), []),
        (ServiceQuery("ws3"), []),
        (ServiceQuery("*"), sorted(s["id"] for s in SERVICES)),
        (ServiceQuery("*", "cA"), ["ws1/cA:built-in", "ws1/cA:echo", "ws2/cA:built-in"]),
        (
            ServiceQuery("*", "*", "built-in"),
            ["ws1/cA:built-in", "ws1/cB:built-in", "ws2/cA:built-in"],
        ),
        (ServiceQuery("*", "*", "*", "app2"), ["ws2/cC:echo"]),
    ],
    ids=str,
)
async def test_find(registry: RedisRegistry, query: ServiceQuery, expected: list[str]) -> None:
    for info in SERVICES:
        await registry.register(copy.deepcopy(info))

    assert ids(await registry.find(query)) == expected


async def test_workspace_lookup_is_one_round_trip(registry: RedisRegistry, valkey_registry: ValkeyServer) -> None:
    for info in SERVICES:
        await registry.register(copy.deepcopy(info))
    with valkey_registry.client() as admin:
        admin.config_resetstat()
        found = await registry.find(ServiceQuery("ws1", "*", "echo"))
        stats = admin.info("commandstats")

    calls = {k: v["calls"] for k, v in stats.items() if not k.endswith(("info", "config|resetstat"))}
    assert calls == {"cmdstat_hvals": 1}
    assert ids(found) == ["ws1/cA:echo", "ws1/cB:echo"]


async def test_a_crowd_of_registrations_shares_a_few_connections(
    registry: RedisRegistry, valkey_registry: ValkeyServer
) -> None:
    """Clients arriving together register together: a crowd neither opens a connection each
    (a pool of them exhausted under thousands) nor pays a round trip each."""
    crowd = [svc(f"ws-crowd/c{i}:built-in") for i in range(300)]
    await registry.register(svc("ws-crowd/warm:built-in"))  # the pool's first connection, the script loaded
    with valkey_registry.client() as admin:
        before = admin.info("stats")["total_connections_received"]
        await asyncio.gather(*(registry.register(info) for info in crowd))
        opened = admin.info("stats")["total_connections_received"] - before - 1  # the admin's own

    assert opened <= 2, f"{opened} connections opened for 300 registrations arriving together"
    assert len(await registry.find(ServiceQuery("ws-crowd", "*", "built-in"))) == 301


# -- ownership -------------------------------------------------------------------------------


async def test_owner_is_the_last_registering_replica(make_registry) -> None:
    r1, r2 = make_registry("r1"), make_registry("r2")
    await r1.register(svc("ws1/a:echo"))
    await r1.register(svc("ws1/b:echo"))
    await r2.register(svc("ws2/c:echo"))

    assert await r1.owned_by("r1") == [("ws1", "a"), ("ws1", "b")]
    assert await r1.owned_by("r2") == [("ws2", "c")]

    await r2.register(svc("ws1/b:echo2"))  # client b reconnected to r2

    assert await r1.owned_by("r1") == [("ws1", "a")]
    assert await r1.owned_by("r2") == [("ws1", "b"), ("ws2", "c")]


async def test_remove_replica_state_removes_only_that_replicas(make_registry, valkey_registry: ValkeyServer) -> None:
    r1, r2 = make_registry("r1"), make_registry("r2")
    for sid in ("ws1/a:built-in", "ws1/a:echo", "ws2/x:echo", "ws1/moved:echo"):
        await r1.register(svc(sid))
    peers = [svc("ws1/ab:echo"), svc("ws1/b:echo"), svc("ws3/y:echo"), svc("ws1/moved:calc")]
    for info in peers:
        await r2.register(info)  # "moved" was taken over by r2
    with valkey_registry.client() as admin:
        admin.set("unrelated", "keep")
        peer_keys = {"owner-r2": admin.smembers(f"{r2._p}replica:r2:clients")}

    removed = await r2.remove_replica_state("r1")

    assert ids(removed) == ["ws1/a:built-in", "ws1/a:echo", "ws2/x:echo"]
    assert ids(await r2.find(ServiceQuery("*"))) == sorted(ids(peers) + ["ws1/moved:echo"])
    assert await r2.owned_by("r1") == []
    assert await r2.owned_by("r2") == [("ws1", "ab"), ("ws1", "b"), ("ws1", "moved"), ("ws3", "y")]
    with valkey_registry.client() as admin:
        assert admin.get("unrelated") == b"keep"
        assert admin.smembers(f"{r2._p}replica:r2:clients") == peer_keys["owner-r2"]
        assert admin.sismember(f"{r2._p}workspaces", "ws2") == 0
        admin.delete("unrelated")
    assert await r2.remove_replica_state("r1") == []


# -- recovery: Redis came back empty -------------------------------------------------------------


async def test_reassert_after_redis_restarted_empty() -> None:
    with ValkeyServer() as own:
        client = make_client(own.url)
        r1 = RedisRegistry(client, replica_id="r1")
        r2 = RedisRegistry(own.url, replica_id="r2")
        try:
            mine = [svc("ws1/a:built-in"), svc("ws1/a:echo"), svc("ws2/b:echo")]
            for info in mine:
                await r1.register(info)
            assert await r1.check_reset() is False  # first call records the epoch
            assert await r2.check_reset() is False
            assert await r1.check_reset() is False

            assert await r1.lost_data() is False

            own.restart()

            assert await r1.find(ServiceQuery("*")) == []  # stale pooled socket replaced
            assert await r1.lost_data() is True  # so that empty answer proves nothing yet
            assert await r1.lost_data() is True  # asking does not settle it ...
            assert await r1.check_reset() is True  # ... noticing the reset does
            assert await r2.check_reset() is True  # a peer sees the same reset
            await r2.register(svc("ws2/b:echo"))  # b reconnected to r2 meanwhile

            assert await r1.reassert(mine) == 2  # b's info now belongs to r2: skipped
            assert await r1.reassert([]) == 0

            assert ids(await r1.find(ServiceQuery("*"))) == ids(mine)
            assert await r1.owned_by("r1") == [("ws1", "a")]
            assert await r1.owned_by("r2") == [("ws2", "b")]
            assert await r1.check_reset() is False
            assert await r1.lost_data() is False
        finally:
            await r1.close()
            await r2.close()
            await client.aclose()


async def test_redis_down_raises_backend_error() -> None:
    with ValkeyServer() as own:
        registry = RedisRegistry(own.url, replica_id="r1")
        try:
            own.kill()
            with pytest.raises(BackendError, match="registry find failed"):
                await registry.find(ServiceQuery("ws1"))
            with pytest.raises(BackendError):
                await registry.register(svc("ws1/a:echo"))
        finally:
            await registry.close()


async def test_a_stale_cleanup_never_removes_what_a_client_registered_elsewhere(
    make_registry: Callable[[str], RedisRegistry],
) -> None:
    """Replica r1 notices a lost connection late; the client already lives on r2."""
    r1, r2 = make_registry("r1"), make_registry("r2")
    await r1.register(svc("ws1/cA:built-in"))
    await r2.register(svc("ws1/cA:built-in"))  # reconnected through r2: r2 owns it now
    await r2.register(svc("ws1/cA:echo"))
    assert await r1.remove_client("ws1", "cA", owner="r1") == []
    assert ids(await r2.find(ServiceQuery("ws1"))) == ["ws1/cA:built-in", "ws1/cA:echo"]
    assert await r1.owners() == {"ws1/cA": "r2"}
    # the owner itself (or the reaper naming the right owner) does remove it
    assert len(await r1.remove_client("ws1", "cA", owner="r2")) == 2
    assert await r1.owners() == {}


async def test_transit_is_refused_once_another_replica_owns_the_client(make_registry) -> None:
    a, b = make_registry("ra"), make_registry("rb")
    await a.register(svc("ws1/c:built-in"))
    assert await b.end_transit("ws1", "c", owner="rb") is None  # it reconnected to rb before ra noticed
    assert await a.owners() == {"ws1/c": "rb"}
    assert not await a.begin_transit("ws1", "c", owner="ra", grace=5.0)  # ra's late clean-up: not a move
    assert await a.remove_client("ws1", "c", owner="ra") == []  # ... and removes nothing
    assert ids(await a.find(ServiceQuery("ws1", "c"))) == ["ws1/c:built-in"]


async def test_the_replica_a_client_comes_back_to_takes_it_over(make_registry) -> None:
    a, b = make_registry("ra"), make_registry("rb")
    await a.register(svc("ws1/c:built-in"))
    assert await a.begin_transit("ws1", "c", owner="ra", grace=5.0)
    assert await a.remove_replica_state("ra") == []  # ra drains: its client in transit is left alone
    assert await b.end_transit("ws1", "c", owner="rb") is not None
    assert await b.owners() == {"ws1/c": "rb"}
    assert await b.owned_by("rb") == [("ws1", "c")]
    assert ids(await b.remove_replica_state("rb")) == ["ws1/c:built-in"]  # rb's own now


# -- who holds a client id, and where it is live ------------------------------------------


async def test_a_claim_from_another_replica_takes_the_client_over_there(
    make_registry: Callable[[str], RedisRegistry],
) -> None:
    a, b = make_registry("ra"), make_registry("rb")
    assert (await a.claim("ws1", "c", user="alice", owner="ra")).previous_owner is None
    await a.register(svc("ws1/c:built-in"))
    assert await a.owned_by("ra") == [("ws1", "c")]
    moved = await b.claim("ws1", "c", user="alice", owner="rb")
    assert moved.holder is None
    assert moved.previous_owner == "ra", "the copy on ra is stale: rb says so"
    assert await a.owned_by("ra") == []
    assert await b.owned_by("rb") == [("ws1", "c")]
    assert await a.remove_client("ws1", "c", owner="ra") == [], "ra's late clean-up removes nothing"
    assert await a.holder("ws1", "c") == "alice"
    refused = await a.claim("ws1", "c", user="mallory", owner="ra")
    assert refused.holder == "alice"
    assert await b.owned_by("rb") == [("ws1", "c")], "a refused claim moves nothing"


async def test_a_dead_replica_s_clients_free_their_ids(make_registry: Callable[[str], RedisRegistry]) -> None:
    a, b = make_registry("ra"), make_registry("rb")
    await a.claim("ws1", "quiet", user="alice", owner="ra")  # connected, registered nothing
    await a.claim("ws1", "c", user="bob", owner="ra")
    await a.register(svc("ws1/c:built-in"))
    await b.remove_replica_state("ra")
    assert await b.holder("ws1", "quiet") is None
    assert await b.holder("ws1", "c") is None

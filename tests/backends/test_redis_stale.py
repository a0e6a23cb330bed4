"""Undoing lost deletes against a real Valkey (``backends/redis/stores/stale.py``): what the registry holds
for one replica's clients, and a removal that compares before it deletes, so that nothing written
since the read (a registration, a claim by another replica, a transit) is lost."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from switchboard.backends.owned import Recorded, Stale
from switchboard.backends.redis import RedisRegistry
from switchboard.protocol.hypha.services import ServiceQuery
from switchboard.testing import ValkeyServer


def svc(full_id: str, **config: Any) -> dict[str, Any]:
    return {"id": full_id, "name": full_id.rpartition(":")[2], "type": "generic", "config": config}


def stored(full_id: str, **config: Any) -> str:
    return json.dumps(svc(full_id, **config))


@pytest.fixture(scope="module")
def valkey() -> Iterator[ValkeyServer]:
    with ValkeyServer() as srv:
        yield srv


@pytest.fixture
async def make_registry(valkey: ValkeyServer) -> AsyncIterator[Callable[[str], RedisRegistry]]:
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    made: list[RedisRegistry] = []

    def make(replica_id: str) -> RedisRegistry:
        made.append(RedisRegistry(valkey.url, replica_id=replica_id, key_prefix=prefix))
        return made[-1]

    yield make
    for registry in made:
        await registry.close()


async def listed(registry: RedisRegistry, ws: str = "ws1") -> list[str]:
    return sorted(i["id"] for i in await registry.find(ServiceQuery(ws)))


async def test_what_a_replica_owns_is_read_with_the_stored_values(make_registry) -> None:
    a, b = make_registry("ra"), make_registry("rb")
    await a.claim("ws1", "c", user="alice", owner="ra")
    await a.register(svc("ws1/c:built-in"))
    await a.register(svc("ws1/c:echo"))
    await a.claim("ws2", "quiet", user="bob", owner="ra")  # connected, registered nothing
    await a.register(svc("ws1/moving:built-in"))
    assert await a.begin_transit("ws1", "moving", owner="ra", grace=5.0)
    await b.register(svc("ws1/theirs:built-in"))
    assert await a.stale.owned() == [
        Recorded("ws1/c", {"c:built-in": stored("ws1/c:built-in"), "c:echo": stored("ws1/c:echo")}),
        Recorded("ws1/moving", {"moving:built-in": stored("ws1/moving:built-in")}, in_transit=True),
        Recorded("ws2/quiet", {}),
    ]
    assert await b.stale.owned() == [Recorded("ws1/theirs", {"theirs:built-in": stored("ws1/theirs:built-in")})]
    only_echo = await a.stale.owned(lambda client, field: field == "c:echo")
    assert only_echo[0] == Recorded("ws1/c", {"c:built-in": "", "c:echo": stored("ws1/c:echo")}), "'': not read"


async def test_a_stale_service_goes_and_one_registered_again_since_stays(make_registry) -> None:
    a = make_registry("ra")
    for name in ("built-in", "gone", "back"):
        await a.register(svc(f"ws1/c:{name}"))
    read = {f: v for f, v in (await a.stale.owned())[0].services.items() if f != "c:built-in"}
    await a.register(svc("ws1/c:back", changed=True))  # registered again (another value) after the read
    [(entry, gone, removed)] = await a.stale.remove([Stale("ws1/c", read)])
    assert (gone, [i["id"] for i in removed]) == (False, ["ws1/c:gone"])
    assert await listed(a) == ["ws1/c:back", "ws1/c:built-in"]
    assert (await a.stale.owned())[0].services.keys() == {"c:back", "c:built-in"}, "the index follows"
    assert await a.owners() == {"ws1/c": "ra"}


async def test_a_departed_client_loses_every_entry(make_registry) -> None:
    a = make_registry("ra")
    await a.claim("ws1", "c", user="alice", owner="ra")
    await a.register(svc("ws1/c:built-in"))
    await a.register(svc("ws9/other:built-in"))
    [record, _] = await a.stale.owned()
    [(_, gone, removed)] = await a.stale.remove([Stale(record.client, record.services, departed=True)])
    assert (gone, [i["id"] for i in removed]) == (True, ["ws1/c:built-in"])
    assert await listed(a) == []
    assert await a.find(ServiceQuery("*")) == [svc("ws9/other:built-in")], "the emptied workspace left the set"
    assert await a.owners() == {"ws9/other": "ra"}
    assert await a.holder("ws1", "c") is None
    assert await a.owned_by("ra") == [("ws9", "other")]


@pytest.mark.parametrize(
    "since",
    [
        pytest.param("claimed", id="taken over by another replica"),
        pytest.param("moving", id="in transit"),
        pytest.param("changed", id="a service registered again"),
        pytest.param("added", id="a service added"),
    ],
)
async def test_a_departed_client_that_changed_since_the_read_is_left_alone(make_registry, since: str) -> None:
    a, b = make_registry("ra"), make_registry("rb")
    await a.claim("ws1", "c", user="alice", owner="ra")
    await a.register(svc("ws1/c:built-in"))
    [record] = await a.stale.owned()
    if since == "claimed":
        await b.claim("ws1", "c", user="alice", owner="rb")
    elif since == "moving":
        assert await a.begin_transit("ws1", "c", owner="ra", grace=5.0)
    elif since == "changed":
        await a.register(svc("ws1/c:built-in", changed=True))
    else:
        await a.register(svc("ws1/c:new"))
    before = (await listed(a), await a.owners(), await a.holder("ws1", "c"))
    [(_, gone, removed)] = await a.stale.remove([Stale(record.client, record.services, departed=True)])
    assert (gone, removed) == (False, [])
    assert (await listed(a), await a.owners(), await a.holder("ws1", "c")) == before

"""A client's departure costs Redis its own services, never the whole workspace's (a real Valkey).

Finding a client's services by reading its workspace's whole services hash
cost 14 ms a departure in a workspace of 10,000 clients: when they all left
at once, Redis was blocked for minutes (and every replica's lease renewal
with it). Each test fills a workspace, then counts, in Redis's own command
statistics, what one departure made it do: no ``HGETALL``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from switchboard.backends.redis import RedisRegistry
from switchboard.protocol.hypha.services import ServiceQuery
from switchboard.testing import ValkeyServer

pytestmark = pytest.mark.timeout(60)

CROWD = 300  # clients already in the workspace


def svc(full_id: str) -> Any:
    ws = full_id.partition("/")[0]
    name = full_id.rpartition(":")[2]
    return {"id": full_id, "name": name, "type": "generic", "config": {"visibility": "protected", "workspace": ws}}


@pytest.fixture
async def registry(valkey: ValkeyServer) -> AsyncIterator[RedisRegistry]:
    made = RedisRegistry(valkey.url, replica_id="r1", key_prefix=f"t{uuid.uuid4().hex[:8]}:")
    for n in range(CROWD):
        await made.register(svc(f"ws/c{n}:built-in"))
    yield made
    await made.close()


class Stats:
    """The commands Redis ran (those of scripts included) inside the block: ``calls``, name → count."""

    def __init__(self, valkey: ValkeyServer) -> None:
        self.valkey = valkey

    def __enter__(self) -> Stats:
        with self.valkey.client() as admin:
            admin.config_resetstat()
        return self

    def __exit__(self, *exc: object) -> None:
        with self.valkey.client() as admin:
            stats = admin.info("commandstats")
        self.calls = {k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.items()}


async def test_a_departure_reads_only_the_clients_own_services(registry, valkey) -> None:
    await registry.register(svc("ws/c7:echo"))
    with Stats(valkey) as stats:
        removed = await registry.remove_client("ws", "c7")
    assert sorted(i["id"] for i in removed) == ["ws/c7:built-in", "ws/c7:echo"]
    assert "hgetall" not in stats.calls, stats.calls
    assert len(await registry.find(ServiceQuery("ws"))) == CROWD - 1


async def test_a_grace_that_ends_reads_only_the_clients_own_services(registry, valkey) -> None:
    assert await registry.begin_transit("ws", "c3", owner="r1", grace=0)
    with Stats(valkey) as stats:
        expiry = await registry.expire_transit("ws", "c3")
    assert expiry.state == "expired"
    assert [i["id"] for i in expiry.removed] == ["ws/c3:built-in"]
    assert "hgetall" not in stats.calls, stats.calls


async def test_a_service_unregistered_before_is_not_removed_again(registry, valkey) -> None:
    await registry.register(svc("ws/c5:one"))
    await registry.register(svc("ws/c5:two"))
    assert await registry.unregister("ws/c5:one") is not None
    with Stats(valkey) as stats:
        removed = await registry.remove_client("ws", "c5")
    assert sorted(i["id"] for i in removed) == ["ws/c5:built-in", "ws/c5:two"]
    assert "hgetall" not in stats.calls, stats.calls


async def test_a_dead_replicas_clients_go_without_reading_whole_workspaces(registry, valkey) -> None:
    with Stats(valkey) as stats:
        removed = await registry.remove_replica_state("r1")
    assert len(removed) == CROWD
    assert "hgetall" not in stats.calls, stats.calls
    assert await registry.find(ServiceQuery("ws")) == []


async def test_registrations_written_again_after_a_loss_are_indexed_too(registry, valkey: ValkeyServer) -> None:
    with valkey.client() as admin:  # this test's keys lost, as by a Redis restarted empty
        admin.delete(*admin.keys(f"{registry._p}*"))
    assert await registry.reassert([svc("ws/c1:built-in"), svc("ws/c1:echo")]) == 2
    with Stats(valkey) as stats:
        removed = await registry.remove_client("ws", "c1")
    assert sorted(i["id"] for i in removed) == ["ws/c1:built-in", "ws/c1:echo"]
    assert "hgetall" not in stats.calls, stats.calls


async def test_a_client_registered_without_the_index_is_still_removed(registry, valkey) -> None:
    """As by a replica of an older version: its services, no index entry."""
    p = registry._p
    with valkey.client() as admin:
        admin.hset(f"{p}svc:ws", "old:built-in", '{"id": "ws/old:built-in"}')
        admin.hset(f"{p}owner", "ws/old", "r1")
    removed = await registry.remove_client("ws", "old")
    assert [i["id"] for i in removed] == ["ws/old:built-in"]
    with valkey.client() as admin:
        assert not admin.hexists(f"{p}svc:ws", "old:built-in")

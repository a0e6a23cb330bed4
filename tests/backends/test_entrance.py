"""What every ``Entrance`` (the stores' part of an admission) must do, on each backend.

The embedded stores asked one by one (``StoreEntrance``), one Valkey and a
Valkey Cluster (``RedisEntrance``: one pipeline of reads, whose keys lie in
several slots on a cluster, and one script for the count and the claim, whose
keys share the registry's hash tag) must agree on every answer, and a refusal
must leave nothing counted or claimed.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from switchboard.backends.base import ConnectionCounts, Entering, Entrance, Registry, WorkspaceStore
from switchboard.backends.entrance import StoreEntrance
from switchboard.backends.memory import MemoryConnectionCounts, MemoryRegistry
from switchboard.backends.memory_workspaces import MemoryWorkspaceStore
from switchboard.backends.redis.assemble import redis_backends
from switchboard.backends.redis.shared.connection import make_client
from switchboard.backends.redis.stores.entrance import RedisEntrance
from switchboard.backends.redis.stores.revoked import RedisRevocations
from switchboard.backends.redis.stores.workspaces import RedisWorkspaceStore
from switchboard.backends.revocations import MemoryRevocations, Revocations
from switchboard.clock import SystemClock
from switchboard.errors import BackendError
from switchboard.protocol.hypha.services import ServiceInfo
from switchboard.testing import ValkeyServer
from switchboard.testing.valkey_cluster import ValkeyCluster

WS = "entry-ws"
TTL = 3600.0


@dataclass
class Stores:
    entrance: Entrance
    revocations: Revocations
    workspaces: WorkspaceStore
    registry: Registry
    counts: ConnectionCounts


@pytest.fixture(scope="module")
def valkey_entrance() -> Any:
    with ValkeyServer() as server:
        yield server


@pytest.fixture(params=["memory", "redis", "cluster"])
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[Stores]:
    clock = SystemClock()
    closing: list[Any] = []
    if request.param == "memory":
        revocations: Revocations = MemoryRevocations(clock, per_principal=100, total=1_000)
        workspaces: WorkspaceStore = MemoryWorkspaceStore(clock=clock, ttl=TTL)
        registry: Registry = MemoryRegistry(clock=clock)
        counts: ConnectionCounts = MemoryConnectionCounts()
        entrance: Entrance = StoreEntrance(
            revocations=revocations, registry=registry, counts=counts, workspaces=workspaces
        )
    else:
        if request.param == "redis":
            server = request.getfixturevalue("valkey_entrance")
            server.client().flushall()
            url, cluster = server.url, False
        else:
            nodes: ValkeyCluster = request.getfixturevalue("valkey_cluster")
            for port in nodes.masters_ports():
                with nodes.client(port) as admin:
                    admin.flushall()
            url, cluster = nodes.url, True
        parts = redis_backends(url, cluster=cluster, clock=clock, replica_id="here")
        closing.append(parts.client)
        registry, counts = parts.registry, parts.counts
        # as the app builds them: the revocations and the records keep their keys outside the hash tag
        revocations = RedisRevocations(parts.client, clock=clock, per_principal=100, total=1_000)
        workspaces = RedisWorkspaceStore(parts.client, ttl=TTL)
        entrance = RedisEntrance(parts.client, replica_id="here", registry_prefix=parts.key_prefix)
    try:
        yield Stores(entrance, revocations, workspaces, registry, counts)
    finally:
        await registry.close()
        for client in closing:
            await client.aclose()


def built_in(client_id: str, creator: str) -> ServiceInfo:
    return {
        "id": f"{WS}/{client_id}:built-in",
        "name": "built-in",
        "type": "built-in",
        "config": {"visibility": "public", "created_by": {"id": creator}},
    }


async def enter(stores: Stores, client_id: str, user: str, *, owner: str = "here", limit: int = 100) -> Any:
    return await stores.entrance.enter(
        Entering(WS, client_id, user=user, owner=owner, max_per_user=limit, max_per_workspace=limit)
    )


class TestArrival:
    async def test_nothing_is_known_of_a_new_client_in_a_new_workspace(self, stores: Stores) -> None:
        arrival = await stores.entrance.arrival(("t1",), WS, "c1")
        assert (arrival.revoked, arrival.deleted_at, arrival.record) == (False, None, None)
        assert (arrival.holder, arrival.registration) == (None, None)

    async def test_a_revoked_id_among_the_tokens_ids_is_seen(self, stores: Stores) -> None:
        await stores.revocations.revoke("credential", until=time.time() + 60, principal="alice")
        assert (await stores.entrance.arrival(("token", "credential"), WS, "c1")).revoked
        assert not (await stores.entrance.arrival(("token", "other"), WS, "c1")).revoked
        assert not (await stores.entrance.arrival((), WS, "c1")).revoked

    async def test_the_deletion_mark_and_the_record_are_read(self, stores: Stores) -> None:
        await stores.workspaces.mark_deleted(WS, 1234.5, ttl=60, principal="alice")
        await stores.workspaces.put({"id": WS, "owners": ["alice"]}, overwrite=True)
        arrival = await stores.entrance.arrival(("t1",), WS, "c1")
        assert arrival.deleted_at == 1234.5
        assert arrival.record is not None
        assert arrival.record["owners"] == ["alice"]
        assert (await stores.entrance.arrival(("t1",), "another-ws", "c1")).deleted_at is None

    async def test_the_holder_and_the_registration_of_the_client_id_are_read(self, stores: Stores) -> None:
        assert (await enter(stores, "c1", "alice")).claim.holder is None
        await stores.registry.register(built_in("c1", "alice"))
        arrival = await stores.entrance.arrival((), WS, "c1")
        assert arrival.holder == "alice"
        assert arrival.registration == built_in("c1", "alice")
        other = await stores.entrance.arrival((), WS, "c2")
        assert (other.holder, other.registration) == (None, None)


class TestEnter:
    async def test_the_first_user_gets_the_id_and_is_counted(self, stores: Stores) -> None:
        entry = await enter(stores, "c1", "alice")
        assert entry.counted
        assert entry.over is None
        assert (entry.claim.holder, entry.claim.previous_owner) == (None, None)
        assert (entry.per_user, entry.per_workspace) == (1, 1)
        assert await stores.registry.holder(WS, "c1") == "alice"

    async def test_another_user_is_refused_the_id_and_nothing_is_counted(self, stores: Stores) -> None:
        await enter(stores, "c1", "alice")
        refused = await enter(stores, "c1", "mallory")
        assert refused.claim.holder == "alice"
        if refused.counted:  # counted before the claim was refused (the embedded stores): the caller releases it
            await stores.counts.remove("mallory", WS)
        assert await stores.registry.holder(WS, "c1") == "alice"
        assert (await enter(stores, "c2", "mallory")).per_user == 1, "the refused connection stayed counted"

    async def test_the_same_user_again_takes_the_id_over_from_another_replica(self, stores: Stores) -> None:
        if isinstance(stores.entrance, StoreEntrance) and isinstance(stores.registry, MemoryRegistry):
            pytest.skip("one process: the embedded registry knows no other replica")
        await enter(stores, "c1", "alice", owner="there")
        entry = await enter(stores, "c1", "alice", owner="here")
        assert entry.claim.holder is None
        assert entry.claim.previous_owner == "there"

    @pytest.mark.parametrize("limit_on", ["user", "workspace"])
    async def test_past_a_limit_is_refused_and_nothing_is_claimed(self, stores: Stores, limit_on: str) -> None:
        await enter(stores, "c1", "alice" if limit_on == "user" else "bob", limit=2)
        await enter(stores, "c2", "alice", limit=2)
        over = await enter(stores, "c3", "alice", limit=2)
        assert over.over == limit_on
        if over.counted:
            await stores.counts.remove("alice", WS)
        assert await stores.registry.holder(WS, "c3") is None, "a refused connection claimed its id"
        within = await enter(stores, "c3", "alice", limit=3)
        assert within.over is None
        assert (within.per_user, within.per_workspace) == (
            3 if limit_on == "user" else 2,
            3,
        )


async def test_redis_away_refuses_the_admission_rather_than_pass_a_revoked_token() -> None:
    """The revocation is read with the rest of an admission's reads: when Redis cannot answer,
    the whole read fails (the door answers "retry"), never an arrival that says "not revoked"."""
    clock = SystemClock()
    with ValkeyServer() as gone:
        client = make_client(gone.url)
        try:
            await RedisRevocations(client, clock=clock, per_principal=100, total=1_000).revoke(
                "jti-3", until=clock.time() + 60, principal="alice"
            )
            entrance = RedisEntrance(client, replica_id="here")
            assert (await entrance.arrival(("jti-3",), WS, "c1")).revoked
            gone.stop()
            with pytest.raises(BackendError, match="admission reads failed"):
                await entrance.arrival(("jti-3",), WS, "c1")
            with pytest.raises(BackendError, match="admission failed"):
                await entrance.enter(
                    Entering(WS, "c1", user="alice", owner="here", max_per_user=9, max_per_workspace=9)
                )
        finally:
            await client.aclose()

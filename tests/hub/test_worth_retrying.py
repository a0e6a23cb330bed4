"""Whether a frame that reached nobody waits for its target or fails its caller at once."""

from __future__ import annotations

from switchboard.backends.memory import MemoryBus
from switchboard.backends.redis import RedisRegistry
from switchboard.protocol.hypha.services import ServiceQuery
from switchboard.server.app import build_hub
from switchboard.testing import ValkeyServer
from switchboard.testing.hub import settings_for_tests


def built_in(workspace: str, client_id: str) -> dict:
    return {
        "id": f"{workspace}/{client_id}:built-in",
        "name": "built-in",
        "type": "built-in",
        "description": None,
        "docs": None,
        "app_id": "*",
        "config": {"visibility": "protected", "workspace": workspace},
    }


async def test_an_empty_answer_from_a_registry_that_lost_its_data_is_not_trusted() -> None:
    with ValkeyServer() as valkey:
        registry = RedisRegistry(valkey.url, replica_id="r1")
        hub = build_hub(settings_for_tests(), registry=registry, bus=MemoryBus())
        try:
            await registry.register(built_in("ws1", "alive"))
            await registry.check_reset()  # the cluster loop records the epoch at start
            assert await hub.dispatch.remote.worth_retrying("ws1/alive")  # registered: wait for it
            assert not await hub.dispatch.remote.worth_retrying("ws1/gone")  # nobody claims it: fail now

            valkey.restart()  # back empty: "alive" is re-asserted within seconds
            assert await registry.find(ServiceQuery("ws1", "alive", "built-in")) == []
            assert await hub.dispatch.remote.worth_retrying("ws1/alive")  # not failed in the meantime
            assert await hub.dispatch.remote.worth_retrying("ws1/gone")  # cannot tell yet either

            await registry.check_reset()  # re-assertion has run
            assert not await hub.dispatch.remote.worth_retrying("ws1/gone")
        finally:
            await registry.close()

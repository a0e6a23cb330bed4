"""Faults of the one Redis every replica shares, injected for real: nothing hangs, nothing lies.

Two real replica processes share one real Valkey; a fault proxy
(:mod:`switchboard.testing.proxy`) sits between a replica and Valkey where a
test needs to cut one replica off, and Valkey's own ``CLIENT KILL`` and an
empty restart play the rest.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from switchboard.testing import ThreadedFaultProxy, ValkeyServer
from switchboard.testing.replica import ReplicaProcess
from switchboard.testing.wait import scaled

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def pubsub_addr(redis: ValkeyServer, replica_id: str) -> str:
    """The ``ip:port`` Valkey sees for a replica's pub/sub connection (named ``sb-bus-<id>``)."""
    with redis.client() as admin:
        for client in admin.client_list():
            if client.get("name") == f"sb-bus-{replica_id}":
                return str(client["addr"])
    raise AssertionError(f"no pub/sub connection of {replica_id}")


async def test_a_manager_reply_that_reaches_nobody_is_retried_not_dropped(redis_server, clients):
    """B's manager asks a provider on A (``get_service`` fetches the service object; an HTTP
    call on B is made by B's manager). A sends the provider's reply back on B's replica
    channel; while B's pub/sub connection is down that publish reaches nobody, and the
    reply must wait for B's subscription like a client's frame does, not be dropped
    (the caller would wait its whole timeout)."""
    a = ReplicaProcess(replica_id="ra", redis_url=redis_server.url).start()
    with ThreadedFaultProxy("127.0.0.1", redis_server.port) as proxy:
        b = ReplicaProcess(replica_id="rb", redis_url=proxy.url_for_redis(), args=["--no-links"]).start()
        try:
            provider = await clients(a.url, client_id="prov")
            ws = provider.config["workspace"]
            await provider.register_service({"id": "s", "config": {"visibility": "public"}, "f": lambda: "ok"})
            token = await provider.generate_token()
            caller = await clients(b.url, client_id="caller", token=token)
            assert await (await caller.get_service(f"{ws}/prov:s")).f() == "ok"

            proxy.drop_new()  # B cannot reconnect to Valkey ...
            redis_server.kill_clients(type_=None, addr=pubsub_addr(redis_server, "rb"))  # ... nor hear it
            loop = asyncio.get_running_loop()
            # B's command connections stay open: it can still read the registry and publish
            started = loop.time()
            lookup = asyncio.ensure_future(caller.get_service(f"{ws}/prov:s", {"timeout": 20}))
            async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http:
                http_call = asyncio.ensure_future(http.get(f"{b.url}/{ws}/services/prov:s/f", timeout=40))
                await asyncio.sleep(1.5)  # the replies have reached nobody by now
                proxy.drop_new(False)  # B resubscribes (its bus retries within a second or two)
                svc = await asyncio.wait_for(lookup, scaled(15))
                response = await asyncio.wait_for(http_call, scaled(15))
            elapsed = loop.time() - started
            assert await svc.f() == "ok"
            assert response.status_code == 200, response.text
            assert response.json() == "ok"
            # the replies waited for B's subscription (about 2 s), not the callers' timeouts (20 s, 30 s)
            assert elapsed < scaled(8), f"lookup and HTTP call took {elapsed:.1f}s"
        finally:
            b.kill()
            a.kill()

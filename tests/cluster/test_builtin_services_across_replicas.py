"""The built-in services on two replicas sharing one Valkey (issue 38, items 4 and 5): ``public/queue`` is one set of
queues whichever replica a client is on, bounds included, and a pop waiting on one replica gets a task pushed on the
other; ``admin-utils`` lists both replicas and closes a client on whichever holds it. One pair serves them all."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from hypha_rpc import connect_to_server
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from switchboard.clock import SystemClock
from switchboard.hub.identity.auth import TokenIssuer
from switchboard.hub.identity.users import ROOT, Permission
from switchboard.testing import ValkeyServer
from switchboard.testing.replica import ReplicaProcess

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(90)]

PER_WORKSPACE = 3


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[ReplicaProcess, ReplicaProcess]]:
    args = ["--max-queue-items-per-workspace", str(PER_WORKSPACE)]
    with ValkeyServer() as redis:
        started = [ReplicaProcess(replica_id=name, redis_url=redis.url, args=args) for name in ("queue-a", "queue-b")]
        try:
            yield started[0].start(), started[1].start()
        finally:
            for replica in started:
                replica.kill()


@pytest.fixture
async def connect() -> AsyncIterator[Any]:
    made: list[Any] = []

    async def _connect(replica: ReplicaProcess, **config: Any) -> Any:
        client = await connect_to_server({"server_url": replica.url, "method_timeout": 20, **config})
        made.append(client)
        return client

    yield _connect
    for client in reversed(made):
        await client.disconnect()


async def test_the_queues_are_shared_by_the_replicas_bounds_included(
    pair: tuple[ReplicaProcess, ReplicaProcess], connect: Any
) -> None:
    a, b = pair
    on_a = await connect(a)
    on_b = await connect(b, workspace=on_a.config["workspace"], token=await on_a.generate_token())
    qa, qb = await on_a.get_service("public/queue"), await on_b.get_service("public/queue")
    waiting = asyncio.ensure_future(qb.pop("jobs", 10))
    await qa.push("jobs", {"n": 1})
    assert await asyncio.wait_for(waiting, 10) == {"n": 1}, "a pop waiting on B gets a task pushed on A"
    for n in range(PER_WORKSPACE):
        await (qa if n % 2 else qb).push("jobs", {"n": n})
    with pytest.raises(Exception, match="Queue full"):  # noqa: PT011 - hypha-rpc's error type
        await qa.push("jobs", {"n": "one more"})
    assert await qb.get_length("jobs") == PER_WORKSPACE
    assert await qa.peek("jobs", 2) == [{"n": 0}, {"n": 1}]
    assert [await qa.pop("jobs", 0) for _ in range(PER_WORKSPACE)] == [{"n": n} for n in range(PER_WORKSPACE)]
    assert await qb.pop("jobs", 0) is None


async def test_root_on_one_replica_lists_both_and_kicks_out_a_client_of_the_other(
    pair: tuple[ReplicaProcess, ReplicaProcess], connect: Any
) -> None:
    a, b = pair
    token = TokenIssuer(a.jwt_secret, SystemClock()).issue(
        ROOT, workspace="ws-user-root", permission=Permission.ADMIN, expires_in=600
    )
    admin = await (await connect(a, token=token)).get_service("admin-utils")
    assert set(await admin.list_servers()) == {"queue-a", "queue-b"}
    url = b.url.replace("http", "ws", 1) + "/ws"
    async with ws_connect(url, open_timeout=5, close_timeout=2) as victim:
        hello = {"client_id": "victim", "workspace": None, "token": None, "reconnection_token": None}
        await victim.send(json.dumps(hello))
        info = json.loads(await asyncio.wait_for(victim.recv(), 5))
        await admin.kickout_client(info["workspace"], "victim", 4002, "moved")
        async with asyncio.timeout(10):
            for _ in range(1000):
                try:
                    await victim.recv()
                except ConnectionClosed:
                    break
        assert (victim.close_code, victim.close_reason) == (4002, "moved")

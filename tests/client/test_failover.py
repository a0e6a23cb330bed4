"""Real replica processes SIGKILLed under SDK clients: restart, failover, and a hub that stays dead."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from hypha_rpc import connect_to_server

from switchboard.client import (
    Client,
    Disconnected,
    GaveUp,
    GivingUp,
    Reconnected,
    Reconnecting,
    connect,
)
from switchboard.testing import ValkeyServer
from switchboard.testing.replica import ReplicaProcess
from switchboard.testing.wait import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(90)]


class Events:
    """A client's connection events, and bounded waits on them."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def __call__(self, event: Any) -> None:
        self.seen.append(event)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.seen if isinstance(e, kind)]

    async def wait(self, kind: type, *, count: int = 1, timeout: float = 20) -> Any:
        found = await eventually(
            lambda: len(self.of(kind)) >= count and self.of(kind),
            timeout=timeout,
            what=f"{count} {kind.__name__} event(s)",
        )
        return found[count - 1]


@pytest.fixture
def processes() -> Iterator[list[ReplicaProcess]]:
    started: list[ReplicaProcess] = []
    yield started
    for replica in started:
        replica.kill()


@pytest.fixture
async def clients() -> AsyncIterator[list[Client]]:
    made: list[Client] = []
    yield made
    for client in reversed(made):
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.disconnect(), 5)


async def start(processes: list[ReplicaProcess], replica_id: str, **kwargs: Any) -> ReplicaProcess:
    replica = ReplicaProcess(replica_id=replica_id, **kwargs)
    processes.append(replica)
    await asyncio.to_thread(replica.start)  # the clients' loops keep running meanwhile
    return replica


async def sdk(clients: list[Client], urls: Any, **kwargs: Any) -> Client:
    kwargs.setdefault("method_timeout", 10)
    client = await connect(urls, **kwargs)
    clients.append(client)
    return client


async def answers(svc: Any) -> bool:
    return await svc.f() == "alive"


async def test_a_replica_killed_and_restarted_gets_its_clients_and_services_back(processes, clients):
    replica = await start(processes, "solo")
    events = Events()
    provider = await sdk(clients, replica.url, client_id="prov", on_event=events, initial_delay=0.2, max_delay=1.0)
    await provider.register_service({"id": "s", "config": {"visibility": "public"}, "f": lambda: "alive"})
    caller = await sdk(clients, replica.url, client_id="caller", initial_delay=0.2, max_delay=1.0)
    svc = await caller.get_service(f"{provider.workspace}/prov:s")
    assert await answers(svc)

    await asyncio.to_thread(replica.kill)
    # down for a few seconds: until the provider has been retrying for 2 s
    await eventually(
        lambda: any(e.elapsed >= 2.0 for e in events.of(Reconnecting)),
        timeout=20,
        what="2 s of failed reconnect attempts",
    )
    await asyncio.to_thread(replica.start)

    back = await events.wait(Reconnected)
    assert back.attempts >= 4
    assert back.remaining > 100
    assert provider.client_id == "prov"
    assert provider.url == caller.url
    await eventually(lambda: answers(svc), timeout=20, what="the held reference callable again")
    stock = await connect_to_server({"server_url": replica.url, "client_id": "stock"})
    try:
        fresh = await stock.get_service(f"{provider.workspace}/prov:s")
        assert await fresh.f() == "alive"
    finally:
        await stock.disconnect()


@pytest.fixture
def valkey() -> Iterator[ValkeyServer]:
    with ValkeyServer() as server:
        yield server


async def test_killing_the_clients_replica_moves_it_to_the_sibling_within_a_second(processes, clients, valkey):
    a = await start(processes, "ra", redis_url=valkey.url)
    b = await start(processes, "rb", redis_url=valkey.url)
    events = Events()
    provider = await sdk(clients, [a.url, b.url], client_id="prov", on_event=events)
    await provider.register_service({"id": "s", "config": {"visibility": "public"}, "f": lambda: "alive"})
    caller = await sdk(clients, b.url, client_id="caller")
    svc = await caller.get_service(f"{provider.workspace}/prov:s")
    assert await answers(svc)
    assert provider.url.startswith(f"ws://127.0.0.1:{a.port}")

    loop = asyncio.get_running_loop()
    killed = loop.time()
    await asyncio.to_thread(a.kill)
    await events.wait(Reconnected, timeout=10)
    await eventually(lambda: answers(svc), timeout=10, what="the provider callable through replica B")
    took = loop.time() - killed
    assert provider.url.startswith(f"ws://127.0.0.1:{b.port}")
    assert took < 1.5, f"failover took {took:.2f} s"
    assert events.of(Reconnected)[0].attempts <= 2  # B first: the dropped URL goes last


async def test_a_hub_that_never_comes_back_fails_cleanly_at_the_deadline(processes, clients):
    replica = await start(processes, "gone")
    events = Events()
    client = await sdk(clients, replica.url, on_event=events, max_wait=2.0, initial_delay=0.1, max_delay=0.5)
    await client.register_service({"id": "s", "f": lambda: "alive"})
    svc = await client.get_service("s")

    await asyncio.to_thread(replica.kill)
    await events.wait(Disconnected, timeout=10)
    waiting = asyncio.ensure_future(svc.f())  # made during the outage: waits, then gets the error
    gave = await events.wait(GivingUp, timeout=10)
    error = gave.error
    assert isinstance(error, GaveUp)
    assert 2.0 <= error.outage_seconds < 3.0
    assert error.attempts >= 4
    assert f"after an outage of {error.outage_seconds:.1f} s and {error.attempts} attempts" in str(error)
    with pytest.raises(GaveUp):
        await asyncio.wait_for(waiting, 5)
    with pytest.raises(GaveUp):
        await client.echo("new call")
    with pytest.raises(GaveUp):
        await client.serve()

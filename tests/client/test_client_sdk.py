"""The SDK against a real hub in the test's loop: hypha-rpc features, and what a drop does to calls."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

import switchboard
from switchboard.client import (
    CallInterrupted,
    Client,
    ClientClosed,
    Reconnected,
    connect,
    idempotent,
)
from switchboard.client.wire import websocket_dial
from switchboard.testing.hub import RunningServer
from switchboard.testing.wait import eventually

pytestmark = pytest.mark.timeout(60)

Connect = Callable[..., Awaitable[Client]]


@pytest.fixture
async def sdk(server: RunningServer) -> AsyncIterator[Connect]:
    """``await sdk(client_id=...)``: SDK clients on the in-process hub, closed after the test."""
    made: list[Client] = []

    async def _connect(**kwargs: Any) -> Client:
        kwargs.setdefault("method_timeout", 10)
        kwargs.setdefault("initial_delay", 0.05)
        client = await connect(server.url, **kwargs)
        made.append(client)
        return client

    yield _connect
    for client in reversed(made):
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.disconnect(), 5)


def drop(server: RunningServer, client: Client, code: int = 1012) -> None:
    """The hub closes this client's connection, as a draining replica does."""
    server.hub.peers[f"{client.workspace}/{client.client_id}"].close(code, "Server restarting, please reconnect")


async def reconnected(client: Client) -> Reconnected:
    back: asyncio.Future[Reconnected] = asyncio.get_running_loop().create_future()

    def on_event(event: Any) -> None:
        if isinstance(event, Reconnected) and not back.done():
            back.set_result(event)

    client.add_listener(on_event)
    try:
        return await asyncio.wait_for(back, 10)
    finally:
        client.remove_listener(on_event)


async def test_the_core_api_of_connect_to_server(sdk, server):
    assert switchboard.connect is connect
    client = await sdk(client_id="core")
    assert client.client_id == "core"
    assert client.config["client_id"] == "core"
    assert client.config["workspace"] == client.workspace
    assert client.manager_id == "manager-switchboard"
    assert client.connected
    assert client.url.endswith("/ws")
    await client.register_service({"id": "calc", "config": {"visibility": "public"}, "add": lambda a, b: a + b})
    calc = await client.get_service("calc")
    assert await calc.add(2, 3) == 5
    assert await client.echo({"x": [1, 2]}) == {"x": [1, 2]}
    assert "calc" in {s["id"].split(":")[-1] for s in await client.list_services({"workspace": client.workspace})}
    assert isinstance(await client.generate_token(), str)
    assert [c["id"] for c in await client.list_clients()] == [f"{client.workspace}/core"]  # via __getattr__
    await client.unregister_service("calc")
    with pytest.raises(Exception, match="not found"):
        await client.get_service("calc")


async def test_hypha_rpc_clients_and_sdk_clients_call_each_other(sdk, connect):
    provider = await sdk(client_id="sdk-provider")

    async def count(n, report):
        for i in range(n):
            await report(i)
        return n

    async def numbers(n):
        for i in range(n):
            yield i

    await provider.register_service(
        {"id": "svc", "config": {"visibility": "public"}, "count": count, "numbers": numbers}
    )
    stock = await connect(client_id="stock")
    svc = await stock.get_service(f"{provider.workspace}/sdk-provider:svc")
    seen: list[int] = []
    assert await svc.count(3, seen.append) == 3
    assert seen == [0, 1, 2]
    assert [i async for i in await svc.numbers(4)] == [0, 1, 2, 3]  # a generator
    await stock.register_service({"id": "back", "config": {"visibility": "public"}, "ping": lambda: "pong"})
    back = await provider.get_service(f"{stock.config['workspace']}/stock:back")
    assert await back.ping() == "pong"


async def test_after_a_drop_id_workspace_services_and_subscriptions_come_back(sdk, server):
    provider = await sdk(client_id="p")
    caller = await sdk(client_id="c")
    await provider.register_service({"id": "s", "config": {"visibility": "public"}, "f": lambda: "alive"})
    await provider.subscribe("news")
    svc = await caller.get_service(f"{provider.workspace}/p:s")
    workspace = provider.workspace
    news: list[Any] = []
    provider.on("news", news.append)

    back = reconnected(provider)
    drop(server, provider)
    event = await back
    assert event.attempts == 1  # 1012: at once, no backoff
    assert provider.workspace == workspace
    assert provider.client_id == "p"
    assert await svc.f() == "alive"  # the reference taken before the drop still works
    assert provider.subscriptions == ("news",)
    await provider.emit({"type": "news", "to": "*", "data": 1})
    await eventually(lambda: news, timeout=5, what="a broadcast after re-subscribing")


async def test_a_service_the_hub_refuses_after_a_drop_is_named_in_a_warning(sdk, server, caplog):
    """hypha-rpc re-registers every service on a new connection and reports the ones that failed;
    the SDK says which, instead of coming back silently without them."""
    provider = await sdk(client_id="partial")
    await provider.register_service({"id": "kept", "config": {"visibility": "public"}, "f": lambda: "alive"})
    # only in the client (notify=False): the hub refuses the name once the RPC registers it again
    await provider.register_service({"id": "not an id!", "f": lambda: 0}, notify=False)
    caplog.set_level(logging.WARNING, logger="switchboard.client")

    back = reconnected(provider)
    drop(server, provider)
    await back
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w for w in warnings if "not re-registered" in w and "not an id!" in w and "kept" not in w], warnings
    assert await (await provider.get_service(f"{provider.workspace}/partial:kept")).f() == "alive"


async def test_a_call_in_flight_fails_fast_unless_idempotent(sdk, server):
    provider = await sdk(client_id="slow-provider")
    caller = await sdk(client_id="caller", method_timeout=30)
    runs = {"plain": 0, "idem": 0}
    gate = asyncio.Event()

    async def plain():
        runs["plain"] += 1
        await gate.wait()
        return "plain"

    @idempotent
    async def idem():
        runs["idem"] += 1
        await gate.wait()
        return "idem"

    info = await provider.register_service(
        {"id": "slow", "config": {"visibility": "public"}, "plain": plain, "idem": idem}
    )
    assert info["config"]["idempotent"] == ["idem"]
    svc = await caller.get_service(f"{provider.workspace}/slow-provider:slow")
    assert svc.idem.idempotent
    assert not svc.plain.idempotent

    call = asyncio.ensure_future(svc.plain())
    await eventually(lambda: runs["plain"] == 1, timeout=5, what="the provider running plain()")
    started = asyncio.get_running_loop().time()
    drop(server, caller)
    with pytest.raises(CallInterrupted, match="not declared idempotent"):
        await call
    assert asyncio.get_running_loop().time() - started < 2  # not the 30 s method timeout
    await reconnected(caller) if not caller.connected else None

    call = asyncio.ensure_future(svc.idem())
    await eventually(lambda: runs["idem"] == 1, timeout=5, what="the provider running idem()")
    drop(server, caller)
    await eventually(lambda: runs["idem"] == 2, timeout=10, what="idem() retried after reconnecting")
    gate.set()
    assert await call == "idem"


async def test_calls_after_disconnect_say_so(sdk):
    client = await sdk(client_id="bye")
    await client.register_service({"id": "s", "f": lambda: 1})
    svc = await client.get_service("s")
    await client.disconnect()
    with pytest.raises(ClientClosed):
        await svc.f()


async def test_an_idempotent_call_to_a_provider_that_is_not_connected_is_retried_until_it_is_back(sdk, server):
    """The hub says "not connected" (the provider left, or its grace ran out): the SDK retries
    idempotent calls on its backoff, within its budget; others fail at once."""
    gate = asyncio.Event()
    gate.set()
    dial = websocket_dial()

    async def gated(url: str) -> Any:
        await gate.wait()
        return await dial(url)

    @idempotent
    def ping(n):
        return n

    provider = await sdk(client_id="prov", dial=gated)
    await provider.register_service({"id": "svc", "config": {"visibility": "public"}, "ping": ping, "bump": lambda: 1})
    caller = await sdk(client_id="caller")
    svc = await caller.get_service(f"{provider.workspace}/prov:svc")
    gate.clear()  # its reconnection waits until the test lets it through
    drop(server, provider, code=1008)  # dropped by the hub: a departure, not a move
    await eventually(lambda: f"{provider.workspace}/prov" not in server.hub.peers, timeout=5, what="the drop")
    with pytest.raises(Exception, match="is not connected"):
        await svc.bump()

    def refused() -> float:
        return (
            server.hub.metrics.registry.get_sample_value(
                "switchboard_undeliverable_messages_total", {"replica": server.hub.replica_id}
            )
            or 0.0
        )

    before = refused()
    call = asyncio.ensure_future(svc.ping(7))
    await eventually(lambda: refused() >= before + 2, timeout=5, what="the idempotent call refused, then retried")
    assert not call.done()
    gate.set()
    assert await asyncio.wait_for(call, 10) == 7


async def test_a_call_running_at_the_provider_when_its_connection_drops_is_still_answered(sdk, server, connect):
    """The provider's connection ends under a running call (a drain hands it to a sibling): the
    call finishes and its answer goes out on the next connection. hypha-rpc's heartbeat to the
    caller must survive the drop: were it failed, the RPC would cancel the running call."""
    gate = asyncio.Event()

    async def slow():
        drop(server, provider)  # 1012, as the call starts (its heartbeat to the caller under way)
        await gate.wait()
        return "done"

    provider = await sdk(client_id="prov")
    await provider.register_service({"id": "svc", "config": {"visibility": "public"}, "slow": slow})
    caller = await connect(client_id="plain-caller", method_timeout=10)  # an unmodified hypha-rpc client
    svc = await caller.get_service(f"{provider.workspace}/prov:svc")
    back = asyncio.ensure_future(reconnected(provider))
    call = asyncio.ensure_future(svc.slow())
    await asyncio.wait_for(back, 10)
    gate.set()
    assert await asyncio.wait_for(call, 10) == "done"


async def test_a_plain_rpc_call_pending_when_the_caller_is_sent_away_gets_its_answer_after_the_move(sdk, server):
    """Only the SDK's own calls fail when a connection drops (they know how: CallInterrupted, or a
    retry); a call the RPC makes otherwise (a callback, a raw remote method) is left pending, and
    the hub delivers its answer once the caller is back."""
    gate, started = asyncio.Event(), asyncio.Event()

    async def slow():
        started.set()
        await gate.wait()
        return "done"

    provider = await sdk(client_id="prov")
    await provider.register_service({"id": "svc", "config": {"visibility": "public"}, "slow": slow})
    caller = await sdk(client_id="caller")
    raw = await caller.rpc.get_remote_service(f"{provider.workspace}/prov:svc")  # not wrapped by the SDK
    pending = asyncio.ensure_future(raw.slow())
    back = asyncio.ensure_future(reconnected(caller))
    await asyncio.wait_for(started.wait(), 5)
    drop(server, caller)  # 1012: in transit
    await asyncio.wait_for(back, 10)
    gate.set()
    assert await asyncio.wait_for(pending, 10) == "done"

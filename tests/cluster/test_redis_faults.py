"""Faults of the one Redis every replica shares, injected for real: nothing hangs, nothing lies.

Two real replica processes share one real Valkey; a fault proxy
(:mod:`switchboard.testing.proxy`) sits between a replica and Valkey where a
test needs to cut one replica off, and Valkey's own ``CLIENT KILL`` and an
empty restart play the rest.
"""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest
import websockets

from switchboard.client import connect
from switchboard.testing import ThreadedFaultProxy, ValkeyServer
from switchboard.testing.replica import ReplicaProcess
from switchboard.testing.wait import eventually, scaled

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
            # B's command pool holds a few connections (lookups side by side), as a busy replica's does
            # (its lease and presence record have connections of their own): those stay open through
            # the cut, only new ones are refused
            await asyncio.gather(*(caller.get_service(f"{ws}/prov:s") for _ in range(4)))

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


async def readiness(replica: ReplicaProcess) -> int:
    async with httpx.AsyncClient() as http:
        return (await http.get(f"{replica.url}/health/readiness", timeout=2)).status_code


async def ready_is(replica: ReplicaProcess, status: int) -> bool:
    return await readiness(replica) == status


async def timed_calls(svc, seconds: float, *, rate: float = 20) -> list[float]:
    """Call ``svc.f`` ``rate`` times a second for ``seconds``; every call's duration, sorted."""
    loop = asyncio.get_running_loop()

    async def one() -> float:
        started = loop.time()
        assert await asyncio.wait_for(svc.f(), scaled(10)) == "ok"
        return loop.time() - started

    calls = []
    for _ in range(int(seconds * rate)):
        calls.append(asyncio.ensure_future(one()))
        await asyncio.sleep(1 / rate)
    return sorted(await asyncio.gather(*calls))


async def keep_looking_up(client, service_id: str, seconds: float) -> list[str]:
    """Look ``service_id`` up and call it twice a second for ``seconds``; what went wrong, if anything."""

    async def once() -> str | None:
        try:
            svc = await asyncio.wait_for(client.get_service(service_id, {"timeout": 3}), 4)
            return None if await asyncio.wait_for(svc.f(), 3) == "ok" else "a wrong answer"
        except Exception as exc:  # noqa: BLE001 - every failure is reported by the test
            return f"{type(exc).__name__}: {str(exc)[-200:]}"

    tasks = []
    for _ in range(int(seconds * 2)):
        tasks.append(asyncio.ensure_future(once()))
        await asyncio.sleep(0.5)
    return [problem for problem in await asyncio.gather(*tasks) if problem]


@pytest.mark.alone
async def test_a_replica_cut_off_from_redis_serves_its_own_clients_at_full_speed(redis_server, clients):
    """With its Redis connection blackholed (no error, no close), a call between two clients of
    the same replica needs nothing from Redis: it stays as fast as before, while the replica
    turns not-ready within about 2 s. Meanwhile a client of the other replica keeps looking
    up and calling the same provider: its lookups fetch the service object from the provider,
    whose answers go back to the other replica's manager over the direct link between the two
    replicas (Redis cannot carry them), and never hold up the provider's other replies."""
    b = ReplicaProcess(replica_id="rb", redis_url=redis_server.url).start()
    with ThreadedFaultProxy("127.0.0.1", redis_server.port) as proxy:
        a = ReplicaProcess(replica_id="ra", redis_url=proxy.url_for_redis()).start()
        sdk = None
        try:
            provider = await clients(a.url, client_id="prov")
            ws = provider.config["workspace"]
            await provider.register_service({"id": "s", "config": {"visibility": "public"}, "f": lambda: "ok"})
            token = await provider.generate_token()
            caller = await clients(a.url, client_id="caller", token=token)
            svc = await caller.get_service(f"{ws}/prov:s")
            sdk = await connect(a.url, token=token, client_id="sdk")  # Switchboard's own client, too
            sdk_svc = await sdk.get_service(f"{ws}/prov:s")
            elsewhere = await clients(b.url, client_id="elsewhere", token=token)
            for _ in range(3):  # B learns the way to the provider: a direct link, which Redis's cut spares
                await (await elsewhere.get_service(f"{ws}/prov:s")).f()
            before = await timed_calls(svc, 1)
            lookups = asyncio.ensure_future(keep_looking_up(elsewhere, f"{ws}/prov:s", 9))

            loop = asyncio.get_running_loop()
            proxy.blackhole()
            cut = loop.time()
            calls = asyncio.ensure_future(timed_calls(svc, 8))
            sdk_calls = asyncio.ensure_future(timed_calls(sdk_svc, 8, rate=10))
            await eventually(lambda: ready_is(a, 503), timeout=10, interval=0.05, what="readiness 503")
            not_ready_after = loop.time() - cut
            during = await calls
            sdk_during = await sdk_calls
            elsewhere_wrong = await lookups
            proxy.pass_through()
            print(
                f"before {before[len(before) // 2]:.4f} {before[-1]:.4f}; during {during[len(during) // 2]:.4f} {during[-1]:.4f}; 503 after {not_ready_after:.2f}"
            )

            median_before, median_during = before[len(before) // 2], during[len(during) // 2]
            assert median_during < max(0.05, 5 * median_before), (
                f"median call {median_during * 1000:.1f} ms cut off, {median_before * 1000:.1f} ms before"
            )
            assert during[-1] < 0.5, f"slowest call {during[-1]:.2f}s cut off"
            assert sdk_during[len(sdk_during) // 2] < 0.05, f"SDK median {sdk_during[len(sdk_during) // 2]:.3f}s"
            assert sdk_during[-1] < 0.5, f"slowest SDK call {sdk_during[-1]:.2f}s cut off"
            assert not_ready_after < scaled(3), f"readiness 503 only after {not_ready_after:.1f}s"
            assert not elsewhere_wrong, f"lookups from the other replica failed: {elsewhere_wrong[:3]}"
        finally:
            if sdk is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(sdk.disconnect(), 5)
            a.kill()
            b.kill()


async def test_a_replica_cut_off_from_redis_turns_upgrades_away_before_accepting_them(redis_server, clients):
    """While its Redis does not answer, a replica answers a WebSocket upgrade with HTTP 503, as a
    draining one does, never with an accept and a close (final for hypha-rpc's JavaScript
    client); a hypha-rpc client whose connection drops meanwhile keeps redialling and is
    back, services and all, once Redis is."""
    with ThreadedFaultProxy("127.0.0.1", redis_server.port) as redis_path:
        a = ReplicaProcess(replica_id="ra", redis_url=redis_path.url_for_redis()).start()
        try:
            with ThreadedFaultProxy("127.0.0.1", a.port) as network:  # the client's way to the replica
                held = await clients(f"http://127.0.0.1:{network.port}", client_id="held")
                ws = held.config["workspace"]
                await held.register_service({"id": "s", "config": {"visibility": "public"}, "f": lambda: "ok"})

                redis_path.blackhole()
                await eventually(lambda: ready_is(a, 503), timeout=10, interval=0.05, what="readiness 503")
                with pytest.raises(websockets.InvalidStatus) as refused:
                    async with websockets.connect(f"ws://127.0.0.1:{a.port}/ws", open_timeout=5):
                        pass
                assert refused.value.response.status_code == 503
                assert b"backend unavailable" in refused.value.response.body

                dialled = network.stats.accepted
                network.reset_all()  # the held client's connection drops: it redials into the outage
                await eventually(
                    lambda: network.stats.accepted > dialled, timeout=10, interval=0.05, what="the client redialling"
                )
                redis_path.pass_through()
                await eventually(lambda: ready_is(a, 200), timeout=15, interval=0.1, what="readiness 200")
                checker = await clients(a.url, client_id="checker")

                async def answers() -> bool:
                    return await (await checker.get_service(f"{ws}/held:s")).f() == "ok"

                await eventually(answers, timeout=30, interval=0.25, what="the held client back with its service")
        finally:
            a.kill()


async def test_right_after_redis_restarts_empty_lookups_say_retry_never_not_found(replicas, clients, redis_server):
    """Valkey restarted without its data: until the replicas have written their clients'
    registrations back, a lookup must not answer "Service not found" or a list without the
    service (a caller would conclude it is gone); it waits briefly or says "please retry".
    Nor may a lookup or an HTTP call on B that needs the provider on A hang meanwhile."""
    a, b = replicas.start("ra"), replicas.start("rb")
    provider = await clients(a.url, client_id="prov")
    ws = provider.config["workspace"]
    await provider.register_service({"id": "s", "config": {"visibility": "public"}, "f": lambda: "ok"})
    token = await provider.generate_token()
    caller = await clients(b.url, client_id="caller", token=token)
    sid = f"{ws}/prov:s"
    assert sid in {s["id"] for s in await caller.list_services()}

    redis_server.restart()
    loop = asyncio.get_running_loop()
    wrong: list[str] = []
    retried = answered = 0
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http:
        deadline = loop.time() + 6  # three rounds of every replica's 2 s data-loss check
        while loop.time() < deadline:
            for what, lookup in (
                ("list_services", lambda: caller.list_services()),
                ("get_service", lambda: caller.get_service(sid, {"timeout": 5})),
            ):
                try:
                    found = await asyncio.wait_for(lookup(), scaled(8))
                except Exception as exc:  # noqa: BLE001 - sorted below: "retry" is a fine answer
                    if "retry" in str(exc):
                        retried += 1
                    else:
                        wrong.append(f"{what}: {type(exc).__name__}: {str(exc)[:200]}")
                    continue
                answered += 1
                if what == "list_services" and sid not in {s["id"] for s in found}:
                    wrong.append(f"list_services without {sid}: {[s['id'] for s in found]}")
            for path in (f"/{ws}/services/prov:s", f"/{ws}/services/prov:s/f"):  # an info, a call on A
                response = await http.get(f"{b.url}{path}", timeout=scaled(10))
                if response.status_code not in (200, 503) or (
                    response.status_code == 503 and "retry" not in response.text
                ):
                    wrong.append(f"HTTP {path}: {response.status_code}: {response.text[:200]}")
            await asyncio.sleep(0.05)
    assert not wrong, f"{len(wrong)} wrong answers ({answered} right, {retried} 'please retry'): {wrong[:5]}"
    assert answered > 0


async def test_connection_counters_are_rebuilt_after_redis_restarts_empty(redis_server, clients):
    """The per-workspace (and per-user) connection counts live in Redis: after it lost them,
    each replica writes back what its clients count, so the limits hold again."""
    a = ReplicaProcess(replica_id="ra", redis_url=redis_server.url, args=["--max-connections-per-workspace", "2"])
    b = ReplicaProcess(replica_id="rb", redis_url=redis_server.url, args=["--max-connections-per-workspace", "2"])
    a.start(), b.start()
    try:
        first = await clients(a.url, client_id="first")
        ws = first.config["workspace"]
        token = await first.generate_token()
        await clients(b.url, client_id="second", token=token)
        key = f"sb:conns:w:{ws}"

        def counted() -> int:
            with redis_server.client() as r:
                return sum(int(v) for v in r.hvals(key))

        assert counted() == 2
        redis_server.restart()
        await eventually(lambda: counted() == 2, timeout=10, interval=0.1, what="the workspace's count rebuilt")
        with pytest.raises(Exception, match="(?i)too many connections|limit"):
            await clients(a.url, client_id="third", token=token)
    finally:
        a.kill()
        b.kill()

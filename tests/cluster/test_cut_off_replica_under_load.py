"""A replica cut off from Redis, with the control plane busy beside its calls (issue 40's drill).

Two real replicas on one real Valkey. Replica A's clients call a provider on A
(hypha-rpc and the SDK, 20 calls a second each), a client of B calls it over the
direct link between the replicas, and beside them, every second, A gets a
lookup, a listing and an HTTP call of the provider's function, and every 3 s a
new connection (and B a new client that calls the provider on A once). Then A's Redis goes away: blackholed (no error, no close), or
killed and restarted empty. What must hold, while it is away and after:

* calls that need nothing from Redis stay as fast as before;
* every control-plane request answers within a second: a result, or a
  retryable refusal (a new connection: 503 before the upgrade);
* a second after Redis answers again, every request succeeds, within a second.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
import shortuuid
from hypha_rpc import connect_to_server

from switchboard.client import connect
from switchboard.testing import ThreadedFaultProxy, ValkeyServer
from switchboard.testing.cut_drill import Drill, Sample, median, slowest
from switchboard.testing.replica import ReplicaProcess
from switchboard.testing.wait import scaled

pytestmark = [pytest.mark.cluster, pytest.mark.alone, pytest.mark.timeout(150)]

CALLS = ("hypha-rpc call", "SDK call", "call from B")
ELSEWHERE = ("new client of B",)  # served by B, whose Redis answers: it succeeds, within a second
CONTROL = ("get_service", "list_services", "HTTP call", "new connection", "new SDK connection")
BEFORE, CUT_FOR, AFTER = 2.0, 7.0, 4.0  # seconds of each phase
FAST = 1.0  # a control-plane request answers within this, even while Redis is away
BACK_WITHIN = 1.0  # after Redis answers again, nothing fails once this has passed


async def drill_traffic(a: ReplicaProcess, b: ReplicaProcess, made: list[Any]) -> Drill:
    """Clients on A and B, and every series of the drill running."""
    provider = await connect_to_server({"server_url": a.url, "client_id": "prov", "method_timeout": 20})
    made.append(provider)
    ws = provider.config["workspace"]
    await provider.register_service({"id": "s", "config": {"visibility": "public"}, "f": lambda: "ok"})
    token = await provider.generate_token()
    sid = f"{ws}/prov:s"
    caller = await connect_to_server({"server_url": a.url, "client_id": "caller", "token": token, "method_timeout": 20})
    made.append(caller)
    sdk = await connect(a.url, token=token, client_id="sdk")
    made.append(sdk)
    elsewhere = await connect_to_server({"server_url": b.url, "client_id": "b", "token": token, "method_timeout": 20})
    made.append(elsewhere)
    svc, sdk_svc = await caller.get_service(sid), await sdk.get_service(sid)
    far = await elsewhere.get_service(sid)
    for _ in range(3):  # B learns the direct way to the provider
        await far.f()
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"})
    made.append(http)

    def answers_ok(call: Callable[[], Awaitable[object]]) -> Callable[[], Awaitable[None]]:
        async def checked() -> None:
            got = await call()
            assert got == "ok", f"answered {got!r}"

        return checked

    async def http_call() -> None:
        response = await http.get(f"{a.url}/{ws}/services/prov:s/f", timeout=30)
        assert response.status_code == 200, f"HTTP {response.status_code}: {response.text[:200]}"

    async def new_connection(url: str = a.url) -> None:
        fresh = await connect_to_server({"server_url": url, "token": token, "method_timeout": 20})
        try:
            assert await (await fresh.get_service(sid)).f() == "ok"
        finally:
            await fresh.disconnect()

    async def new_sdk_connection() -> None:
        async with await connect(a.url, token=token, client_id=shortuuid.uuid(), max_wait=0.3) as fresh:
            assert await (await fresh.get_service(sid)).f() == "ok"

    drill = Drill()
    drill.run("hypha-rpc call", answers_ok(svc.f), every=0.05)
    drill.run("SDK call", answers_ok(sdk_svc.f), every=0.05)
    drill.run("call from B", answers_ok(far.f), every=0.05)
    drill.run("get_service", lambda: caller.get_service(sid), every=1)
    drill.run("list_services", lambda: caller.list_services(), every=1)
    drill.run("HTTP call", http_call, every=1)
    drill.run("new connection", new_connection, every=3)
    drill.run("new SDK connection", new_sdk_connection, every=3)
    # a client new to B calls the provider on A: A has never sent it a frame (no route learned)
    drill.run("new client of B", lambda: new_connection(b.url), every=3)
    return drill


@contextlib.asynccontextmanager
async def closing(made: list[Any]) -> AsyncIterator[list[Any]]:
    try:
        yield made
    finally:
        for thing in reversed(made):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    thing.aclose() if isinstance(thing, httpx.AsyncClient) else thing.disconnect(), 5
                )


def retryable(sample: Sample) -> bool:
    """A refusal that tells the caller to come back (a hypha-rpc "please retry", a 503), or none."""
    return sample.error is None or any(word in sample.error.lower() for word in ("retry", "503", "unavailable"))


def judge(drill: Drill, *, b_cut_off_too: bool = False) -> list[str]:
    """What went against the rules of the module docstring (``b_cut_off_too``: B's clients are
    control-plane requests too, as a new client of B is refused while B's Redis is away)."""
    control, elsewhere = (CONTROL + ELSEWHERE, ()) if b_cut_off_too else (CONTROL, ELSEWHERE)
    wrong = []
    cut, healed = drill.marks["cut"], drill.marks["healed"]
    for name in CALLS:
        series = drill.series[name]
        before, during = series.between(0, cut), series.between(cut, healed)
        limit = min(0.05, max(2 * median(before), 0.01))
        if not median(during) < limit:
            wrong.append(
                f"{name}: median {median(during) * 1000:.1f} ms cut off, {median(before) * 1000:.1f} ms before"
            )
        if failed := [s for s in during if s.error]:
            wrong.append(f"{name}: {len(failed)} failed cut off, e.g. {failed[0].error}")
    for name in elsewhere:
        during = drill.series[name].between(cut, healed)
        if slowest(during) > scaled(FAST) or any(s.error for s in during):
            wrong.append(
                f"{name}: took up to {slowest(during):.2f} s cut off, failed: {[s.error for s in during if s.error]}"
            )
    for name in control:
        during = drill.series[name].between(cut, healed)
        if slowest(during) > scaled(FAST):
            wrong.append(f"{name}: took up to {slowest(during):.2f} s cut off")
        if odd := [s for s in during if not retryable(s)]:
            wrong.append(f"{name}: failed without saying retry: {odd[0].error}")
    for name in CONTROL:
        back = drill.series[name].between(healed + scaled(BACK_WITHIN), drill.now())
        if slowest(back) > scaled(FAST):
            wrong.append(f"{name}: took up to {slowest(back):.2f} s after Redis was back")
    for name in CALLS + ELSEWHERE + CONTROL:
        late = [s for s in drill.series[name].between(healed + scaled(BACK_WITHIN), drill.now()) if s.error]
        if late:
            wrong.append(
                f"{name}: {len(late)} failed after Redis was back, the first at +{late[0].at - healed:.1f} s: {late[0].error}"
            )
    return wrong


async def test_a_replica_blackholed_from_redis_keeps_calls_fast_and_control_requests_short_under_load(
    redis_server: ValkeyServer,
) -> None:
    b = ReplicaProcess(replica_id="rb", redis_url=redis_server.url).start()
    with ThreadedFaultProxy("127.0.0.1", redis_server.port) as proxy:
        a = ReplicaProcess(replica_id="ra", redis_url=proxy.url_for_redis()).start()
        try:
            async with closing([]) as made:
                drill = await drill_traffic(a, b, made)
                await drill.keep_on(BEFORE)
                proxy.blackhole()
                drill.mark("cut")
                await drill.keep_on(CUT_FOR)
                proxy.pass_through()
                drill.mark("healed")
                await drill.keep_on(AFTER)
                await drill.stop()
                print(drill.report([("before", "start", "cut"), ("cut", "cut", "healed"), ("after", "healed", "end")]))
                wrong = judge(drill)
                assert not wrong, "\n".join(wrong)
        finally:
            a.kill()
            b.kill()


async def test_a_replica_whose_redis_restarts_empty_keeps_calls_fast_and_is_back_at_once(
    redis_server: ValkeyServer,
) -> None:
    a = ReplicaProcess(replica_id="ra", redis_url=redis_server.url).start()
    b = ReplicaProcess(replica_id="rb", redis_url=redis_server.url).start()
    try:
        async with closing([]) as made:
            drill = await drill_traffic(a, b, made)
            await drill.keep_on(BEFORE)
            redis_server.kill()
            drill.mark("cut")
            await drill.keep_on(CUT_FOR)
            await asyncio.to_thread(redis_server.restart)  # empty, on the same port
            drill.mark("healed")
            await drill.keep_on(AFTER)
            await drill.stop()
            print(drill.report([("before", "start", "cut"), ("cut", "cut", "healed"), ("after", "healed", "end")]))
            wrong = judge(drill, b_cut_off_too=True)
            assert not wrong, "\n".join(wrong)
    finally:
        a.kill()
        b.kill()

"""A service name, not an instance: ``get_service(name, {"mode": "balance:<policy>"})`` with an
unmodified hypha-rpc client, on one in-process hub (issue 41).

The handle's every call goes to one live instance, chosen per call; an
instance that registers is used, one that leaves is not; a call whose
instance dies is re-sent if the service declares the function idempotent,
and fails at once with a clear error otherwise.
"""

from __future__ import annotations

import asyncio
import collections
import time

import pytest
from hypha_rpc import connect_to_server
from hypha_rpc.rpc import RemoteException

from switchboard.testing.hub import running, settings_for_tests
from switchboard.testing.wait import eventually

pytestmark = pytest.mark.timeout(60)


async def _instances(connect, n, *, extra=None, config=None):
    """``n`` clients of one workspace serving ``calc`` (``who`` answers the instance's number)."""
    owner = await connect(client_id="p0")
    token = await owner.generate_token()
    apis = [owner] + [await connect(client_id=f"p{i}", token=token) for i in range(1, n)]
    for i, api in enumerate(apis):
        service = {"id": "calc", "config": dict(config or {}), "who": (lambda i=i: i)}
        service.update((extra or {}).get(i, {}))
        await api.register_service(service)
    return apis, token


async def test_round_robin_sends_each_call_to_the_next_instance(connect):
    apis, token = await _instances(connect, 3)
    caller = await connect(client_id="caller", token=token)
    calc = await caller.get_service("calc", {"mode": "balance:round_robin"})
    answers = [await calc.who() for _ in range(30)]  # noqa
    assert collections.Counter(answers) == {0: 10, 1: 10, 2: 10}


async def test_an_unknown_balance_policy_is_refused_with_the_two_names(connect):
    apis, _ = await _instances(connect, 1)
    with pytest.raises(RemoteException, match="balance:round_robin' or 'balance:least_busy"):
        await apis[0].get_service("calc", {"mode": "balance:fastest"})


async def test_least_busy_sends_more_calls_to_a_fast_instance_than_to_a_slow_one(connect):
    async def slow():
        await asyncio.sleep(0.2)
        return 1

    apis, token = await _instances(connect, 2, extra={1: {"who": slow}})
    caller = await connect(client_id="caller", token=token)
    calc = await caller.get_service("calc", {"mode": "balance:least_busy"})
    answers: list[int] = []

    async def worker():
        for _ in range(10):
            answers.append(await calc.who())

    await asyncio.gather(*(worker() for _ in range(4)))
    counts = collections.Counter(answers)
    assert counts[0] > 3 * counts[1], counts


async def test_an_instance_that_registers_is_used_within_a_second(connect):
    apis, token = await _instances(connect, 2)
    caller = await connect(client_id="caller", token=token)
    calc = await caller.get_service("calc", {"mode": "balance:round_robin"})
    assert {await calc.who(), await calc.who()} == {0, 1}
    newcomer = await connect(client_id="p2", token=token)
    await newcomer.register_service({"id": "calc", "who": lambda: 2})
    registered = time.monotonic()
    await eventually(lambda: _answers(calc, 2), "the new instance answers a call", timeout=1.0, interval=0.02)
    assert time.monotonic() - registered < 1.0


async def _answers(calc, expected):
    return await calc.who() == expected


async def test_an_instance_that_leaves_gets_no_more_calls(connect):
    apis, token = await _instances(connect, 3)
    caller = await connect(client_id="caller", token=token)
    calc = await caller.get_service("calc", {"mode": "balance:round_robin"})
    await apis[2].unregister_service("calc")
    await eventually(lambda: _never(calc, 2), "calls only to the two left")


async def _never(calc, gone):
    return gone not in {await calc.who() for _ in range(6)}


def _hanging_and_answering(started):
    """Instance 0 answers at once; instance 1 never answers (until it leaves)."""

    async def hang():
        started.set()
        await asyncio.sleep(60)
        return 1

    return {0: {"get": lambda: 0, "add": lambda: 0}, 1: {"get": hang, "add": hang}}


async def test_an_idempotent_call_whose_instance_leaves_is_answered_by_another(connect):
    started = asyncio.Event()
    apis, token = await _instances(connect, 2, extra=_hanging_and_answering(started), config={"idempotent": ["get"]})
    caller = await connect(client_id="caller", token=token)
    calc = await caller.get_service("calc", {"mode": "balance:round_robin"})
    calls = [asyncio.ensure_future(calc.get()) for _ in range(2)]  # one to each instance
    await asyncio.wait_for(started.wait(), 5)
    await apis[1].disconnect()
    assert sorted(await asyncio.wait_for(asyncio.gather(*calls), 5)) == [0, 0]


async def test_a_call_not_declared_idempotent_fails_at_once_with_a_clear_error_when_its_instance_leaves(connect):
    started = asyncio.Event()
    apis, token = await _instances(connect, 2, extra=_hanging_and_answering(started), config={"idempotent": ["get"]})
    caller = await connect(client_id="caller", token=token)
    calc = await caller.get_service("calc", {"mode": "balance:round_robin"})
    calls = [asyncio.ensure_future(calc.add()) for _ in range(2)]
    await asyncio.wait_for(started.wait(), 5)
    left = time.monotonic()
    await apis[1].disconnect()
    results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 5)
    assert time.monotonic() - left < 1.0
    (error,) = [r for r in results if isinstance(r, Exception)]
    assert "not re-sent: the service does not declare add idempotent" in str(error)
    assert 0 in results


async def test_the_instance_sees_the_caller_as_for_a_direct_call(connect):
    seen = []

    def whoami(context=None):
        seen.append((context["from"], context["ws"]))
        return True

    owner = await connect(client_id="p0")
    token = await owner.generate_token()
    await owner.register_service({"id": "calc", "config": {"require_context": True}, "whoami": whoami})
    caller = await connect(client_id="caller", token=token)
    calc = await caller.get_service("calc", {"mode": "balance:round_robin"})
    await calc.whoami()
    assert seen == [(f"{caller.config.workspace}/caller", caller.config.workspace)]


async def test_list_services_shows_the_instances_not_the_handle(connect):
    apis, token = await _instances(connect, 3)
    caller = await connect(client_id="caller", token=token)
    await caller.get_service("calc", {"mode": "balance:round_robin"})
    ids = sorted(s["id"].rpartition("/")[2] for s in await caller.list_services({"service_id": "calc"}))
    assert ids == ["p0:calc", "p1:calc", "p2:calc"]


async def test_metrics_count_balanced_calls_per_instance(connect, server):
    import httpx

    apis, token = await _instances(connect, 2)
    caller = await connect(client_id="caller", token=token)
    calc = await caller.get_service("calc", {"mode": "balance:round_robin"})
    for _ in range(4):
        await calc.who()
    async with httpx.AsyncClient(base_url=server.url) as http:
        text = (await http.get("/metrics")).text
    assert "switchboard_balanced_calls_total" in text
    per = [line for line in text.splitlines() if line.startswith("switchboard_balanced_instance_calls_total")]
    assert len(per) == 2, per
    assert all(line.endswith(" 2.0") for line in per), per
    assert "switchboard_balanced_failovers_total" in text


async def test_a_call_and_an_answer_too_large_for_one_frame_go_through_the_handle(connect):
    big = {"size": lambda data: len(data), "big": lambda: b"y" * 3_000_000}
    apis, token = await _instances(connect, 2, extra={0: big, 1: big})
    caller = await connect(client_id="caller", token=token)
    calc = await caller.get_service("calc", {"mode": "balance:round_robin"})
    assert await asyncio.wait_for(calc.size(b"x" * 3_000_000), 10) == 3_000_000  # sent in pieces
    assert len(await asyncio.wait_for(calc.big(), 10)) == 3_000_000  # answered in pieces


async def test_a_caller_that_leaves_takes_its_handles_with_it(connect, server):
    apis, token = await _instances(connect, 2)
    caller = await connect(client_id="caller", token=token)
    calc = await caller.get_service("calc", {"mode": "balance:round_robin"})
    await calc.who()
    assert server.hub.router.balanced.pools()
    await caller.disconnect()
    await eventually(lambda: not server.hub.router.balanced.pools(), "the caller's handles forgotten", timeout=5)


async def test_a_call_the_hub_refuses_fails_with_the_reason_not_a_timeout():
    """The hub's refusal of a balanced call comes from the handle, the only sender its caller accepts."""
    async with running(settings_for_tests(max_messages_per_second=20, message_burst=40)) as srv:
        owner = await connect_to_server({"server_url": srv.url, "client_id": "p0"})
        token = await owner.generate_token()
        await owner.register_service({"id": "calc", "who": lambda: 0})
        flood = await connect_to_server(
            {"server_url": srv.url, "client_id": "flood", "token": token, "method_timeout": 10}
        )
        calc = await flood.get_service("calc", {"mode": "balance:round_robin"})
        started = time.monotonic()
        results = await asyncio.gather(*(calc.who() for _ in range(150)), return_exceptions=True)
        refused = [r for r in results if isinstance(r, Exception)]
        assert refused, "some calls must be refused"
        assert all("Rate limit exceeded" in str(r) for r in refused), refused[:2]
        assert time.monotonic() - started < 5
        for client in (flood, owner):
            await client.disconnect()

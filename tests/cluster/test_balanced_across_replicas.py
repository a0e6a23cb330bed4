"""Balanced handles across two real replicas on a real Valkey (issue 41).

Three instances of ``calc``: ``p0`` on replica A with the caller, ``p1`` and
``p2`` on replica B. The handle spreads calls evenly, favours the fast
instance under ``least_busy``, uses a newcomer within a second, keeps every
idempotent call through a SIGKILL of B, and fails the others with the clear
error instead of a timeout. A caller drained to another replica keeps its handle.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import re
import time

import httpx
import pytest
from redis import asyncio as aredis

from switchboard.testing.balancer import Balancer
from switchboard.testing.wait import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

CALLS = 3000
WORKERS = 20


def _service(i: int, *, delay: float = 0.0) -> dict:
    async def work():
        if delay:
            await asyncio.sleep(delay)
        return i

    return {
        "id": "calc",
        "config": {"idempotent": ["get"]},
        "who": lambda: i,
        "work": work,
        "get": work,  # declared idempotent
        "add": work,  # not
    }


# The caller's replica lets it send faster than the default 1000 messages/s: 3,000 calls in a
# second or two would be refused in part, as they would through a direct handle.
FAST_CALLER = ("--max-messages-per-second", "10000", "--message-burst", "20000")


async def _setup(replicas, clients, *, delays=(0.0, 0.0, 0.0), b_args=()):
    a, b = replicas.start("ra", *FAST_CALLER), replicas.start("rb", *b_args)
    p0 = await clients(a.url, client_id="p0")
    token = await p0.generate_token()
    p1 = await clients(b.url, client_id="p1", token=token)
    p2 = await clients(b.url, client_id="p2", token=token)
    for i, api in enumerate((p0, p1, p2)):
        await api.register_service(_service(i, delay=delays[i]))
    caller = await clients(a.url, client_id="caller", token=token)
    return a, b, caller, token


async def _spread(calc, fn, calls, workers):
    answers: list[int] = []

    async def worker(n):
        for _ in range(n):
            answers.append(await getattr(calc, fn)())

    await asyncio.gather(*(worker(calls // workers) for _ in range(workers)))
    return collections.Counter(answers)


async def test_round_robin_least_busy_and_a_newcomer_across_replicas(replicas, clients):
    a, b, caller, token = await _setup(replicas, clients, delays=(0.0, 0.0, 0.05))
    calc = await caller.get_service("calc", {"mode": "balance:round_robin"})
    started = time.monotonic()
    counts = await _spread(calc, "who", CALLS, WORKERS)
    took = time.monotonic() - started
    assert sum(counts.values()) == CALLS
    for i in range(3):
        assert abs(counts[i] - CALLS / 3) <= 0.1 * CALLS / 3, counts
    print(f"round robin: {dict(counts)} in {took:.2f}s")

    busy = await caller.get_service("calc", {"mode": "balance:least_busy"})
    counts = await _spread(busy, "work", 300, 6)
    assert counts[2] < min(counts[0], counts[1]), counts  # p2 takes 50 ms a call
    print(f"least busy: {dict(counts)}")

    newcomer = await clients(b.url, client_id="p3", token=token)
    await newcomer.register_service(_service(3))
    registered = time.monotonic()

    async def used() -> bool:
        return 3 in {await calc.who() for _ in range(4)}

    await eventually(used, "the new instance gets calls", timeout=1.0, interval=0.02)
    print(f"newcomer used after {time.monotonic() - registered:.2f}s")


async def test_a_replica_sigkilled_under_200_calls_a_second(replicas, clients):
    a, b, caller, token = await _setup(replicas, clients, delays=(0.05, 0.05, 0.05))  # some always in flight
    calc = await caller.get_service("calc", {"mode": "balance:round_robin"})
    ok: list[float] = []
    failed: list[tuple[float, str]] = []
    refused: list[tuple[float, str]] = []
    tasks: set[asyncio.Task] = set()

    async def one(fn):
        try:
            await getattr(calc, fn)()
            ok.append(time.monotonic())
        except Exception as exc:
            (failed if fn == "get" else refused).append((time.monotonic(), str(exc)))

    async def traffic(seconds):
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            task = asyncio.ensure_future(one("get" if n % 2 == 0 else "add"))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            n += 1
            await asyncio.sleep(0.005)  # 200 calls/s
        return n

    sent = asyncio.ensure_future(traffic(4.0))
    await eventually(lambda: len(ok) >= 100, "calls flowing", timeout=5)
    killed = time.monotonic()
    b.kill()
    total = await sent
    await asyncio.wait_for(asyncio.gather(*list(tasks), return_exceptions=True), 30)
    assert not failed, failed[:3]  # no idempotent call failed
    unclear = [(round(t - killed, 2), why) for t, why in refused if "not re-sent" not in why]
    assert not unclear, unclear[:3]  # every non-idempotent one that failed said why
    assert refused  # those running on B when it died
    slowest = max(t - killed for t, _ in refused)
    assert slowest < 1.0, f"a non-idempotent call failed {slowest:.2f}s after the kill"
    print(f"{total} calls, {len(ok)} answered, {len(refused)} non-idempotent refused, slowest {slowest:.2f}s after")


async def test_a_drained_replica_costs_no_call(replicas, clients):
    a, b, caller, token = await _setup(replicas, clients, delays=(0.02, 0.02, 0.02), b_args=("--transit-grace", "1"))
    calc = await caller.get_service("calc", {"mode": "balance:least_busy"})
    failed: list[str] = []
    answered = 0
    stop = asyncio.Event()

    async def worker(fn):
        nonlocal answered
        while not stop.is_set():
            try:
                await getattr(calc, fn)()
                answered += 1
            except Exception as exc:
                failed.append(f"{fn}: {exc}")

    workers = [asyncio.ensure_future(worker(fn)) for fn in ("get", "add") * 4]
    await eventually(lambda: answered >= 50, "calls flowing", timeout=5)
    code = await asyncio.to_thread(b.terminate, 15.0)
    before = answered
    await eventually(lambda: answered >= before + 100, "calls after the drain", timeout=10)
    stop.set()
    await asyncio.wait_for(asyncio.gather(*workers), 20)
    assert code == 0
    assert not failed, failed[:3]
    print(f"drain: {answered} calls, none failed")


async def test_a_handle_goes_on_when_its_caller_is_drained_to_another_replica(replicas, clients):
    """The caller (through a balancer) takes its handle on A; A drains; the caller comes back on B,
    which never saw the lookup: B binds the handle on its first call there, as the caller's own
    lookup, and every call goes on."""
    a, b = replicas.start("ra", *FAST_CALLER), replicas.start("rb", *FAST_CALLER)
    async with Balancer([a.port, b.port]) as front:
        front.take_out(b.port)  # the caller lands on A
        p1 = await clients(b.url, client_id="p1")
        token = await p1.generate_token()
        p2 = await clients(b.url, client_id="p2", token=token)
        for i, api in ((1, p1), (2, p2)):
            await api.register_service(_service(i))
        caller = await clients(front.url, client_id="caller", token=token)
        calc = await caller.get_service("calc", {"mode": "balance:round_robin"})
        assert {await calc.who() for _ in range(4)} == {1, 2}
        front.put_back(b.port)
        front.take_out(a.port)  # as a terminating pod leaves its Service: the caller comes back on B
        failed: list[str] = []
        answered = 0
        tasks: set[asyncio.Task] = set()

        async def one() -> None:
            nonlocal answered
            try:
                await calc.add()  # not idempotent: none may be lost or run twice
                answered += 1
            except Exception as exc:
                failed.append(str(exc))

        async def traffic(stop: asyncio.Event) -> None:
            # 50 calls/s, as a steady caller sends them: hypha-rpc itself fails a call sent while
            # it has no connection (the drain sends it away in a pause, and it is back in ms)
            for _ in range(2000):
                if stop.is_set():
                    return
                task = asyncio.ensure_future(one())
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.02)

        stop = asyncio.Event()
        sending = asyncio.ensure_future(traffic(stop))
        await eventually(lambda: answered >= 25, "calls flowing", timeout=5)
        code = await asyncio.to_thread(a.terminate, 15.0)
        before = answered
        await eventually(lambda: answered >= before + 100, "calls after the caller moved", timeout=10)
        stop.set()
        await sending
        await asyncio.wait_for(asyncio.gather(*list(tasks), return_exceptions=True), 25)
    assert code == 0
    assert not failed, failed[:3]
    print(f"moved: {answered} calls, none failed")


async def test_a_call_that_reaches_its_instance_just_as_it_left_goes_to_another_instance(replicas, clients):
    """Instance p1 on B disconnects while calls from A stream to it: a call B takes in as p1 leaves
    never ran, so it goes to p0 whatever its idempotency (``add`` is not idempotent); only a call
    p1 had taken may fail, with the clear error, and none says its target is not connected."""
    a, b = replicas.start("ra", *FAST_CALLER), replicas.start("rb", *FAST_CALLER)
    p0 = await clients(a.url, client_id="p0")
    token = await p0.generate_token()
    p1 = await clients(b.url, client_id="p1", token=token)
    for i, api in ((0, p0), (1, p1)):
        await api.register_service(_service(i))
    caller = await clients(a.url, client_id="caller", token=token)
    calc = await caller.get_service("calc", {"mode": "balance:round_robin"})
    answered: list[int] = []
    failed: list[str] = []
    tasks: set[asyncio.Task] = set()

    async def one() -> None:
        try:
            answered.append(await calc.add())
        except Exception as exc:
            failed.append(str(exc))

    async def traffic(stop: asyncio.Event) -> None:
        for _ in range(5000):  # 1,000 calls/s: some are on their way to B as p1 leaves
            if stop.is_set():
                return
            for _ in range(5):
                task = asyncio.ensure_future(one())
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.005)

    stop = asyncio.Event()
    sending = asyncio.ensure_future(traffic(stop))
    await eventually(lambda: answered.count(1) >= 200, "calls reaching p1", timeout=10)
    await p1.disconnect()
    left = len(answered)
    await eventually(lambda: len(answered) >= left + 500, "calls after p1 left", timeout=10)
    stop.set()
    await sending
    await asyncio.wait_for(asyncio.gather(*list(tasks), return_exceptions=True), 25)
    unclear = [why for why in failed if "not re-sent: the service does not declare add idempotent" not in why]
    assert not unclear, unclear[:3]
    print(f"instance left: {len(answered)} answered, {len(failed)} refused as having run on p1")


async def _counter(replica, name: str) -> float:
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{replica.url}/metrics", timeout=5)).text
    found = re.search(rf'^{name}(?:_total)?{{replica="[^"]+"}} ([0-9.e+]+)$', text, re.M)
    assert found, f"{name} missing from /metrics"
    return float(found.group(1))


async def test_a_balanced_call_to_a_replica_of_this_release_takes_the_link_not_redis(replicas, clients, redis_server):
    """Both replicas announce the wire version they read: once the caller's replica has read B's
    presence record and learned the route, a balanced call crossing to B's instance goes over the
    link (its frames-sent counter moves) and never through Redis (nothing published on its channel)."""
    a, b = replicas.start("ra"), replicas.start("rb")
    p1 = await clients(b.url, client_id="p1")
    await p1.register_service(_service(1))
    caller = await clients(a.url, client_id="caller", token=await p1.generate_token())
    calc = await caller.get_service("calc", {"mode": "balance:round_robin"})
    channel = f"sb:client:{p1.config['workspace']}/p1"
    redis = aredis.Redis.from_url(redis_server.url)
    pubsub = redis.pubsub()
    await pubsub.subscribe(channel)
    published = 0

    async def drain() -> int:
        nonlocal published
        while (message := await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.05)) is not None:
            published += message["channel"] == channel.encode()
        return published

    async def over_the_link() -> bool:
        before, sent = await drain(), await _counter(a, "switchboard_link_frames_sent")
        assert await calc.who() == 1
        return await drain() == before and await _counter(a, "switchboard_link_frames_sent") > sent

    try:
        await eventually(over_the_link, timeout=15, what="a balanced call over the link")
        before, sent = await drain(), await _counter(a, "switchboard_link_frames_sent")
        for _ in range(20):
            assert await calc.who() == 1
        assert await drain() == before  # not one through Redis
        assert await _counter(a, "switchboard_link_frames_sent") >= sent + 20
    finally:
        await pubsub.aclose()
        await redis.aclose()

"""RedisBus: every resilience mechanism against a real Valkey, plus loop logic on a FakeClock.

Each mechanism test switches the *other* convergence paths off (``None``
intervals) so that it passes only because of the one mechanism it names.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from support.listen import on
from switchboard.backends.redis import (
    CircuitBreaker,
    RedisBus,
    backoff_delay,
    make_client,
    pubsub_connection_factory,
)
from switchboard.backends.redis.bus import subscriptions
from switchboard.clock import SystemClock
from switchboard.errors import BackendError
from switchboard.testing import FakeClock, FaultProxy, ValkeyServer
from switchboard.testing.wait import eventually


async def delivered(bus: RedisBus, publisher: Any, channel: str, got: list[bytes]) -> bool:
    """Publish a unique payload and wait (bounded) for it to reach the handler."""
    payload = uuid.uuid4().bytes
    if await publisher.publish(channel, payload) != 1:
        return False
    try:
        await eventually(lambda: payload in got, f"delivery on {channel}", timeout=1.0)
    except AssertionError:
        return False
    return True


@pytest.fixture
async def publisher(valkey: ValkeyServer) -> AsyncIterator[Any]:
    client = make_client(valkey.url)
    yield client
    await client.aclose()


@pytest.fixture
async def make_bus() -> AsyncIterator[Callable[..., RedisBus]]:
    """Buses with fast backoff and short timeouts, all closed after the test."""
    buses: list[RedisBus] = []

    def make(source: Any, **kwargs: Any) -> RedisBus:
        kwargs.setdefault("clock", SystemClock())
        kwargs.setdefault("replica_id", f"r-{uuid.uuid4().hex[:6]}")
        kwargs.setdefault("backoff_initial", 0.02)
        kwargs.setdefault("backoff_max", 0.2)
        kwargs.setdefault("op_timeout", 0.5)
        kwargs.setdefault("subscribe_timeout", 1.0)
        bus = RedisBus(source, **kwargs)
        buses.append(bus)
        return bus

    yield make
    for bus in buses:
        await bus.close()


@pytest.fixture
async def proxy(valkey: ValkeyServer) -> AsyncIterator[FaultProxy]:
    async with FaultProxy("127.0.0.1", valkey.port, connect_timeout=2.0) as p:
        yield p


def via_proxy(proxy: FaultProxy, publisher: Any) -> dict[str, Any]:
    """Pub/sub through the proxy, publishing (and probing) directly."""
    return {
        "source": pubsub_connection_factory(proxy.url_for_redis(), timeout=0.5),
        "publisher": publisher,
    }


# -- basics ----------------------------------------------------------------------


async def test_publish_to_nobody_returns_zero_and_is_counted(make_bus, valkey) -> None:
    bus = make_bus(valkey.url)
    assert await bus.start()

    assert await bus.publish(f"nobody-{uuid.uuid4().hex}", b"x") == 0
    assert bus.stats.publishes_to_nobody == 1

    got: list[bytes] = []
    await on(bus).subscribe("somebody", got.append)
    assert await bus.publish("somebody", b"y") == 1
    assert bus.stats.publishes_to_nobody == 1


async def test_health_lifecycle(make_bus, valkey) -> None:
    bus = make_bus(valkey.url)
    assert bus.health == (False, "not started")

    assert await bus.start() is True
    assert bus.health == (True, "ok")

    await bus.close()
    assert bus.health == (False, "closed")
    with pytest.raises(BackendError):
        await on(bus).subscribe("after-close", lambda data: None)


async def test_a_failing_handler_never_kills_the_reader(make_bus, valkey, publisher, caplog):
    bus = make_bus(valkey.url, replica_id="rep-handler")
    await bus.start()
    got: list[bytes] = []

    def handler(data: bytes) -> None:
        if data == b"boom":
            raise ValueError("handler bug")
        got.append(data)

    await on(bus).subscribe("fragile", handler)
    with caplog.at_level(logging.ERROR, logger="switchboard.backends.redis"):
        assert await publisher.publish("fragile", b"boom") == 1
        assert await delivered(bus, publisher, "fragile", got)

    [record] = [r for r in caplog.records if "handler for fragile failed" in r.getMessage()]
    assert record.replica == "rep-handler"  # type: ignore[attr-defined]


async def test_close_cancels_every_task_and_cancellation_propagates(make_bus, proxy, publisher):
    bus = make_bus(**via_proxy(proxy, publisher), subscribe_timeout=30.0, probe_idle=None)
    await bus.start()
    tasks = list(bus._tasks)
    proxy.blackhole()
    waiter = asyncio.create_task(on(bus).subscribe("never-acked", lambda data: None))
    await eventually(lambda: bus.acks.pending(b"subscribe", "never-acked"), "waiting for the ack")

    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter  # the bounded ack wait does not swallow cancellation
    await bus.close()

    assert all(task.done() for task in tasks)
    assert bus._tasks == []
    proxy.pass_through()


# -- convergence path 1: a later subscribe retries an unconfirmed channel ----------


async def test_repeated_subscribe_retries_an_unconfirmed_channel(make_bus, proxy, publisher):
    bus = make_bus(
        **via_proxy(proxy, publisher),
        reconcile_interval=None,
        probe_idle=None,
        subscribe_timeout=0.2,
    )
    assert await bus.start()
    got: list[bytes] = []
    proxy.blackhole()
    await on(bus).subscribe("retry-me", got.append)  # SUBSCRIBE lost in the blackhole
    assert not bus.is_confirmed("retry-me")
    proxy.pass_through()

    await on(bus).subscribe("retry-me", got.append)  # the guard tests CONFIRMED, so this resends

    assert bus.is_confirmed("retry-me")
    assert await delivered(bus, publisher, "retry-me", got)
    assert bus.stats.reconnects == 0


# -- convergence path 3: the reconciler ------------------------------------------------


async def test_dropped_subscribe_is_reconciled_without_a_second_call(make_bus, proxy, publisher):
    bus = make_bus(
        **via_proxy(proxy, publisher),
        reconcile_interval=0.2,
        probe_idle=None,
        subscribe_timeout=0.2,
    )
    assert await bus.start()
    got: list[bytes] = []
    proxy.blackhole()
    await on(bus).subscribe("dropped", got.append)  # called exactly once in this test
    assert not bus.is_confirmed("dropped")
    assert await publisher.publish("dropped", b"lost") == 0  # Redis never saw it
    proxy.pass_through()

    await eventually(lambda: bus.is_confirmed("dropped"), "reconciled subscription")

    assert await delivered(bus, publisher, "dropped", got)
    assert bus.stats.repairs >= 1
    assert bus.stats.reconnects == 0  # repaired on the same connection, not by reconnecting


# -- convergence path 2: re-wiring on reconnect -----------------------------------------


async def test_reconnect_rewires_every_desired_channel(make_bus, valkey, publisher):
    bus = make_bus(valkey.url, reconcile_interval=None, probe_idle=None)
    assert await bus.start()
    got: dict[str, list[bytes]] = {}
    names = [f"rewire-{i}" for i in range(50)]
    for name in names:
        await on(bus).subscribe(name, got.setdefault(name, []).append)
    desired = set(bus.subs.desired)

    assert valkey.kill_clients(type_="pubsub") >= 1

    await eventually(lambda: bus.stats.reconnects == 1, "reconnect")
    await eventually(lambda: bus.subs.confirmed == desired, "every channel re-wired")
    for name in names:
        assert await delivered(bus, publisher, name, got[name]), name
    assert bus.health[0]


class FlakySubscribes:
    """Wraps pub/sub connections; fails the next ``fail`` SUBSCRIBE sends."""

    def __init__(self, url: str) -> None:
        self._make = pubsub_connection_factory(url, timeout=0.5)
        self.fail = 0

    def __call__(self) -> Any:
        return _Flaky(self._make(), self)


class _Flaky:
    def __init__(self, conn: Any, owner: FlakySubscribes) -> None:
        self._conn, self._owner = conn, owner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    async def send_command(self, *args: Any, **kwargs: Any) -> None:
        if args[0] == "SUBSCRIBE" and self._owner.fail > 0:
            self._owner.fail -= 1
            raise RedisConnectionError("injected: SUBSCRIBE lost mid re-wire")
        await self._conn.send_command(*args, **kwargs)


async def test_failed_rewire_discards_nothing(make_bus, valkey, publisher):
    flaky = FlakySubscribes(valkey.url)
    bus = make_bus(flaky, publisher=publisher, reconcile_interval=None, probe_idle=None)
    assert await bus.start()
    got: dict[str, list[bytes]] = {}
    for i in range(20):
        await on(bus).subscribe(f"keep-{i}", got.setdefault(f"keep-{i}", []).append)
    desired = set(bus.subs.desired)

    flaky.fail = 1  # the first re-wire after the kill fails
    valkey.kill_clients(type_="pubsub")

    await eventually(lambda: bus.stats.reconnects == 2, "second reconnect after failed re-wire")
    await eventually(lambda: bus.subs.confirmed == desired, "every channel re-wired")
    assert bus.subs.desired == desired
    for name, received in got.items():
        assert await delivered(bus, publisher, name, received), name


async def test_stale_open_breaker_does_not_block_rewiring(make_bus, valkey, publisher):
    breaker = CircuitBreaker(SystemClock(), threshold=1, cooldown=3600.0)
    bus = make_bus(valkey.url, reconcile_interval=None, probe_idle=None, breaker=breaker)
    assert await bus.start()
    got: list[bytes] = []
    await on(bus).subscribe("before-trip", got.append)
    breaker.trip()  # opened against the old connection, an hour of cooldown left
    await on(bus).subscribe("while-open", got.append)
    assert not bus.is_confirmed("while-open")  # refused by the open breaker

    valkey.kill_clients(type_="pubsub")

    await eventually(lambda: bus.stats.reconnects == 1, "reconnect")
    await eventually(
        lambda: bus.is_confirmed("before-trip") and bus.is_confirmed("while-open"),
        "re-wiring on the fresh connection",
    )
    assert breaker.state == "closed"
    assert await delivered(bus, publisher, "while-open", got)


# -- half-open pub/sub: the probe -----------------------------------------------------------


async def test_half_open_pubsub_is_detected_by_the_probe_and_healed(make_bus, proxy, publisher):
    bus = make_bus(
        **via_proxy(proxy, publisher),
        reconcile_interval=None,
        probe_idle=0.2,
        probe_timeout=0.3,
    )
    assert await bus.start()
    got: list[bytes] = []
    await on(bus).subscribe("half-open", got.append)
    assert await delivered(bus, publisher, "half-open", got)

    proxy.blackhole()  # no error, no EOF: the socket just goes quiet

    await eventually(lambda: bus.stats.probe_failures >= 1, "probe failure")
    ok, reason = bus.health  # read at once: the reconnect through the black hole soon fails for its own reason
    assert not ok
    assert "probe" in reason, "the readiness check says the probe failed while the old socket is taken down"
    proxy.pass_through()

    await eventually(lambda: bus.health[0] and bus.is_confirmed("half-open"), "healed bus")
    assert bus.stats.reconnects >= 1
    assert await delivered(bus, publisher, "half-open", got)


async def test_the_readiness_reason_names_the_failed_probe_while_the_dropped_socket_is_taken_down(
    make_bus, proxy, publisher
):
    """Every loop turn from the probe's failure until the reconnect's own failure, the readiness check
    says the probe failed: it said a bare "pub/sub connection lost" while the old reader was cancelled
    (the reason the test above read once came out so under asyncio's debug mode on a loaded machine)."""
    bus = make_bus(**via_proxy(proxy, publisher), reconcile_interval=None, probe_idle=0.2, probe_timeout=0.3)
    assert await bus.start()
    proxy.blackhole()
    await eventually(lambda: not bus.health[0], "the probe failing")
    lost: list[str] = []
    for _ in range(100_000):  # a loop turn each, until the reconnect through the black hole fails
        reason = bus.health[1]
        if reason.startswith("pub/sub connect failed"):
            break
        if reason.startswith("pub/sub connection lost"):
            lost.append(reason)
        await asyncio.sleep(0)
    assert lost, "the dropped connection was seen down before the reconnect"
    assert all("probe" in reason for reason in lost), sorted(set(lost))
    proxy.pass_through()


async def test_a_late_probe_keeps_a_connection_that_delivers_meanwhile(make_bus, valkey, proxy, publisher):
    """A replica busy with a storm of clients queues the probe's publish behind theirs; its pub/sub
    connection, delivering all along, is not dropped for that (re-wiring every channel and turning
    new clients away, under the very load that made the probe late)."""
    slow = make_client(proxy.url_for_redis())  # the probe's publish goes this way, and gets no answer
    bus = make_bus(
        pubsub_connection_factory(valkey.url, timeout=0.5),
        publisher=slow,
        reconcile_interval=None,
        probe_idle=None,
        probe_timeout=0.3,
    )
    try:
        assert await bus.start()
        got: list[bytes] = []
        await on(bus).subscribe("busy", got.append)
        assert await delivered(bus, publisher, "busy", got)
        proxy.blackhole()

        async def traffic() -> None:
            for _ in range(40):  # bounded: 2 s
                await publisher.publish("busy", b"x")
                await asyncio.sleep(0.05)

        flowing = asyncio.ensure_future(traffic())
        try:
            assert await bus.probe_once()
        finally:
            flowing.cancel()
        assert bus.health[0], bus.health
        assert bus.stats.reconnects == 0
        assert await delivered(bus, publisher, "busy", got)
    finally:
        proxy.pass_through()
        await slow.aclose()


class SwallowsOneCancel:
    """Wraps pub/sub connections; the first read cancelled on each loses that cancel and reads on,
    as redis-py may (see :mod:`switchboard.tasks`)."""

    def __init__(self, url: str) -> None:
        self._make = pubsub_connection_factory(url, timeout=0.5)
        self.swallowed = 0

    def __call__(self) -> Any:
        return _Stubborn(self._make(), self)


class _Stubborn:
    def __init__(self, conn: Any, owner: SwallowsOneCancel) -> None:
        self._conn, self._owner, self._lost_one = conn, owner, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await self._conn.read_response(*args, **kwargs)
        except asyncio.CancelledError:
            if self._lost_one:
                raise
            self._lost_one = True
            self._owner.swallowed += 1
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
        return await self._conn.read_response(*args, **kwargs)  # reads on, once: the next cancel stands


async def test_a_dropped_connection_is_replaced_though_its_reader_lost_the_cancel(make_bus, proxy, publisher):
    """The supervisor stops the old reader for sure before it reconnects: cancelled once and
    awaited, a reader that lost the cancel would sit on the silent socket, and the bus would
    never come back (it has nothing else to wake it)."""
    stubborn = SwallowsOneCancel(proxy.url_for_redis())
    bus = make_bus(stubborn, publisher=publisher, reconcile_interval=None, probe_idle=0.2, probe_timeout=0.3)
    assert await bus.start()
    got: list[bytes] = []
    await on(bus).subscribe("stubborn", got.append)
    assert await delivered(bus, publisher, "stubborn", got)

    proxy.blackhole()
    await eventually(lambda: bus.stats.probe_failures >= 1, "probe failure")
    proxy.pass_through()

    await eventually(lambda: bus.health[0] and bus.is_confirmed("stubborn"), "healed bus", timeout=5.0)
    assert stubborn.swallowed >= 1
    assert await delivered(bus, publisher, "stubborn", got)


# -- Redis restarted empty ----------------------------------------------------------------------


async def test_redis_restarted_empty_delivery_resumes_without_manual_step(make_bus) -> None:
    with ValkeyServer() as own:
        bus = make_bus(own.url, reconcile_interval=None, probe_idle=None)
        publisher = make_client(own.url)
        try:
            assert await bus.start()
            got: list[bytes] = []
            await on(bus).subscribe("survivor", got.append)
            assert await delivered(bus, publisher, "survivor", got)

            await asyncio.to_thread(own.restart)
            with own.client() as admin:
                assert admin.dbsize() == 0

            # a BackendError while Redis is away counts as "not yet"
            await eventually(lambda: delivered(bus, publisher, "survivor", got), "delivery to resume")
            assert bus.stats.reconnects >= 1
        finally:
            await bus.close()
            await publisher.aclose()


# -- loop logic on a FakeClock, against an in-memory pub/sub ----------------------------------


class FakePubSub:
    """Just enough Redis pub/sub for the bus: acks, messages, lost commands, half-open sockets."""

    def __init__(self) -> None:
        self.channels: dict[str, set[FakeConn]] = {}
        self.sent: list[tuple[Any, ...]] = []
        self.drop_subscribes = 0
        self.refuse_connects = 0
        self.connections: list[FakeConn] = []

    def __call__(self) -> FakeConn:
        return FakeConn(self)

    async def publish(self, channel: str, data: bytes) -> int:
        subscribers = list(self.channels.get(channel, ()))
        for conn in subscribers:
            conn.push([b"message", channel.encode(), data])
        return len(subscribers)

    async def execute_command(self, name: str, channel: str, data: bytes) -> int:
        """A lone publish, as the bus sends it when nothing else is queued."""
        assert name == "PUBLISH", name
        return await self.publish(channel, data)

    def pipeline(self, transaction: bool = False) -> FakePipeline:
        return FakePipeline(self)

    async def aclose(self) -> None:
        pass


class FakePipeline:
    """Publishes queued and sent together, as through redis-py's pipeline (the bus batches them)."""

    def __init__(self, server: FakePubSub) -> None:
        self.server = server
        self.queued: list[tuple[str, bytes]] = []

    async def __aenter__(self) -> FakePipeline:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    def execute_command(self, name: str, channel: str, data: bytes) -> None:
        assert name == "PUBLISH", name
        self.queued.append((channel, data))

    async def execute(self, raise_on_error: bool = True) -> list[int]:
        return [await self.server.publish(channel, data) for channel, data in self.queued]


class FakeConn:
    def __init__(self, server: FakePubSub) -> None:
        self.server = server
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.is_connected = False
        self.half_open = False

    async def connect(self) -> None:
        if self.server.refuse_connects > 0:
            self.server.refuse_connects -= 1
            raise RedisConnectionError("refused")
        self.is_connected = True
        self.server.connections.append(self)

    def push(self, reply: Any) -> None:
        if not self.half_open:
            self.queue.put_nowait(reply)

    async def send_command(self, *args: Any, **kwargs: Any) -> None:
        self.server.sent.append(args)
        if self.half_open:
            return
        command, *names = args
        for name in names:
            if command == "SUBSCRIBE":
                if self.server.drop_subscribes > 0:
                    self.server.drop_subscribes -= 1
                    continue
                self.server.channels.setdefault(name, set()).add(self)
            else:
                self.server.channels.get(name, set()).discard(self)
            self.push([command.lower().encode(), name.encode(), 1])

    async def read_response(self, **kwargs: Any) -> Any:
        reply = await self.queue.get()
        if isinstance(reply, BaseException):
            raise reply
        return reply

    async def disconnect(self, **kwargs: Any) -> None:
        self.is_connected = False
        for conns in self.server.channels.values():
            conns.discard(self)
        self.queue.put_nowait(RedisConnectionError("closed"))


def fake_bus(server: FakePubSub, clock: FakeClock, **kwargs: Any) -> RedisBus:
    kwargs.setdefault("reconcile_interval", None)
    kwargs.setdefault("probe_idle", None)
    kwargs.setdefault("subscribe_timeout", 0)
    return RedisBus(server, publisher=server, clock=clock, replica_id="fake", **kwargs)


def test_backoff_is_capped_exponential() -> None:
    assert [backoff_delay(n, 0.1, 2.0) for n in range(7)] == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    assert backoff_delay(10_000, 0.1, 2.0) == 2.0


def test_breaker_opens_half_opens_and_closes_on_the_clock() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(clock, threshold=2, cooldown=10.0)
    breaker.record_failure()
    assert breaker.allow()
    breaker.record_failure()
    assert breaker.state == "open"
    assert not breaker.allow()

    clock.advance(10.0)
    assert breaker.state == "half-open"
    assert breaker.allow()
    breaker.record_failure()  # one failure while half-open re-opens it
    assert breaker.state == "open"

    clock.advance(10.0)
    breaker.record_success()
    assert breaker.state == "closed"
    assert breaker.failures == 0


async def test_reconnect_backs_off_capped_on_the_clock() -> None:
    server, clock = FakePubSub(), FakeClock()
    server.refuse_connects = 7
    bus = fake_bus(server, clock, backoff_initial=0.1, backoff_max=2.0)
    try:
        assert await bus.start(wait=2.0)
        assert clock.sleeps == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
        assert bus.stats.reconnects == 0
    finally:
        await bus.close()


async def test_reconciler_repairs_a_dropped_subscribe_on_the_clock() -> None:
    server, clock = FakePubSub(), FakeClock()
    bus = fake_bus(server, clock, reconcile_interval=5.0)
    try:
        assert await bus.start(wait=2.0)
        server.drop_subscribes = 1
        await on(bus).subscribe("a", lambda data: None)  # the only call
        assert not bus.is_confirmed("a")

        await eventually(lambda: bus.is_confirmed("a"), "reconciled subscription")

        assert sum(1 for cmd in server.sent if cmd == ("SUBSCRIBE", "a")) >= 2
        assert clock.monotonic() >= 5.0
        assert 5.0 in clock.sleeps
        assert bus.stats.repairs >= 1
        assert bus.stats.reconnects == 0
    finally:
        await bus.close()


async def test_probe_replaces_a_silent_connection_on_the_clock() -> None:
    server, clock = FakePubSub(), FakeClock()
    bus = fake_bus(server, clock, probe_idle=3.0, probe_timeout=0.05)
    try:
        assert await bus.start(wait=2.0)
        await on(bus).subscribe("a", lambda data: None)
        server.connections[0].half_open = True  # no error, no messages

        await eventually(lambda: bus.stats.probe_failures == 1, "probe failure")
        await eventually(lambda: bus.stats.reconnects == 1 and bus.health[0], "new connection")

        assert bus.is_confirmed("a")
        assert len(server.connections) == 2
        assert 1.0 in clock.sleeps  # the probe loop paces itself on the injected clock
    finally:
        await bus.close()


async def test_unsubscribe_right_after_an_unacked_subscribe_leaves_nothing_wired(make_bus, valkey, publisher):
    bus = make_bus(valkey.url, subscribe_timeout=0, reconcile_interval=None, probe_idle=None)
    assert await bus.start()

    await on(bus).subscribe("in-flight", lambda data: None)  # sent, ack not awaited
    await bus.unsubscribe("in-flight")

    assert await publisher.publish("in-flight", b"x") == 0
    assert bus.subs.desired == {bus.probe_channel}


async def test_a_subscribe_right_after_an_unsubscribe_of_the_same_channel_leaves_it_wired(make_bus, valkey, publisher):
    """Unsubscribes wait for the loop's next turn, to go out together; a subscribe asked meanwhile
    sends them first, so Redis still sees the two in the order they were asked."""
    bus = make_bus(valkey.url, reconcile_interval=None, probe_idle=None)
    assert await bus.start()
    got: list[bytes] = []
    await on(bus).subscribe("again", got.append)

    leaving = asyncio.create_task(bus.unsubscribe("again"))
    await asyncio.sleep(0)  # one turn: the unsubscribe is queued, not yet written
    assert len(bus.unsubscribes) == 1
    await on(bus).subscribe("again", got.append)
    await leaving

    assert bus.is_confirmed("again")
    assert await delivered(bus, publisher, "again", got)


async def test_unsubscribes_asked_together_go_out_as_one_command(make_bus, valkey, publisher):
    bus = make_bus(valkey.url, reconcile_interval=None, probe_idle=None)
    assert await bus.start()
    channels = [f"crowd-{n}" for n in range(250)]  # more than one SUBSCRIBE batch
    for channel in channels:
        await on(bus).subscribe(channel, lambda data: None)
    writes = bus.unsubscribes.writes

    await asyncio.gather(*(bus.unsubscribe(channel) for channel in channels))

    assert bus.unsubscribes.writes == writes + 1
    assert bus.subs.desired == {bus.probe_channel}
    assert [await publisher.publish(channel, b"x") for channel in channels] == [0] * len(channels)


async def test_the_readiness_check_counts_the_unconfirmed_channels_without_listing_them(
    make_bus: Callable[..., RedisBus], valkey: ValkeyServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every WebSocket upgrade asks the bus whether it is healthy, and a replica desires a channel
    per client: listing the unconfirmed ones (a copy and a sort of them all) made each connect cost
    in proportion to the clients already there (issue 26)."""
    bus = make_bus(valkey.url)
    assert await bus.start()
    for n in range(300):
        await on(bus).subscribe(f"client:{n}", lambda _data: None)
    listed: list[int] = []
    real = subscriptions.missing

    def listing(desired: Any, confirmed: Any) -> list[str]:
        listed.append(1)
        return real(desired, confirmed)

    monkeypatch.setattr(subscriptions, "missing", listing)
    for _ in range(10):
        assert bus.health == (True, "ok")
    assert not listed, f"the health check listed the {len(bus.subs.desired)} desired channels {len(listed)} times"

"""Direct links between replicas, against a real Valkey and real sockets.

The contract of :class:`~switchboard.replicas.dataplane.unicast.Unicast`: ``publish`` on
a client channel reaches the subscriber whichever path it takes, later frames
skip Redis once the route is learned, and a route that went stale, broke or
went silent only sends traffic back through Redis; a frame that then reaches
nobody comes out of ``lost()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from support.linked import LinkedReplica as Replica
from support.linked import linked_replicas
from switchboard.protocol.hypha import envelope
from switchboard.protocol.link import link_state as links_mod
from switchboard.protocol.link import link_wire as wire
from switchboard.protocol.link import replica_wire
from switchboard.protocol.link.replica_wire import WorkspaceEvent
from switchboard.testing import FaultProxy, ValkeyServer
from switchboard.testing.ports import free_port
from switchboard.testing.wait import eventually, scaled

SECRET = "links-test-secret"
DEADLINE = scaled(5.0)
LINK_LOGGERS = ("switchboard.replicas.dataplane.links", "switchboard.replicas.dataplane.link")


@pytest.fixture
def quick_death(monkeypatch: pytest.MonkeyPatch) -> None:
    """A link declared dead after 1.5 s of silence, not 3, with heartbeats in the same ratio: the
    tests that wait for a death check that it comes, and when against the constants, not their size."""
    from switchboard.replicas.dataplane import links

    monkeypatch.setattr(links_mod, "DEAD_AFTER", links_mod.DEAD_AFTER / 2)
    monkeypatch.setattr(links_mod, "HEARTBEAT", links_mod.HEARTBEAT / 2)
    monkeypatch.setattr(links, "HEARTBEAT", links_mod.HEARTBEAT)


@pytest.fixture(scope="module")
def valkey_links() -> Iterator[ValkeyServer]:
    with ValkeyServer() as srv:
        yield srv


@pytest.fixture
async def bus_with_links(valkey_links: ValkeyServer) -> AsyncIterator[Callable[..., Any]]:
    """Started replicas with links on loopback, all closed after the test."""
    async with linked_replicas(valkey_links.url, SECRET) as make:
        yield make


def channel() -> str:
    return f"sb:client:ws-{uuid.uuid4().hex[:6]}/c"


async def learned(sender: Replica, receiver: Replica, ch: str, got: list[bytes]) -> None:
    """Publish once through Redis and wait until the receiver has offered its link."""
    before = len(got)
    assert await sender.publish(ch, b"first") == 1
    await eventually(lambda: len(got) > before, "first delivery")
    await eventually(lambda: sender.links.route_of(ch) == receiver.replica_id, "a learned route")


async def linked(bus_with_links, **a_options: Any) -> tuple[Replica, Replica, str, list[bytes]]:
    """Replica ``a`` has learned the route to a channel ``b`` holds; ``got`` is what ``b`` received."""
    a = await bus_with_links("a", **a_options)
    b = await bus_with_links("b")
    ch, got = channel(), []
    await b.subscribe(ch, got.append)
    await learned(a, b, ch, got)
    return a, b, ch, got


@contextlib.asynccontextmanager
async def linked_through_proxy(
    bus_with_links,
) -> AsyncIterator[tuple[FaultProxy, Replica, Replica, str, list[bytes]]]:
    """As :func:`linked`, over a link ``b`` dialled through a proxy."""
    port = free_port()
    async with FaultProxy("127.0.0.1", port, connect_timeout=2.0) as proxy:
        yield proxy, *await linked(bus_with_links, port=port, advertise=f"127.0.0.1:{proxy.port}")


async def kinds_until_closed(reader: asyncio.StreamReader) -> list[int]:
    """The kinds of the frames a link listener sent before it closed the connection."""
    data = await asyncio.wait_for(reader.read(), DEADLINE)  # read() reads to EOF
    return [kind for kind, _ in wire.Decoder(1 << 20).feed(data)]


async def test_later_frames_skip_redis_and_arrive_in_order(bus_with_links) -> None:
    a, b, ch, got = await linked(bus_with_links)
    for i in range(50):
        assert await a.publish(ch, b"%d" % i) == 1

    await eventually(lambda: len(got) == 51, "all frames")
    assert got == [b"first"] + [b"%d" % i for i in range(50)]
    assert a.links.stats.direct == 50
    assert b.links.stats.received == 50


async def test_a_call_sent_over_a_link_offers_its_senders_channel_so_the_answer_needs_no_redis(
    bus_with_links,
) -> None:
    """``a``'s client calls ``b``'s: ``b`` has never sent that caller a frame, yet its answer takes
    the link back at once (through Redis first, a replica cut off from it would wait there)."""
    a, b, ch, got = await linked(bus_with_links)
    caller, answers = channel(), []
    await a.subscribe(caller, answers.append)
    assert a.unicast.send(ch, b"call", reply_to=caller)
    await eventually(lambda: got[-1:] == [b"call"], "the call")
    await eventually(lambda: b.links.route_of(caller) == a.replica_id, "the caller's route, offered")
    assert b.unicast.send(caller, b"answer")
    await eventually(lambda: answers == [b"answer"], "the answer, over the link")
    assert a.links.stats.received == 1


async def test_a_frame_a_link_cannot_decode_is_counted_and_dropped_and_the_link_goes_on(bus_with_links) -> None:
    """The link hands on values, decoded once: a client's frame that claims to be a relayed manager
    call but is not one reaches nobody (and is not sent back), and the next frame arrives."""
    a, b, ch, got = await linked(bus_with_links)
    assert a.unicast.send(ch, b"\x00not a manager call")
    assert a.unicast.send(ch, b"after it")
    await eventually(lambda: got[-1:] == [b"after it"], "the frame after it")
    assert got == [b"first", b"after it"]
    assert (b.links.stats.malformed, b.links.stats.nacked, b.links.stats.received) == (1, 0, 1)


async def test_only_a_channel_held_here_is_offered(bus_with_links) -> None:
    a, b, ch, got = await linked(bus_with_links)
    elsewhere = channel()  # a client this replica does not hold
    assert a.unicast.send(ch, b"call", reply_to=elsewhere)
    await eventually(lambda: got[-1:] == [b"call"], "the call")
    assert b.links.route_of(elsewhere) is None


async def test_workspace_channels_always_go_through_redis(bus_with_links) -> None:
    """The hub sends broadcasts on the bus itself, beside the client channels: no tag, no link."""
    a, b = await bus_with_links("a"), await bus_with_links("b")
    got: list[bytes] = []
    await b.subscribe_bus("sb:ws:shared", got.append)
    event = replica_wire.encode(WorkspaceEvent("shared", a.replica_id, b"event"))  # as the hub publishes one
    for _ in range(3):
        assert await a.bus.publish("sb:ws:shared", event) == 1
    await eventually(lambda: len(got) == 3, "broadcasts")
    assert got == [event] * 3  # untouched: no origin tag on broadcast channels
    assert a.links.stats.direct == 0
    assert b.links.stats.dials == 0


async def test_a_frame_for_a_client_that_moved_follows_it_through_redis(bus_with_links) -> None:
    a, b, c = await bus_with_links("a"), await bus_with_links("b"), await bus_with_links("c")
    ch, on_b, on_c = channel(), [], []
    await b.subscribe(ch, on_b.append)
    await learned(a, b, ch, on_b)

    await b.unsubscribe(ch)  # the client left b ...
    await c.subscribe(ch, on_c.append)  # ... and reconnected to c
    assert await a.publish(ch, b"after the move") == 1  # the stale link still takes it

    await eventually(lambda: on_c == [b"after the move"], "delivery on the new replica")
    assert on_b == [b"first"]
    assert b.links.stats.nacked == 1
    await eventually(lambda: a.links.route_of(ch) == c.replica_id, "the route to the new replica")


async def test_a_frame_nobody_holds_any_more_is_reported_lost(bus_with_links) -> None:
    a, b = await bus_with_links("a"), await bus_with_links("b")
    ch, got = channel(), []
    await b.subscribe(ch, got.append)
    await learned(a, b, ch, got)

    await b.unsubscribe(ch)
    assert await a.publish(ch, b"to nobody") == 1  # counted on the link's word ...

    lost = await asyncio.wait_for(anext(aiter(a.unicast.lost())), DEADLINE)  # ... and corrected
    assert lost == (ch, b"to nobody")
    assert a.links.route_of(ch) is None
    assert got == [b"first"]


async def test_a_reset_link_sends_frames_through_redis_until_it_is_learned_again(
    bus_with_links,
) -> None:
    async with linked_through_proxy(bus_with_links) as (proxy, a, b, ch, got):
        assert proxy.reset_all() >= 1
        await eventually(lambda: a.links.route_count == 0, "the broken route forgotten")
        assert await a.publish(ch, b"via redis") == 1
        await eventually(lambda: got[-1:] == [b"via redis"], "delivery through Redis")

        await eventually(lambda: a.links.route_of(ch) == b.replica_id, "the route learned again")
        direct = a.links.stats.direct
        assert await a.publish(ch, b"direct again") == 1
        await eventually(lambda: got[-1:] == [b"direct again"], "delivery over the new link")
        assert a.links.stats.direct == direct + 1


@pytest.mark.usefixtures("quick_death")
async def test_frames_sent_into_a_silent_link_arrive_through_redis_once_it_is_declared_dead(
    bus_with_links,
) -> None:
    async with linked_through_proxy(bus_with_links) as (proxy, a, b, ch, got):
        proxy.blackhole()  # no FIN, no RST: bytes just stop arriving
        started = time.monotonic()
        for i in range(5):
            assert await a.publish(ch, b"into the void %d" % i) == 1  # the link still takes them
        await eventually(
            lambda: a.links.route_count == 0,
            "the silent link dropped",
            timeout=links_mod.DEAD_AFTER + 2 * links_mod.HEARTBEAT,
        )
        took = time.monotonic() - started
        assert links_mod.DEAD_AFTER - 0.1 <= took <= links_mod.DEAD_AFTER + 2 * links_mod.HEARTBEAT

        await eventually(lambda: len(got) == 6, "the unacked frames, through Redis")
        assert sorted(got[1:]) == [b"into the void %d" % i for i in range(5)]
        assert a.unicast.replayed == 5
        assert await a.publish(ch, b"after") == 1
        await eventually(lambda: got[-1:] == [b"after"], "delivery through Redis")


async def test_acked_frames_are_not_kept_and_not_replayed(bus_with_links) -> None:
    a, b, ch, got = await linked(bus_with_links)
    for i in range(20):
        assert await a.publish(ch, b"%d" % i) == 1
    await eventually(lambda: len(got) == 21, "all frames")
    link = a.links._routes[ch]
    await eventually(lambda: not link.state.unacked, "the delayed ack", timeout=1.0)  # nothing travels back: ACK_DELAY

    await b.close()  # the link dies with nothing unacked
    await eventually(lambda: a.links.route_count == 0, "the route forgotten")
    assert a.unicast.replayed == 0


async def test_a_replica_without_the_secret_gets_no_route(bus_with_links, caplog) -> None:
    caplog.set_level(logging.WARNING, "switchboard.replicas")
    a = await bus_with_links("a")
    intruder = await bus_with_links("intruder", secret="not-the-hub-secret")
    ch, got = channel(), []
    await intruder.subscribe(ch, got.append)
    assert await a.publish(ch, b"first") == 1
    await eventually(lambda: got == [b"first"], "delivery through Redis")

    await eventually(lambda: a.links.stats.refused == 1, "the HELLO refused")
    assert a.links.route_of(ch) is None
    await eventually(lambda: intruder.links.stats.dial_failures == 1, "the intruder's dial failed")
    said = [r.getMessage() for r in caplog.records if r.name in LINK_LOGGERS and r.levelno >= logging.WARNING]
    assert len(said) == 2, said  # once by each side
    assert sum("handshake refused" in line for line in said) == 1


async def test_a_forged_connection_cannot_deliver_anything(bus_with_links) -> None:
    b = await bus_with_links("b")
    ch, got = channel(), []
    await b.subscribe(ch, got.append)
    _, port = b.links.origin.rsplit(":", 1)
    reader, writer = await asyncio.open_connection("127.0.0.1", int(port))
    writer.write(wire.deliver(ch, b"forged"))  # no HELLO first
    await writer.drain()
    assert await kinds_until_closed(reader) == [wire.CHALLENGE]  # and then closed on us
    writer.close()
    assert got == []
    assert b.links.stats.refused == 1


async def test_an_unreachable_sender_is_not_dialled_for_every_frame(bus_with_links) -> None:
    a = await bus_with_links("a", advertise=f"127.0.0.1:{free_port()}")  # nobody listens there
    b = await bus_with_links("b")
    ch, got = channel(), []
    await b.subscribe(ch, got.append)
    for i in range(20):
        assert await a.publish(ch, b"%d" % i) == 1
    await eventually(lambda: len(got) == 20, "every frame through Redis")
    await eventually(lambda: b.links.stats.dial_failures == 1, "the failed dial")
    assert b.links.stats.dials == 1  # quiet for REDIAL_AFTER, not one dial per frame


@pytest.mark.usefixtures("quick_death")
async def test_an_unauthenticated_connection_cannot_announce_a_large_frame(bus_with_links) -> None:
    b = await bus_with_links("b")
    _, port = b.links.origin.rsplit(":", 1)
    reader, writer = await asyncio.open_connection("127.0.0.1", int(port))
    writer.write((1 << 20).to_bytes(4, "big"))  # "a 1 MiB frame follows": refused before any of it
    await writer.drain()
    assert await kinds_until_closed(reader) == [wire.CHALLENGE]
    writer.close()


@pytest.mark.usefixtures("quick_death")
async def test_a_connection_that_never_finishes_its_hello_is_dropped(bus_with_links) -> None:
    b = await bus_with_links("b")
    _, port = b.links.origin.rsplit(":", 1)
    reader, writer = await asyncio.open_connection("127.0.0.1", int(port))
    kind, nonce = wire.Decoder(wire.HANDSHAKE_MAX_FRAME).feed(await reader.readexactly(5 + wire.NONCE_SIZE))[0]
    assert kind == wire.CHALLENGE
    hello = wire.hello(wire.link_key(SECRET), nonce, "slowpoke", b.replica_id, bytes(32))
    started = time.monotonic()
    closed = False
    for byte in hello[:40]:  # trickled: traffic, but never a whole HELLO
        writer.write(bytes([byte]))
        try:
            closed = await asyncio.wait_for(reader.read(1), 0.25) == b""
        except TimeoutError:
            continue
        if closed:
            break
    took = time.monotonic() - started
    assert closed
    assert took <= links_mod.DEAD_AFTER + 2 * links_mod.HEARTBEAT
    writer.close()
    assert b.links.stats.refused == 1


def call(session: str) -> bytes:
    return envelope.encode(
        {
            "type": "method",
            "from": "ws-1/caller",
            "to": "ws-1/provider",
            "method": "services.svc.f",
            "session": session,
        }
    )


@pytest.mark.usefixtures("quick_death")
async def test_an_unacked_call_known_to_have_arrived_is_not_sent_again(bus_with_links) -> None:
    """A call whose reply already came back arrived: replaying it would run it twice."""
    async with linked_through_proxy(bus_with_links) as (proxy, a, b, ch, got):
        answered, unanswered = call("s-answered"), call("s-waiting")
        for session in ("s-answered", "s-waiting"):
            a.calls.opened("ws-1/caller", session, "ws-1/provider", {"ws-1/caller"})
        proxy.blackhole()
        assert await a.publish(ch, answered) == 1
        assert await a.publish(ch, unanswered) == 1
        a.calls.closed("ws-1/caller", "s-answered")  # its reply came back some other way
        await eventually(
            lambda: a.links.route_count == 0,
            "the silent link dropped",
            timeout=links_mod.DEAD_AFTER + 2 * links_mod.HEARTBEAT,
        )
        await eventually(lambda: got[-1:] == [unanswered], "the unanswered call, through Redis")
        assert got == [b"first", unanswered]
        assert (a.unicast.replayed, a.unicast.not_replayed) == (1, 1)

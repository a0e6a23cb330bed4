"""The router's decisions carried out: two hubs on one embedded bus and registry, on the fake clock.

:mod:`tests.hub.test_router` says which action a frame gets; here the hub does
it, and a client's connection shows the result. "Another replica's client"
and "nobody's" are the same decision for the router (``Forward``): only the
publish tells them apart, so they are told apart here.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from support.wire import Wire, attach_client, settle
from switchboard.backends.memory import MemoryBus, MemoryRegistry
from switchboard.hub.dispatch import BROADCAST_TURN
from switchboard.hub.hub import Hub
from switchboard.hub.identity.users import Permission, User
from switchboard.hub.sessions.peer import Peer
from switchboard.protocol.hypha import envelope
from switchboard.protocol.link import replica_wire
from switchboard.replicas.dataplane.remote import CLIENT_CHANNEL
from switchboard.server.app import build_hub
from switchboard.testing.clock import FakeClock
from switchboard.testing.hub import settings_for_tests

pytestmark = pytest.mark.timeout(10)

WS = "ws-1"
USER = User(id="alice", grants={WS: Permission.READ_WRITE})


class Pair:
    """Replicas ``a`` and ``b`` sharing one bus's channels and one registry."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        bus, registry = MemoryBus(), MemoryRegistry(clock=self.clock)
        self.a: Hub = build_hub(settings_for_tests(replica_id="a"), clock=self.clock, bus=bus, registry=registry)
        self.b: Hub = build_hub(
            settings_for_tests(replica_id="b"), clock=self.clock, bus=bus.sibling(), registry=registry
        )
        self.tasks: list[asyncio.Task[None]] = []

    async def connect(self, hub: Hub, client_id: str) -> tuple[Peer, Wire]:
        peer, wire, writer = await attach_client(hub, WS, client_id, USER)
        self.tasks.append(writer)
        return peer, wire

    async def send(self, hub: Hub, sender: Peer, main: dict[str, Any]) -> None:
        await hub.handle_binary(sender, envelope.encode(main))
        await settle()

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


@pytest.fixture
async def pair() -> Any:
    p = Pair()
    yield p
    await p.close()


def call(to: str, session: str = "s1") -> dict[str, Any]:
    return {"type": "method", "to": to, "method": "services.s.f", "session": session}


async def test_a_call_to_a_client_here_reaches_it_and_its_reply_comes_back(pair: Pair) -> None:
    caller, caller_wire = await pair.connect(pair.a, "caller")
    prov, prov_wire = await pair.connect(pair.a, "prov")
    await pair.send(pair.a, caller, call("prov"))
    assert prov_wire.methods() == ["services.s.f"]
    assert pair.a.inflight.is_open(caller.id, "s1")
    await pair.send(pair.a, prov, {"type": "method", "to": caller.id, "method": "s1.resolve"})
    assert caller_wire.methods() == ["s1.resolve"]
    assert len(pair.a.inflight) == 0


async def test_a_call_to_another_replicas_client_is_published_and_counted_in_flight_on_both(pair: Pair) -> None:
    caller, caller_wire = await pair.connect(pair.a, "caller")
    prov, prov_wire = await pair.connect(pair.b, "prov")
    await pair.send(pair.a, caller, call("prov"))
    assert prov_wire.methods() == ["services.s.f"]
    assert pair.a.inflight.is_open(caller.id, "s1")
    assert pair.b.inflight.busy(prov.id), "the callee's replica counts it too (a drain waits for it)"
    await pair.send(pair.b, prov, {"type": "method", "to": caller.id, "method": "s1.resolve"})
    assert caller_wire.methods() == ["s1.resolve"]
    assert len(pair.a.inflight) == len(pair.b.inflight) == 0


class LinkTries:
    """What replica ``hub``'s unicast is asked, counted on the real one: every frame offered to a
    direct link (``send``, or a ``publish`` that may take one first), every publish, and every
    wrapping of a manager's call with its origin."""

    def __init__(self, hub: Hub, monkeypatch: pytest.MonkeyPatch) -> None:
        self.offered: list[bytes] = []
        self.published: list[bytes] = []
        self.wrapped = 0
        send, publish, wrap = hub.unicast.send, hub.unicast.publish, replica_wire.wrap_manager_call

        def counting_send(channel: str, data: bytes, *, reply_to: str | None = None) -> bool:
            self.offered.append(data)
            return send(channel, data, reply_to=reply_to)

        async def counting_publish(channel: str, data: bytes, *, direct: bool = True) -> int:
            if direct:
                self.offered.append(data)
            self.published.append(data)
            return await publish(channel, data, direct=direct)

        def counting_wrap(origin: str, session: str, frame: bytes) -> bytes:
            self.wrapped += 1
            return wrap(origin, session, frame)

        monkeypatch.setattr(hub.unicast, "send", counting_send)
        monkeypatch.setattr(hub.unicast, "publish", counting_publish)
        monkeypatch.setattr(replica_wire, "wrap_manager_call", counting_wrap)


async def test_a_managers_call_to_another_replicas_client_is_wrapped_once_and_tries_the_link_once(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    prov, prov_wire = await pair.connect(pair.b, "prov")
    tries = LinkTries(pair.a, monkeypatch)
    await pair.a.manager.hub.route_from_manager(envelope.encode(call(prov.id, "m1")))
    await settle()
    assert prov_wire.methods() == ["services.s.f"], "unwrapped for its client"
    assert pair.b.router.reply_routes.origin_of("m1") == "a", "its reply finds the way back to a's manager"
    assert tries.wrapped == 1, "wrapped with its origin once, by the router"
    assert len(tries.offered) == 1, "offered to a direct link once, then only published"
    assert tries.published == tries.offered, "the frame as it was wrapped for the trip"


async def test_a_managers_call_that_reached_nobody_is_retried_as_it_was_wrapped(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    prov, _ = await pair.connect(pair.b, "prov")
    await pair.b.bus.unsubscribe(CLIENT_CHANNEL + prov.id)  # its replica's subscription is being re-wired
    tries = LinkTries(pair.a, monkeypatch)
    await pair.a.manager.hub.route_from_manager(envelope.encode(call(prov.id, "m1")))
    await settle()
    assert pair.a.retry.pending(prov.id), "claimed by a replica: it waits in the retry window"
    assert len(tries.published) >= 2, "published, then retried"
    assert set(tries.published) == {tries.published[0]}, "the same frame each time"
    assert tries.wrapped == 1, "the retry window sends the frame as the router wrapped it for the trip"
    await pair.a.retry.close()


async def test_a_call_to_nobody_is_rejected_at_once_and_an_event_to_nobody_is_dropped(pair: Pair) -> None:
    caller, caller_wire = await pair.connect(pair.a, "caller")
    await pair.send(pair.a, caller, call("nobody"))
    assert caller_wire.methods() == ["s1.reject"]
    await pair.send(pair.a, caller, {"type": "my-event", "to": "nobody"})
    assert caller_wire.methods() == ["s1.reject"], "no reject storm for fire-and-forget frames"
    assert len(pair.a.inflight) == 0


async def test_a_call_to_a_client_whose_connection_just_ended_waits_unless_it_said_goodbye(pair: Pair) -> None:
    caller, caller_wire = await pair.connect(pair.a, "caller")
    dropped, _ = await pair.connect(pair.a, "dropped")
    left, _ = await pair.connect(pair.a, "left")
    dropped.client_closed(1006)  # no goodbye: it comes back
    left.client_closed(1000)  # goodbye: it has left
    await pair.send(pair.a, caller, call("dropped", "s1"))
    await pair.send(pair.a, caller, call("left", "s2"))
    assert pair.a.transit.holding == 1, "held for the client in transit"
    assert caller_wire.methods() == ["s2.reject"]


async def test_while_draining_a_new_call_to_a_client_here_waits_for_it_elsewhere(pair: Pair) -> None:
    caller, caller_wire = await pair.connect(pair.a, "caller")
    prov, prov_wire = await pair.connect(pair.a, "prov")
    pair.a.router.draining = True
    await pair.a.bus.unsubscribe(CLIENT_CHANNEL + prov.id)  # as the drain does once prov waits for nothing
    await pair.send(pair.a, caller, call("prov"))
    assert prov_wire.methods() == []
    assert pair.a.retry.pending(f"{WS}/prov")
    assert not pair.a.inflight.is_open(caller.id, "s1"), "the drain does not wait for it"
    await pair.a.retry.close()


async def test_a_broadcast_reaches_the_subscribers_of_the_workspace_on_every_replica(pair: Pair) -> None:
    sender, sender_wire = await pair.connect(pair.a, "sender")
    _, here = await pair.connect(pair.a, "here")
    there_peer, there = await pair.connect(pair.b, "there")
    pair.a.subscribers.add(pair.a.peers[f"{WS}/here"], ["news"])
    pair.b.subscribers.add(there_peer, ["news"])
    await pair.send(pair.a, sender, {"type": "news", "to": "*", "data": 1})
    assert here.methods() == ["news"]
    assert there.methods() == ["news"]
    assert sender_wire.methods() == [], "not subscribed: not sent"


async def test_a_broadcast_to_thousands_lets_the_loop_turn_and_keeps_each_listener_s_order(pair: Pair) -> None:
    """Issue 26: announcing the departures of clients past their grace to every listener of the
    workspace, each in one go, held a replica's loop for 14 s: its other clients waited, and its
    lease lapsed. The writes go in turns; every listener still sees the broadcasts in their order."""
    listeners = 3 * BROADCAST_TURN
    wires = []
    for i in range(listeners):
        peer, wire = await pair.connect(pair.a, f"l{i}")
        pair.a.subscribers.add(peer, ["news"])
        wires.append(wire)
    seen_midway: list[int] = []

    async def watch() -> None:
        for _ in range(20):  # bounded: a few turns of the loop
            seen_midway.append(sum(1 for w in wires if w.methods()))
            await asyncio.sleep(0)

    watcher = asyncio.ensure_future(watch())
    await pair.a.events.emit_event(WS, "news", 1)
    await pair.a.events.emit_event(WS, "more-news", 2)  # nobody listens: not sent
    pair.a.subscribers.add(pair.a.peers[f"{WS}/l{listeners - 1}"], ["late"])
    await pair.a.events.emit_event(WS, "late", 3)  # one listener, but behind the others: waits its turn
    await watcher
    await settle()
    assert any(0 < n < listeners for n in seen_midway), f"listeners served per turn of the loop: {seen_midway}"
    assert all(w.methods() == ["news"] for w in wires[:-1])
    assert wires[-1].methods() == ["news", "late"], "the last listener of the first broadcast got it first"

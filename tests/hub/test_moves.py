"""A hub on the embedded backends and the fake clock: what a client in transit sees, and its callers.

A provider's connection ends without a goodbye (a drop, a drain's hand-over):
nothing announces it gone, calls to it wait, and they reach it once it is back;
if it is not back within the grace, its departure is announced and the calls
fail "not connected". A goodbye, a client the hub drops, or a grace of 0 are
departures at once, as before transit existed.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import msgpack
import pytest

from support.wire import Wire, attach_client, settle
from switchboard.errors import HandshakeError
from switchboard.hub.hub import Hub
from switchboard.hub.identity.users import User, new_anonymous_user
from switchboard.hub.sessions.life import HANDED_OVER
from switchboard.hub.sessions.peer import Peer
from switchboard.protocol.hypha import envelope
from switchboard.server.app import build_hub
from switchboard.testing.clock import FakeClock
from switchboard.testing.hub import settings_for_tests

pytestmark = pytest.mark.timeout(10)

WS = "ws-1"
GRACE = 5.0
USER = new_anonymous_user()


class Net:
    """One hub and its clients, on the fake clock."""

    def __init__(self, grace: float = GRACE) -> None:
        self.clock = FakeClock()
        self.hub: Hub = build_hub(settings_for_tests(transit_grace=grace), clock=self.clock)
        self.tasks: list[asyncio.Task[None]] = []

    async def connect(
        self,
        client_id: str,
        *,
        reconnecting: bool = False,
        services: tuple[str, ...] = (),
        events: tuple[str, ...] = (),
        user: User = USER,
    ) -> tuple[Peer, Wire]:
        peer, wire, writer = await attach_client(
            self.hub, WS, client_id, user, reconnecting=reconnecting, services=services, events=events
        )
        self.tasks.append(writer)
        return peer, wire

    async def leave(self, peer: Peer, *, code: int, by_client: bool = True) -> None:
        if by_client:
            peer.client_closed(code)
        else:
            peer.close(code, "closed by the hub")
        await self.hub.detach(peer)
        await settle()

    async def call(self, caller: Peer, target: str, session: str) -> None:
        frame = envelope.encode({"type": "method", "to": target, "method": "services.s.f", "session": session})
        await self.hub.handle_binary(caller, frame)
        await settle()

    async def listed(self, client_id: str) -> bool:
        from switchboard.protocol.hypha.services import ServiceQuery

        return bool(await self.hub.registry.find(ServiceQuery(WS, client_id, "built-in")))

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def calls(wire: Wire) -> list[str]:
    return [h["session"] for h in wire.heads() if h.get("method") == "services.s.f"]


def events(wire: Wire) -> list[str]:
    return [h["type"] for h in wire.heads() if h.get("type") in ("client_disconnected", "service_removed")]


def rejects(wire: Wire) -> list[str]:
    return [h["method"] for h in wire.heads() if str(h.get("method", "")).endswith(".reject")]


@pytest.fixture
async def net() -> Any:
    n = Net()
    yield n
    await n.close()


async def test_a_dropped_provider_is_not_announced_and_calls_to_it_reach_it_once_it_is_back(net: Net) -> None:
    prov, _ = await net.connect("prov", services=("s",))
    caller, caller_wire = await net.connect("caller", events=("client_disconnected", "service_removed"))
    await net.leave(prov, code=1006)  # the connection dropped: no goodbye
    assert f"{WS}/prov" in net.hub.transit
    assert await net.listed("prov"), "its registrations stay listed while it is in transit"
    await net.call(caller, f"{WS}/prov", "s1")
    await net.call(caller, f"{WS}/prov", "s2")
    assert net.hub.transit.holding == 2
    net.clock.advance(GRACE / 2)
    _, back_wire = await net.connect("prov", reconnecting=True)
    assert calls(back_wire) == ["s1", "s2"], "held calls delivered once, in order"
    assert events(caller_wire) == []
    assert rejects(caller_wire) == []
    net.clock.advance(GRACE)
    await net.hub.moves.settle_transits()  # the grace would be over now: nothing is due any more
    await settle()
    assert calls(back_wire) == ["s1", "s2"], "nothing delivered twice"
    assert events(caller_wire) == []
    assert await net.listed("prov")


async def test_a_provider_not_back_within_the_grace_is_announced_gone_and_its_callers_fail(net: Net) -> None:
    prov, _ = await net.connect("prov", services=("s",))
    caller, caller_wire = await net.connect("caller", events=("client_disconnected", "service_removed"))
    await net.leave(prov, code=HANDED_OVER, by_client=False)  # a drain sent it to a sibling
    await net.call(caller, f"{WS}/prov", "s1")
    net.clock.advance(GRACE - 0.01)
    await net.hub.moves.settle_transits()
    await settle()
    assert events(caller_wire) == [], "withheld during the grace"
    assert rejects(caller_wire) == []
    net.clock.advance(0.01)
    await net.hub.moves.settle_transits()
    await settle()
    assert events(caller_wire) == ["service_removed", "client_disconnected"], "announced at the grace's end"
    assert rejects(caller_wire) == ["s1.reject"], "the held call fails: not connected"
    assert b"is not connected" in caller_wire.frames[-1]
    assert not await net.listed("prov")
    assert net.hub.transit.expired_total == 1
    await net.call(caller, f"{WS}/prov", "s2")  # from now on: "not connected" at once
    assert rejects(caller_wire) == ["s1.reject", "s2.reject"]
    await net.hub.moves.settle_transits()
    await settle()
    assert events(caller_wire) == ["service_removed", "client_disconnected"], "announced once"


@pytest.mark.parametrize(
    ("code", "by_client", "why"),
    [
        (1000, True, "a goodbye"),
        (1001, True, "a page closed"),
        (1008, False, "the hub dropped a slow consumer"),
    ],
)
async def test_departures_that_are_not_moves_are_announced_at_once(
    net: Net, code: int, by_client: bool, why: str
) -> None:
    prov, _ = await net.connect("prov", services=("s",))
    caller, caller_wire = await net.connect("caller", events=("client_disconnected", "service_removed"))
    await net.leave(prov, code=code, by_client=by_client)
    assert f"{WS}/prov" not in net.hub.transit, why
    assert events(caller_wire) == ["service_removed", "client_disconnected"], why
    await net.call(caller, f"{WS}/prov", "s1")
    assert rejects(caller_wire) == ["s1.reject"], why


async def test_a_grace_of_zero_turns_transit_off() -> None:
    net = Net(grace=0.0)
    try:
        prov, _ = await net.connect("prov", services=("s",))
        caller, caller_wire = await net.connect("caller", events=("client_disconnected",))
        await net.leave(prov, code=1006)
        assert events(caller_wire) == ["client_disconnected"]
        await net.call(caller, f"{WS}/prov", "s1")
        assert rejects(caller_wire) == ["s1.reject"]
    finally:
        await net.close()


async def test_a_goodbye_right_after_coming_back_is_a_reconnection_race_not_a_departure(net: Net) -> None:
    """hypha-rpc 0.21.47 may open two connections at once and close the first with 1000."""
    prov, _ = await net.connect("prov", services=("s",))
    caller, caller_wire = await net.connect("caller", events=("client_disconnected",))
    await net.leave(prov, code=1006)
    first, _ = await net.connect("prov", reconnecting=True)
    net.clock.advance(0.016)
    await net.leave(first, code=1000)  # its own second reconnection closes this one
    assert events(caller_wire) == []
    await net.call(caller, f"{WS}/prov", "s1")
    _, second_wire = await net.connect("prov", reconnecting=True)
    assert calls(second_wire) == ["s1"]
    net.clock.advance(2.0)
    await net.leave(net.hub.peers[f"{WS}/prov"], code=1000)  # a real goodbye, later
    assert events(caller_wire) == ["client_disconnected"]


async def test_frames_still_queued_for_a_handed_over_client_wait_for_it(net: Net) -> None:
    prov, prov_wire = await net.connect("prov", services=("s",))
    caller, _ = await net.connect("caller")
    frame = envelope.encode(
        {"type": "method", "from": f"{WS}/caller", "to": f"{WS}/prov", "method": "services.s.f", "session": "q1"}
    )
    prov.queue._frames = deque([frame])  # written by nobody yet when the drain closes it
    await net.leave(prov, code=HANDED_OVER, by_client=False)
    assert calls(prov_wire) == []
    _, back_wire = await net.connect("prov", reconnecting=True)
    assert calls(back_wire) == ["q1"]


async def test_the_leaders_sweep_ends_a_transit_no_replica_heard_of(net: Net) -> None:
    """Its notice was lost and the replica it left is gone: the registry still knows its deadline."""
    _, caller_wire = await net.connect("caller", events=("client_disconnected",))
    info = {"id": f"{WS}/orphan:built-in", "name": "built-in", "config": {}}
    await net.hub.registry.register(info)  # type: ignore[arg-type]
    await net.hub.registry.begin_transit(WS, "orphan", owner="gone-replica", grace=GRACE)
    assert await net.hub.moves.sweep_transits() == 0  # not due yet
    net.clock.advance(GRACE)
    assert await net.hub.moves.sweep_transits() == 1
    await settle()
    assert events(caller_wire) == ["client_disconnected"]
    assert not await net.listed("orphan")


async def test_replies_to_a_connection_closed_right_after_coming_back_are_sent_again_on_the_next(net: Net) -> None:
    """hypha-rpc 0.21.47's reconnection race: the call that opened a connection has its reply
    written there just as the client closes that connection (1000) for its listener's own,
    and its listener stops reading once the close is done; the reply never reaches the RPC.
    The hub sends it again on the next connection (a reply is safe to send twice)."""
    prov, prov_wire = await net.connect("prov", services=("s",))
    caller, _ = await net.connect("caller")
    await net.leave(caller, code=1006)
    first, first_wire = await net.connect("caller", reconnecting=True)
    await net.call(first, f"{WS}/prov", "q1")
    reply = envelope.encode({"type": "method", "to": f"{WS}/caller", "method": "q1.resolve", "args": [1]})
    await net.hub.handle_binary(net.hub.peers[f"{WS}/prov"], reply)
    await settle()
    assert [h["method"] for h in first_wire.heads()] == ["q1.resolve"]
    net.clock.advance(0.016)
    await net.leave(first, code=1000)  # closed by the client's second reconnection, unread
    _, second_wire = await net.connect("caller", reconnecting=True)
    assert [h["method"] for h in second_wire.heads()] == ["q1.resolve"], "the reply, once more"
    assert prov_wire.heads()[-1]["method"] == "services.s.f"


async def test_replies_are_not_sent_again_once_the_connection_has_settled(net: Net) -> None:
    prov, _ = await net.connect("prov", services=("s",))
    caller, _ = await net.connect("caller")
    await net.leave(caller, code=1006)
    back, _ = await net.connect("caller", reconnecting=True)
    provider = net.hub.peers[f"{WS}/prov"]
    for session, after in (("q1", 0.0), ("q2", 2.0)):  # one reply while fresh, one after FRESH_GOODBYE
        net.clock.advance(after)
        await net.call(back, f"{WS}/prov", session)
        reply = envelope.encode({"type": "method", "to": f"{WS}/caller", "method": f"{session}.resolve"})
        await net.hub.handle_binary(provider, reply)
        await settle()
    assert len(back.fresh_replies or ()) == 1, "noted only while fresh"
    await net.leave(back, code=1006)  # a drop, long after coming back
    _, again = await net.connect("caller", reconnecting=True)
    assert again.heads() == [], "nothing sent twice"


async def test_frames_still_queued_when_a_connection_drops_wait_for_its_client(net: Net) -> None:
    prov, prov_wire = await net.connect("prov", services=("s",))
    frame = envelope.encode(
        {"type": "method", "from": f"{WS}/caller", "to": f"{WS}/prov", "method": "services.s.f", "session": "q1"}
    )
    prov.queue._frames = deque([frame])  # accepted, not yet written, when the connection drops
    await net.leave(prov, code=1006)
    _, back_wire = await net.connect("prov", reconnecting=True)
    assert calls(back_wire) == ["q1"]


async def test_frames_queued_on_a_superseded_connection_go_to_the_one_that_replaced_it(net: Net) -> None:
    prov, _ = await net.connect("prov", services=("s",))
    frame = envelope.encode(
        {"type": "method", "from": f"{WS}/caller", "to": f"{WS}/prov", "method": "services.s.f", "session": "q1"}
    )
    prov.queue._frames = deque([frame])  # not yet written when the client's new connection arrives
    _, new_wire = await net.connect("prov", reconnecting=True)
    assert prov.closed
    assert calls(new_wire) == ["q1"]


async def test_a_client_cannot_make_the_hub_keep_more_than_the_bound_of_fresh_replies(net: Net) -> None:
    """Played by a caller flooding a fresh connection with replies, some huge: the hub keeps the
    last FRESH_REPLIES of at most FRESH_REPLY_BYTES each, and frees them when they are handed on."""
    from switchboard.hub.sessions.peer import FRESH_REPLIES, FRESH_REPLY_BYTES

    await net.connect("prov", services=("s",))
    caller, _ = await net.connect("caller")
    await net.leave(caller, code=1006)
    back, back_wire = await net.connect("caller", reconnecting=True)
    provider = net.hub.peers[f"{WS}/prov"]
    for i in range(FRESH_REPLIES + 8):  # within the provider's rate burst: every one is delivered
        reply = envelope.encode({"type": "method", "to": f"{WS}/caller", "method": f"q{i}.resolve"})
        await net.hub.handle_binary(provider, reply)
    args = msgpack.packb({"args": ["x" * FRESH_REPLY_BYTES]})
    huge = envelope.encode({"type": "method", "to": f"{WS}/caller", "method": "big.resolve"}, args)
    await net.hub.handle_binary(provider, huge)
    await settle()
    assert len(back_wire.heads()) == FRESH_REPLIES + 9, "every reply reached the client"
    assert len(back.fresh_replies or ()) == FRESH_REPLIES
    assert all(len(frame) <= FRESH_REPLY_BYTES for frame in back.fresh_replies or ())
    await net.leave(back, code=1000)  # its own reconnection race: handed on ...
    assert not back.fresh_replies, "... and freed"


# -- who gets what was held: only the client's reconnection token ----------------------------


async def test_another_user_naming_a_client_in_transit_is_refused_and_gets_nothing_held_for_it(net: Net) -> None:
    prov, _ = await net.connect("prov", services=("s",))
    caller, caller_wire = await net.connect("caller", events=("client_disconnected", "service_removed"))
    await net.leave(prov, code=1006)
    await net.call(caller, f"{WS}/prov", "s1")
    with pytest.raises(HandshakeError, match="belongs to another user"):
        await net.connect("prov", user=new_anonymous_user())
    assert net.hub.transit.holding == 1, "the held call still waits for the client"
    assert await net.listed("prov")
    _, back_wire = await net.connect("prov", reconnecting=True)  # the client, with its token
    assert calls(back_wire) == ["s1"]
    assert events(caller_wire) == []
    assert rejects(caller_wire) == []


async def test_the_same_user_without_the_reconnection_token_starts_afresh_and_what_was_held_fails(
    net: Net,
) -> None:
    prov, _ = await net.connect("prov", services=("s",))
    caller, caller_wire = await net.connect("caller")
    await net.leave(prov, code=1006)
    await net.call(caller, f"{WS}/prov", "s1")
    _, fresh_wire = await net.connect("prov")  # its own token, not the reconnection token
    await settle()
    assert calls(fresh_wire) == [], "what was held for the earlier session is not handed to a new one"
    assert rejects(caller_wire) == ["s1.reject"]
    assert f"{WS}/prov" not in net.hub.transit


async def test_a_store_that_lost_its_data_learns_again_whose_client_ids_they_are(net: Net) -> None:
    await net.connect("prov", services=("s",))
    await net.hub.registry.remove_client(WS, "prov")  # as if the store had lost it
    assert await net.hub.registry.holder(WS, "prov") is None
    await net.hub.repairs.reclaim()
    assert await net.hub.registry.holder(WS, "prov") == USER.id
    with pytest.raises(HandshakeError, match="belongs to another user"):
        await net.connect("prov", user=new_anonymous_user())


async def test_what_was_held_fails_at_the_grace_s_end_and_never_reaches_whoever_takes_the_id_next(
    net: Net,
) -> None:
    prov, _ = await net.connect("prov", services=("s",))
    caller, caller_wire = await net.connect("caller")
    await net.leave(prov, code=1006)
    await net.call(caller, f"{WS}/prov", "s1")
    net.clock.advance(GRACE)
    await net.hub.moves.settle_transits()  # the id is free from here on
    _, newcomer_wire = await net.connect("prov", user=new_anonymous_user())
    await settle()
    assert calls(newcomer_wire) == [], "a call held for the client that left reached the next holder of its id"
    assert rejects(caller_wire) == ["s1.reject"]


async def test_frames_left_on_a_dropped_connection_that_its_holding_cannot_take_fail_their_callers_at_once() -> None:
    """The frames a dropped connection never wrote are held for its client, newest kept first; those
    past the holding's bound (the send queue's) are not dropped silently: their callers are told."""
    net = Net()
    net.hub = build_hub(settings_for_tests(transit_grace=GRACE, send_queue_bytes=3000), clock=net.clock)
    try:
        prov, _ = await net.connect("prov", services=("s",))
        caller, caller_wire = await net.connect("caller")
        pad = b"x" * 1200
        frames = [
            envelope.encode(
                {"type": "method", "from": f"{WS}/caller", "to": f"{WS}/prov", "method": "services.s.f", "session": s},
                msgpack.packb({"args": [pad]}),
            )
            for s in ("q1", "q2", "q3")
        ]
        prov.queue._frames = deque(frames)  # accepted for the connection, none written yet when it drops
        await net.leave(prov, code=1006)

        assert rejects(caller_wire) == ["q1.reject"], "the oldest did not fit: its caller is told now"
        assert net.hub.transit.holding == 2, "the two newest are held for it"
    finally:
        await net.close()

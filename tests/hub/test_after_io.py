"""What a frame becomes after the I/O: the router's fallback table, as values.

A publish that reached nobody, a frame the bus delivered to a connection that
had just ended, a connection here that refused a frame, and the registry's
answer to "does some replica claim this client?" each come back to the router
as a fact; it answers with the next action, which the dispatch only carries
out. Whether a frame is held, and whether holding it begins its client's
transit on the spot, is the router's too (:meth:`Router.hold`): the moves only
keep what they are given. Synchronous but for the rows where frames already
wait for the target (the retry window's queue runs on the event loop).
"""

from __future__ import annotations

from typing import Any

import pytest

from support.wire import Wire
from switchboard.hub.identity.users import Permission, User
from switchboard.hub.routing.actions import Deliver, Fail, Forward, Hold, RetryIfClaimed, RetryLater, Send
from switchboard.hub.routing.router import Router
from switchboard.hub.routing.undelivered import Undelivered
from switchboard.hub.sessions.in_transit import Transit
from switchboard.hub.sessions.life import HANDED_OVER
from switchboard.hub.sessions.peer import Peer
from switchboard.hub.transit.retry import RetryWindow
from switchboard.metrics import HubMetrics
from switchboard.protocol.hypha import envelope
from switchboard.protocol.link import replica_wire
from switchboard.testing.clock import FakeClock
from switchboard.testing.hub import settings_for_tests

WS = "ws-1"
MOVING = f"{WS}/moving"  # in transit between connections
AWAY = f"{WS}/away"  # not here, not moving: another replica's, or nobody's
CALLER = f"{WS}/caller"
ALIAS = f"{WS}/http-caller"  # an HTTP caller's address: the manager acts for it
ITEM = Undelivered(b"frame", "s1", CALLER)
# clients of this replica, by how their connection is (see connection())
LIVE, DROPPED, HANDED, GOODBYE, FRESH_GOODBYE = (f"{WS}/{n}" for n in ("live", "dropped", "handed", "bye", "fresh"))
BEGINS = "Hold, its transit beginning now"


async def _unreached(*_: Any) -> bool:
    return False


def connection(client: str, clock: FakeClock) -> Peer:
    """A client's connection here: open (``LIVE``), or ended by a drop, a drain's hand-over, a
    goodbye, or a goodbye within a second of coming back from transit."""
    peer = Peer(
        workspace=WS,
        client_id=client.partition("/")[2],
        user=User(id="u", grants={WS: Permission.READ_WRITE}),
        transport=Wire(),
        max_queue_bytes=1 << 20,
    )
    if client == DROPPED:
        peer.client_closed(1006)
    elif client == HANDED:
        peer.close(HANDED_OVER, "handed over")
    elif client == GOODBYE:
        peer.client_closed(1000)
    elif client == FRESH_GOODBYE:
        peer.life.arrived(clock.monotonic())
        peer.life.back()
        peer.client_closed(1000)
    return peer


def router(*, window: float, grace: float = 5.0) -> tuple[Router, RetryWindow]:
    clock = FakeClock()
    settings = settings_for_tests()
    transit: Transit[Undelivered] = Transit(clock=clock, grace=grace)
    transit.left(MOVING)
    retry = RetryWindow(clock=clock, window=window, interval=0.1, publish=_unreached, give_up=lambda *_: None)
    peers = {c: connection(c, clock) for c in (LIVE, DROPPED, HANDED, GOODBYE, FRESH_GOODBYE)}
    return (
        Router(
            settings=settings,
            clock=clock,
            metrics=HubMetrics(settings.replica_id),
            peers=peers,
            aliases={ALIAS},
            transit=transit,
            retry=retry,
        ),
        retry,
    )


def shape(action: Any) -> Any:
    """An action as the types it is made of: ``Hold`` with what it falls back to."""
    if type(action) is Hold:
        return (BEGINS if action.begins else Hold, shape(action.otherwise))
    return type(action)


# the client's state × grace → whether a frame for it is held (and its transit begun on the spot)
HOLD = [
    (MOVING, 5.0, (Hold, Fail)),
    (DROPPED, 5.0, (BEGINS, Fail)),
    (HANDED, 5.0, (BEGINS, Fail)),
    (FRESH_GOODBYE, 5.0, (BEGINS, Fail)),  # a goodbye too fresh to believe (life.FRESH_GOODBYE)
    (GOODBYE, 5.0, Fail),
    (LIVE, 5.0, Fail),
    (AWAY, 5.0, Fail),
    (DROPPED, 0.0, Fail),  # no grace: nobody is expected back
]


@pytest.mark.parametrize(("target", "grace", "expected"), HOLD)
def test_a_frame_is_held_for_a_moving_client_and_for_one_whose_connection_just_ended_without_goodbye(
    target: str, grace: float, expected: Any
) -> None:
    r, _ = router(window=6.0, grace=grace)
    done = r.hold(target, ITEM, Fail(target, ITEM))
    assert shape(done) == expected
    assert getattr(done, "target", None) == target


# target × retry window → what a publish that reached nobody becomes
REACHED_NOBODY = [
    (MOVING, 6.0, (Hold, RetryIfClaimed)),
    (MOVING, 0.0, (Hold, Fail)),
    (AWAY, 6.0, RetryIfClaimed),
    (AWAY, 0.0, Fail),
]


@pytest.mark.parametrize(("target", "window", "expected"), REACHED_NOBODY)
def test_a_publish_that_reached_nobody_waits_for_a_moving_client_else_for_a_claimed_one_else_fails(
    target: str, window: float, expected: Any
) -> None:
    r, _ = router(window=window)
    assert shape(r.reached_nobody(Forward(target, ITEM, ITEM.frame))) == expected


# who makes a call to a client of another replica → the frame as it travels between replicas
TRAVELLING = [
    ("manager", True),  # wrapped with its origin, so that the reply finds its way back here
    ("alias", True),  # an HTTP caller the manager acts for
    (CALLER, False),
]


@pytest.mark.parametrize(("caller", "wrapped"), TRAVELLING)
def test_a_managers_call_to_another_replica_travels_wrapped_with_its_origin_once(caller: str, wrapped: bool) -> None:
    r, _ = router(window=6.0)
    caller = {"manager": r.manager_address, "alias": ALIAS}.get(caller, caller)
    item = Undelivered(b"call", "m1.x", caller)
    forward = r.toward(AWAY, item)
    assert type(forward) is Forward
    assert forward.item == item, "as a client here would get it (held, it may be delivered here)"
    assert forward.wire == (replica_wire.wrap_manager_call(r.replica_id, "m1", b"call") if wrapped else b"call")
    # it reached nobody: retried, or held for a moving client, without being wrapped again
    retried = r.reached_nobody(forward)
    assert type(retried) is RetryIfClaimed
    assert retried.item.frame is forward.wire
    assert type(done := r.claim_read(AWAY, retried.item, claimed=True)) is RetryLater
    assert done.item.frame is forward.wire
    held = r.reached_nobody(Forward(MOVING, item, forward.wire))
    assert type(held) is Hold
    assert held.item is item
    assert getattr(held.otherwise, "item", None) == retried.item


# the client's state × retry window × frames already waiting → what a frame lost after delivery
# becomes (its client's connection ended, so it may be moving: the router's hold says)
LOST = [
    (MOVING, 6.0, False, (Hold, RetryIfClaimed)),
    (DROPPED, 0.0, False, (BEGINS, Fail)),
    (AWAY, 6.0, False, RetryIfClaimed),
    (AWAY, 0.0, False, Fail),
    (AWAY, 6.0, True, RetryLater),
    (AWAY, 0.0, True, RetryLater),
    (MOVING, 6.0, True, (Hold, RetryLater)),
]


@pytest.mark.parametrize(("target", "window", "waiting", "expected"), LOST)
async def test_a_frame_lost_after_delivery_is_held_else_queued_behind_others_else_claimed_else_failed(
    target: str, window: float, waiting: bool, expected: Any
) -> None:
    r, retry = router(window=window)
    if waiting:
        retry.add(target, Undelivered(b"earlier", None, CALLER))
    try:
        assert shape(r.lost(target, ITEM)) == expected
    finally:
        await retry.close()


@pytest.mark.parametrize(("target", "expected"), [(DROPPED, (BEGINS, Fail)), (MOVING, (Hold, Fail)), (GOODBYE, Fail)])
def test_a_frame_a_connection_here_refused_waits_for_its_client_else_fails(target: str, expected: Any) -> None:
    r, _ = router(window=6.0)
    peer = r.peers.get(target) or connection(target, FakeClock())
    done = r.refused(peer, ITEM)
    assert shape(done) == expected
    assert getattr(done, "target", None) == peer.id


@pytest.mark.parametrize(("target", "expected"), [(DROPPED, (BEGINS, Deliver)), (GOODBYE, Deliver)])
def test_a_call_relayed_to_a_connection_that_just_ended_waits_for_its_client_else_bounces(
    target: str, expected: Any
) -> None:
    r, _ = router(window=6.0)
    r.peers[CALLER] = connection(CALLER, FakeClock())  # the caller is here: it is told at once
    call = envelope.encode({"type": "method", "to": target, "from": CALLER, "method": "services.s.f", "session": "s9"})
    assert shape(r.relayed(r.peers[target], call)) == expected


@pytest.mark.parametrize(("claimed", "expected"), [(True, RetryLater), (False, Fail)])
def test_a_client_some_replica_claims_is_retried_and_one_nobody_claims_fails(claimed: bool, expected: Any) -> None:
    r, _ = router(window=6.0)
    done = r.claim_read(AWAY, ITEM, claimed=claimed)
    assert type(done) is expected
    assert (done.target, done.item) == (AWAY, ITEM)


def test_a_managers_call_held_for_a_client_that_comes_back_here_reaches_it_unwrapped() -> None:
    """Another replica's manager called a client whose connection here had just dropped: the call is
    held wrapped with its origin (sent on, it still finds its way back). If the client comes back
    here, it gets the call as hypha-rpc reads it, and its reply finds the manager that called."""
    r, _ = router(window=6.0)
    call = envelope.encode({"type": "method", "to": DROPPED, "from": "*/manager-b", "method": "s.f", "session": "m1"})
    wrapped = replica_wire.wrap_manager_call("replica-b", "m1", call)
    held = r.relayed(r.peers[DROPPED], wrapped)
    assert type(held) is Hold
    assert held.begins

    r.peers[DROPPED] = back = connection(LIVE, FakeClock())  # the client's new connection, here
    delivered = r.toward(DROPPED, held.item)

    assert type(delivered) in (Deliver, Send)
    assert delivered.peer is back
    frame = delivered.item.frame if type(delivered) is Deliver else delivered.message
    assert frame == call, "the client gets the call itself, not the replicas' wrapping around it"
    assert r.reply_routes.origin_of("m1") == "replica-b"

"""Balanced calls across replicas, as the router's decisions (issue 41).

Synchronous, no I/O. A call through a handle with no pool here (its caller
made it on another replica) asks the hub to bind it first (:class:`BindFirst`);
the caller's later calls wait for the bind, a bounded number; the bind's end
routes them again, or answers each with the lookup's error. Nothing here looks
anything up: the lookup is the caller's own, made by the manager
(tests/security/test_balanced_trust.py, tests/cluster/test_balanced_across_replicas.py).

A balanced call that reached its instance's replica as the instance left comes
back undelivered: it goes to another instance whatever its idempotency, and
fails with the clear error only when none is left.
"""

from __future__ import annotations

from typing import Any

import pytest

from support.wire import Wire
from switchboard.config import Settings
from switchboard.hub.identity.users import Permission, User
from switchboard.hub.routing import balance, binds
from switchboard.hub.routing.actions import BindFirst, Deliver, Forward, Send
from switchboard.hub.routing.router import Router
from switchboard.hub.sessions.in_transit import Transit
from switchboard.hub.sessions.peer import Peer
from switchboard.hub.transit.retry import RetryWindow
from switchboard.metrics import HubMetrics
from switchboard.protocol.hypha import envelope
from switchboard.protocol.link import replica_wire
from switchboard.testing.clock import FakeClock
from switchboard.testing.hub import settings_for_tests

WS = "ws-1"
HANDLE = balance.virtual_target(WS, balance.ROUND_ROBIN, "calc")
HERE, AWAY = f"{WS}/p-here", f"{WS}/p-away"  # an instance here, one on another replica


def _peer(client_id: str) -> Peer:
    user = User(id=f"user-{client_id}", grants={WS: Permission.READ_WRITE})
    return Peer(workspace=WS, client_id=client_id, user=user, transport=Wire(), max_queue_bytes=1 << 20)


async def _nobody(*_: Any) -> bool:
    return False


def _router(settings: Settings, peers: dict[str, Peer]) -> Router:
    clock = FakeClock()
    return Router(
        settings=settings,
        clock=clock,
        metrics=HubMetrics(settings.replica_id),
        peers=peers,
        aliases=set(),
        transit=Transit(clock=clock, grace=5.0),
        retry=RetryWindow(clock=clock, window=1.0, interval=0.1, publish=_nobody, give_up=lambda *_: None),
    )


class Replica:
    """A replica the caller came back to: its handle was made elsewhere; one instance is here."""

    def __init__(self) -> None:
        self.caller, self.instance = _peer("caller"), _peer("p-here")
        self.router = _router(settings_for_tests(), {self.caller.id: self.caller, HERE: self.instance})

    def call(self, session: str, to: str = HANDLE, method: str = "services.calc.who") -> Any:
        main = {"type": "method", "to": to, "method": method, "session": session}
        return self.router.route(self.caller, envelope.encode(main, b""))

    def bind(self, *instances: str) -> None:
        """What the manager's lookup does once it found the instances (BalancedLookups.bind)."""
        pool = balance.Pool(balance.ROUND_ROBIN, "calc", {i: frozenset() for i in instances})
        self.router.balanced.bind(self.caller.id, HANDLE, pool)


def _rejected(action: Any, session: str) -> str:
    assert isinstance(action, Send), action
    env = envelope.decode(action.message)
    assert env.main["method"] == f"{session}.reject"
    assert env.main["from"] == HANDLE  # the only sender the caller's hypha-rpc takes it from
    return bytes(env.rest).decode(errors="replace")


def test_a_call_through_a_handle_made_on_another_replica_asks_to_bind_it_first():
    r = Replica()
    assert r.call("s1") == BindFirst(r.caller, HANDLE)
    assert r.call("s2") is None  # waits for the same bind: asked once
    assert len(r.router.binds) == 2
    assert not r.router.inflight.pending(r.caller.id)  # nothing is in flight before it is routed


def test_once_bound_the_calls_that_waited_go_to_the_instances_in_their_order():
    r = Replica()
    r.call("s1"), r.call("s2")
    r.bind(HERE, AWAY)
    first, second = r.router.bound(r.caller, HANDLE, None)
    assert isinstance(first, Deliver)
    assert first.peer is r.instance
    assert envelope.decode(first.item.frame).main["to"] == HERE
    assert isinstance(second, Forward)
    assert second.target == AWAY
    assert len(r.router.binds) == 0
    assert r.router.balanced.has(r.caller.id, "s1")
    assert r.router.balanced.has(r.caller.id, "s2")
    assert isinstance(r.call("s3"), Deliver | Forward)  # bound: routed at once from now on


def test_a_failed_lookup_answers_every_waiting_call_at_once_with_its_error():
    r = Replica()
    r.call("s1"), r.call("s2")
    error = "Permission denied for non-public service: ws-1/calc"
    s1, s2 = r.router.bound(r.caller, HANDLE, error)
    assert error in _rejected(s1, "s1")
    assert error in _rejected(s2, "s2")
    assert r.router.balanced.pool(r.caller.id, HANDLE) is None
    assert r.call("s3") == BindFirst(r.caller, HANDLE)  # the next call asks again (the lookup is as it is then)


def test_calls_waiting_for_a_bind_are_bounded_and_the_one_over_fails_at_once_saying_retry():
    r = Replica()
    r.router.binds.limit = 3
    assert [r.call(f"s{n}") for n in range(3)] == [BindFirst(r.caller, HANDLE), None, None]
    over = r.call("s3")
    assert "Too many calls wait for the balanced handle" in _rejected(over, "s3")
    assert "retry" in _rejected(over, "s3")
    assert len(r.router.bound(r.caller, HANDLE, "gone")) == 3  # the three that waited, answered


def test_a_bind_that_left_no_pool_refuses_the_waiting_calls_instead_of_asking_again():
    r = Replica()
    r.call("s1")
    (refused,) = r.router.bound(r.caller, HANDLE, None)  # no pool: never loops back into BindFirst
    assert "could not be bound here" in _rejected(refused, "s1")


@pytest.mark.parametrize(
    ("to", "method", "session"),
    [
        (f"{WS}/balance|fastest|calc", "services.calc.who", "s1"),  # no such policy
        (f"{WS}/balance|round_robin|", "services.calc.who", "s1"),  # no name
        (HANDLE, "s9.resolve", None),  # not a call: a handle only takes calls
    ],
)
def test_what_is_not_a_call_through_a_well_formed_handle_is_refused_not_bound(to, method, session):
    r = Replica()
    main: dict[str, Any] = {"type": "method", "to": to, "method": method}
    if session:
        main["session"] = session
    action = r.router.route(r.caller, envelope.encode(main, b""))
    assert not isinstance(action, BindFirst)
    assert isinstance(action, Send)
    assert len(r.router.binds) == 0


@pytest.mark.parametrize(
    ("target", "parsed"),
    [
        (HANDLE, (WS, balance.ROUND_ROBIN, "calc")),
        (f"{WS}/balance|least_busy|a|b", (WS, balance.LEAST_BUSY, "a|b")),
        (f"{WS}/balance|least_busy", None),
        (f"{WS}/p0", None),
        ("/balance|round_robin|calc", None),
    ],
)
def test_a_virtual_target_carries_what_its_lookup_needs(target, parsed):
    assert binds.parse_virtual(target) == parsed


def _bounced_back(r: Replica, session: str, instance: str = AWAY) -> Any:
    """What the instance's replica sends back for a call that found its instance gone (Router._bounce):
    the reject that fails it unless another instance takes it (the caller's replica keeps the call)."""
    message = f"Target peer {instance} is not connected"
    reject = envelope.reject_frame(session=session, target=instance, caller=r.caller.id, message=message)
    return r.router.relayed(r.caller, replica_wire.wrap_bounced(instance, reject))


def _balanced_call_to_away(r: Replica, *instances: str) -> None:
    r.bind(*instances)
    sent = r.call("s1", method="services.calc.add")  # round robin: the first instance bound
    assert isinstance(sent, Forward)
    assert sent.target == AWAY


@pytest.mark.parametrize("idempotent", [False, True])
def test_a_balanced_call_that_found_its_instance_gone_goes_to_another_whatever_its_idempotency(idempotent):
    r = Replica()
    _balanced_call_to_away(r, AWAY, HERE)
    if idempotent:
        r.router.balanced.pool(r.caller.id, HANDLE).instances[HERE] = frozenset({"add"})
    resent = _bounced_back(r, "s1")
    assert isinstance(resent, Deliver)
    assert resent.peer is r.instance
    assert envelope.decode(resent.item.frame).main["to"] == HERE
    assert r.router.balanced.failovers == 1


def test_a_balanced_call_that_found_its_instance_gone_fails_clearly_when_no_instance_is_left():
    r = Replica()
    _balanced_call_to_away(r, AWAY)
    refused = _bounced_back(r, "s1")
    assert isinstance(refused, Deliver)
    assert refused.peer is r.caller
    env = envelope.decode(refused.item.frame)
    assert env.main["from"] == HANDLE
    assert "no other instance is left to take it" in bytes(env.rest).decode(errors="replace")
    assert not r.router.balanced.has(r.caller.id, "s1")
    assert not r.router.inflight.pending(r.caller.id)


def test_a_direct_call_that_found_its_callee_gone_fails_now_as_before():
    r = Replica()
    failed = _bounced_back(r, "d1", instance=f"{WS}/direct")
    assert isinstance(failed, Deliver)
    assert failed.peer is r.caller
    assert "Target peer ws-1/direct is not connected" in bytes(envelope.decode(failed.item.frame).rest).decode(
        errors="replace"
    )


def test_a_balanced_call_already_sent_elsewhere_ignores_a_late_bounce():
    r = Replica()
    _balanced_call_to_away(r, AWAY, HERE)
    _bounced_back(r, "s1")
    assert _bounced_back(r, "s1") is None  # its instance is HERE now: the call goes on there


ELSEWHERE_CALLER = f"{WS}/far-caller"  # a caller on another replica


def test_a_balanced_call_crossing_replicas_carries_its_handle_and_its_answer_leaves_labelled():
    """The instance's replica labels the instance's answer with the handle as it leaves, so the
    caller's hypha-rpc takes it wherever the caller is by then (it may have moved replicas)."""
    r = Replica()
    r.bind(AWAY)
    sent = r.call("s1")
    assert isinstance(sent, Forward)
    handle, call = replica_wire.unwrap_balanced(sent.wire)
    assert handle == HANDLE
    assert envelope.decode(call).main["to"] == AWAY

    there = Replica()  # the instance's replica: the call comes off the bus
    main = {"type": "method", "from": ELSEWHERE_CALLER, "to": HERE, "method": "services.calc.who", "session": "s1"}
    delivered = there.router.relayed(there.instance, replica_wire.wrap_balanced(HANDLE, envelope.encode(main, b"")))
    assert isinstance(delivered, Send)
    assert envelope.decode(delivered.message).main == main  # the instance gets the call as hypha-rpc sent it
    stranger = _peer("stranger")
    for sender, labelled in ((stranger, False), (there.instance, True)):
        answer = {"type": "method", "to": ELSEWHERE_CALLER, "method": "s1.resolve"}
        out = there.router.route(sender, envelope.encode(answer, b""))
        assert isinstance(out, Forward)
        assert (envelope.decode(out.item.frame).main["from"] == HANDLE) is labelled
    assert len(there.router.served) == 0  # gone with the answer

"""The balanced handle's choice of instance and its failover, as pure decisions (issue 41).

Policy × instances joining, leaving or in transit × calls in flight: the
instance each call goes to, and what becomes of a call whose instance died.
"""

from __future__ import annotations

import collections

import pytest

from switchboard.hub.routing import balance
from switchboard.hub.routing.balance import LEAST_BUSY, ROUND_ROBIN, Balanced, Pool, Refuse, Resend, choose

A, B, C, D = "ws/a", "ws/b", "ws/c", "ws/d"
HANDLE = balance.virtual_target("ws", ROUND_ROBIN, "calc")


@pytest.mark.parametrize(
    ("policy", "instances", "loads", "avoid", "cursor", "expected"),
    [
        (ROUND_ROBIN, [A, B, C], {}, (), 0, A),
        (ROUND_ROBIN, [A, B, C], {}, (), 1, B),
        (ROUND_ROBIN, [A, B, C], {}, (), 5, C),
        (ROUND_ROBIN, [A, B, C], {A: 9}, (), 0, A),  # round robin ignores the load
        (ROUND_ROBIN, [A, B, C], {}, (A,), 0, B),  # one in transit (or already tried) is skipped
        (ROUND_ROBIN, [A, B, C], {}, (A, B, C), 0, None),  # none left
        (ROUND_ROBIN, [], {}, (), 0, None),  # every instance left
        (LEAST_BUSY, [A, B, C], {A: 3, B: 1, C: 2}, (), 0, B),
        (LEAST_BUSY, [A, B, C], {A: 3, B: 1, C: 2}, (B,), 0, C),
        (LEAST_BUSY, [A, B, C], {A: 1, B: 0, C: 0}, (), 0, B),  # ties taken in turn
        (LEAST_BUSY, [A, B, C], {A: 1, B: 0, C: 0}, (), 1, C),
        (LEAST_BUSY, [A, B, C, D], {A: 2, B: 2, C: 2}, (), 7, D),  # a newcomer has no calls yet
    ],
)
def test_the_instance_a_call_goes_to(policy, instances, loads, avoid, cursor, expected):
    pick, _ = choose(policy, instances, cursor=cursor, loads=loads, avoid=avoid)
    assert pick == expected


def test_round_robin_shares_calls_equally_as_instances_join_and_leave():
    b = Balanced()
    b.bind("caller", HANDLE, Pool(ROUND_ROBIN, "calc", {A: frozenset(), B: frozenset()}))
    first = collections.Counter(b.pick("caller", HANDLE, lambda _: 0) for _ in range(100))
    assert first == {A: 50, B: 50}
    b.refreshed("caller", HANDLE, {A: frozenset(), B: frozenset(), C: frozenset()})  # one joins
    second = collections.Counter(b.pick("caller", HANDLE, lambda _: 0) for _ in range(300))
    assert second == {A: 100, B: 100, C: 100}
    b.refreshed("caller", HANDLE, {B: frozenset(), C: frozenset()})  # one leaves (or drains away)
    third = collections.Counter(b.pick("caller", HANDLE, lambda _: 0) for _ in range(100))
    assert third == {B: 50, C: 50}


def test_least_busy_follows_the_calls_in_flight():
    b = Balanced()
    b.bind("caller", HANDLE, Pool(LEAST_BUSY, "calc", {A: frozenset(), B: frozenset()}))
    in_flight = {A: 0, B: 0}
    picks = []
    for n in range(6):
        pick = b.pick("caller", HANDLE, in_flight.__getitem__)
        picks.append(pick)
        in_flight[pick] += 1
        if n % 2 == 1:
            in_flight[A] = max(0, in_flight[A] - 1)  # A answers fast, B never does
    assert picks.count(A) > picks.count(B)


def test_a_handle_is_its_callers_alone():
    b = Balanced()
    b.bind("caller", HANDLE, Pool(ROUND_ROBIN, "calc", {A: frozenset()}))
    assert b.pick("other", HANDLE, lambda _: 0) is None


def test_an_idempotent_call_whose_instance_died_is_resent_to_another_once_per_instance():
    b = Balanced()
    b.bind("caller", HANDLE, Pool(ROUND_ROBIN, "calc", {i: frozenset({"get"}) for i in (A, B, C)}))
    b.opened("caller", "s1", HANDLE, A, "get", b"frame")
    step = b.failed("caller", "s1", A)
    assert isinstance(step, Resend)
    assert step.instance in (B, C)
    assert step.frame == b"frame"
    second = b.failed("caller", "s1", step.instance)
    assert isinstance(second, Resend)
    assert second.instance not in (A, step.instance)
    last = b.failed("caller", "s1", second.instance)  # every instance tried: the call fails, saying why
    assert isinstance(last, Refuse)
    assert "no other instance is left" in last.message
    assert last.target == HANDLE
    assert not b.has("caller", "s1")
    assert b.failovers == 2


def test_a_call_not_declared_idempotent_fails_at_once_naming_the_rule():
    b = Balanced()
    b.bind("caller", HANDLE, Pool(ROUND_ROBIN, "calc", {A: frozenset({"get"}), B: frozenset({"get"})}))
    b.opened("caller", "s1", HANDLE, A, "add", b"frame")
    (step,) = b.gone(A)
    assert isinstance(step, Refuse)
    assert "not re-sent: the service does not declare add idempotent" in step.message
    assert step.target == HANDLE  # the caller's hypha-rpc takes the refusal only from the handle


def test_an_instance_dropped_from_the_handle_has_its_calls_failed_over():
    b = Balanced()
    b.bind("caller", HANDLE, Pool(ROUND_ROBIN, "calc", {A: frozenset({"get"}), B: frozenset({"get"})}))
    b.opened("caller", "s1", HANDLE, A, "get", b"f1")
    b.opened("caller", "s2", HANDLE, B, "get", b"f2")
    steps = b.refreshed("caller", HANDLE, {B: frozenset({"get"})})
    assert steps == [Resend("caller", "s1", B, b"f1")]


def test_replies_within_a_balanced_call_come_from_the_handle_and_only_from_its_instance():
    b = Balanced()
    b.bind("caller", HANDLE, Pool(ROUND_ROBIN, "calc", {A: frozenset(), B: frozenset()}))
    b.opened("caller", "s1", HANDLE, A, "add", b"frame")
    assert b.relabel("caller", "s1.resolve", A) == HANDLE
    assert b.relabel("caller", "s1.heartbeat", A) == HANDLE
    assert b.relabel("caller", "s1.resolve", B) is None  # another instance may not answer it
    assert b.relabel("caller", "s2.resolve", A) is None
    b.closed("caller", "s1")
    assert b.relabel("caller", "s1.resolve", A) is None
    assert len(b) == 0


def test_a_caller_that_leaves_takes_its_handles_and_calls_with_it():
    b = Balanced()
    b.bind("caller", HANDLE, Pool(ROUND_ROBIN, "calc", {A: frozenset()}))
    b.opened("caller", "s1", HANDLE, A, "add", b"frame")
    b.forget_caller("caller")
    assert len(b) == 0
    assert b.pools() == []
    assert b.gone(A) == []


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("balance:round_robin", ROUND_ROBIN), ("balance:least_busy", LEAST_BUSY), ("random", None), (None, None)],
)
def test_the_balance_modes_are_exactly_two(mode, expected):
    assert balance.policy_of(mode) == expected


def test_an_unknown_balance_policy_is_refused():
    with pytest.raises(ValueError, match="balance:round_robin' or 'balance:least_busy"):
        balance.policy_of("balance:random")


def test_a_call_that_reached_no_replica_goes_elsewhere_at_once_idempotent_or_not():
    b = Balanced()
    b.bind("caller", HANDLE, Pool(ROUND_ROBIN, "calc", {A: frozenset(), B: frozenset()}))
    b.opened("caller", "s1", HANDLE, A, "add", b"frame")  # not idempotent, but it never ran
    step = b.undelivered("caller", "s1", A, now=10.0)
    assert step == Resend("caller", "s1", B, b"frame")
    assert b.suspects(10.0 + balance.SUSPECT_FOR - 0.1) == {A}  # new calls keep away from it a while
    assert b.suspects(10.0 + balance.SUSPECT_FOR) == set()


def test_calls_in_flight_to_an_instance_a_later_call_could_not_reach_are_failed_over_at_once():
    b = Balanced()
    b.bind("caller", HANDLE, Pool(ROUND_ROBIN, "calc", {A: frozenset({"get"}), B: frozenset({"get"})}))
    b.opened("caller", "running-get", HANDLE, A, "get", b"g")
    b.opened("caller", "running-add", HANDLE, A, "add", b"a")
    b.opened("caller", "new", HANDLE, A, "add", b"n")
    assert b.undelivered("caller", "new", A, now=0.0) == Resend("caller", "new", B, b"n")
    steps = {s.session: s for s in b.stranded(now=0.1)}
    assert steps["running-get"] == Resend("caller", "running-get", B, b"g")
    assert isinstance(steps["running-add"], Refuse)
    assert "not re-sent" in steps["running-add"].message


def test_a_call_nobody_could_be_given_is_sent_elsewhere_even_if_not_idempotent():
    b = Balanced()
    b.bind("caller", HANDLE, Pool(ROUND_ROBIN, "calc", {A: frozenset(), B: frozenset()}))
    b.opened("caller", "s1", HANDLE, A, "add", b"frame")
    assert b.failed("caller", "s1", A) == Resend("caller", "s1", B, b"frame")

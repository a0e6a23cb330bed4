"""The transit state on the fake clock: frames held, handed out once, the departure due only at the grace's end.

Synchronous: :class:`~switchboard.hub.sessions.in_transit.Transit` does no I/O and reads
time only from the injected clock.
"""

from __future__ import annotations

from switchboard.hub.sessions.in_transit import Transit
from switchboard.testing.clock import FakeClock

GRACE = 5.0
C = "ws-1/prov"


def transit(clock: FakeClock, **kw: object) -> Transit[str]:
    return Transit(clock=clock, grace=GRACE, **kw)  # type: ignore[arg-type]


def test_frames_for_a_client_in_transit_are_held_and_handed_out_in_order_when_it_is_back() -> None:
    clock = FakeClock()
    t = transit(clock)
    assert not t.hold(C, "before")  # not in transit: route (or fail) it as usual
    assert t.left(C)
    for frame in ("f1", "f2", "f3"):
        clock.advance(0.01)
        assert t.hold(C, frame)
    assert t.holding == 3
    clock.advance(0.02)
    back = t.back(C)
    assert back is not None
    assert back.frames == ["f1", "f2", "f3"]
    assert abs(back.away - 0.05) < 1e-9
    assert abs(back.longest_wait - 0.04) < 1e-9  # f1 waited from 0.01 to 0.05
    assert t.holding == 0
    assert C not in t


def test_nothing_is_handed_out_twice() -> None:
    clock = FakeClock()
    t = transit(clock)
    t.left(C)
    t.hold(C, "f1")
    assert t.back(C) is not None
    assert t.back(C) is None  # a second "back" notice
    assert t.expire(C) is None  # nor at the grace's end
    assert t.cancel(C) is None
    clock.advance(GRACE + 1)
    assert t.due() == []
    t.left(C)  # it left again: a new transit, with nothing of the old one
    assert t.back(C).frames == []  # type: ignore[union-attr]


def test_the_departure_is_withheld_during_the_grace_and_due_at_its_end() -> None:
    clock = FakeClock()
    t = transit(clock)
    t.left(C)
    t.hold(C, "call")
    clock.advance(GRACE - 0.001)
    assert t.due() == []  # not announced yet: it may still come back
    clock.advance(0.001)
    assert t.due() == [C]
    assert t.due() == [C]  # due until the hub ends it (the registry decides who announces)
    gone = t.expire(C)
    assert gone is not None
    assert gone.frames == ["call"]  # to fail now: "not connected"
    assert t.expired_total == 1
    assert t.due() == []
    assert t.expire(C) is None


def test_a_client_back_within_the_grace_is_never_due() -> None:
    clock = FakeClock()
    t = transit(clock)
    t.left(C)
    clock.advance(GRACE / 2)
    t.back(C)
    clock.advance(GRACE)
    assert t.due() == []
    assert t.expired_total == 0


def test_a_second_notice_of_the_same_departure_does_not_extend_the_grace() -> None:
    clock = FakeClock()
    t = transit(clock)
    assert t.left(C)
    clock.advance(3.0)
    assert not t.left(C)  # e.g. the bus notice of a departure this replica saw itself
    clock.advance(GRACE - 3.0)
    assert t.due() == [C]


def test_another_replicas_notice_carries_the_grace_left_and_the_registry_may_extend_it() -> None:
    clock = FakeClock()
    t = transit(clock)
    t.left(C, remaining=1.0)
    assert t.deadline(C) == 1.0
    clock.advance(1.0)
    assert t.due() == [C]
    t.extend(C, 0.5)  # the registry's clock says: not yet
    assert t.due() == []
    clock.advance(0.5)
    assert t.due() == [C]


def test_holding_is_bounded_per_client_by_count_and_bytes() -> None:
    clock = FakeClock()
    t = transit(clock, max_frames=2, max_bytes=100)
    t.left(C)
    assert t.hold(C, "a", size=10)
    assert t.hold(C, "b", size=10)
    assert not t.hold(C, "c", size=10)  # third frame: its caller fails at once
    t.left("ws-1/other")
    assert t.hold("ws-1/other", "x", size=100)
    assert not t.hold("ws-1/other", "y", size=1)
    assert t.refused_total == 2


def test_a_frame_that_was_already_on_its_way_goes_first() -> None:
    clock = FakeClock()
    t = transit(clock)
    t.left(C)
    t.hold(C, "held later")
    t.hold(C, "queued before the close", first=True)
    assert t.back(C).frames == ["queued before the close", "held later"]  # type: ignore[union-attr]


def test_next_deadline_and_holders() -> None:
    clock = FakeClock()
    t = transit(clock)
    assert t.next_deadline() is None
    t.left("ws-1/a")
    clock.advance(1.0)
    t.left("ws-1/b")
    t.hold("ws-1/b", "f")
    assert t.next_deadline() == GRACE
    assert t.holders() == ["ws-1/b"]
    assert t.since("ws-1/b") == 1.0
    assert len(t) == 2

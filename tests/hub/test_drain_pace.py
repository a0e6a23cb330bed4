"""A drain sends its clients away in waves the sibling can admit, and still everyone by its deadline."""

from __future__ import annotations

from switchboard.hub.drain_pace import DrainPace, InFlight


def pace(window: int = 100, total: int = 1000, timeout: float = 10.0) -> DrainPace:
    return DrainPace(window=window, patience=2.0, started=0.0, deadline=timeout, total=total)


def test_without_a_window_everyone_goes_at_once() -> None:
    assert pace(window=0).allowance(now=0.0, sent=0, in_flight=0) == 1000


def test_a_full_window_sends_nobody_more_until_some_are_back() -> None:
    p = pace()
    assert p.allowance(now=0.0, sent=0, in_flight=0) == 100
    assert p.allowance(now=0.1, sent=100, in_flight=100) == 0
    assert p.allowance(now=0.2, sent=100, in_flight=60) == 40


def test_the_schedule_overrides_a_window_that_stays_full() -> None:
    """Clients that never come back must not stretch the drain past its deadline."""
    p = pace()
    assert p.allowance(now=5.0, sent=100, in_flight=100) == 400  # half the time gone: half sent
    assert p.allowance(now=10.0, sent=500, in_flight=100) == 500  # at the deadline: all of them
    assert p.allowance(now=99.0, sent=1000, in_flight=0) == 0


def test_the_next_scheduled_one_is_due_in_proportion_to_the_time() -> None:
    p = pace(total=4, timeout=8.0)
    assert [p.next_due(sent) for sent in range(5)] == [0.0, 2.0, 4.0, 6.0, 8.0]


def test_never_more_than_are_left() -> None:
    assert pace(window=100, total=30).allowance(now=0.0, sent=0, in_flight=0) == 30
    assert pace(window=100, total=30).allowance(now=0.0, sent=30, in_flight=0) == 0


def test_a_client_counts_until_it_is_back_or_for_patience_seconds_at_most() -> None:
    flight = InFlight(patience=2.0)
    flight.add("ws/a", 0.0)
    flight.add("ws/b", 0.5)
    flight.add("ws/c", 1.0)
    assert flight.count(1.0) == 3
    flight.back("ws/b")
    assert flight.count(1.0) == 2
    assert flight.count(2.0) == 1  # a was sent 2 s ago and never came back: it no longer holds a place
    assert sorted(flight.flying()) == ["ws/c"]
    assert flight.count(3.0) == 0
    assert flight.sent == 3

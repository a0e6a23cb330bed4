"""A drain sends its clients away at the pace the sibling admits them, and whoever is left at its deadline."""

from __future__ import annotations

from switchboard.hub.transit.drain_pace import FLOOR, RATE_SPAN, TARGET_SHARE, DrainPace, SentAway


def pace(window: int = 100, total: int = 1000, timeout: float = 10.0, patience: float = 5.0) -> DrainPace:
    return DrainPace(window=window, patience=patience, started=0.0, deadline=timeout, total=total)


def test_without_a_window_everyone_goes_at_once() -> None:
    assert pace(window=0).allowance(now=0.0, sent=0, in_flight=0) == 1000


def test_a_full_window_sends_nobody_more_until_some_are_back() -> None:
    p = pace()
    assert p.allowance(now=0.0, sent=0, in_flight=0) == 100
    assert p.allowance(now=0.1, sent=100, in_flight=100) == 0
    assert p.allowance(now=0.2, sent=100, in_flight=60) == 40


def test_time_alone_sends_nobody_past_what_the_sibling_admits() -> None:
    """Issue 26: a schedule of everyone by the deadline sent 6,000 clients within 10 s to a sibling
    admitting a few hundred a second; thousands waited there past their grace and were announced gone."""
    p = pace()
    assert p.allowance(now=5.0, sent=100, in_flight=100) == 0  # half the time gone, the window still full
    assert p.allowance(now=9.9, sent=100, in_flight=100, rate=0.0) == 0


def test_whoever_is_left_at_the_deadline_goes_at_once() -> None:
    """The stop's budget (the orchestrator's grace period) holds, whatever the sibling admits."""
    p = pace()
    assert p.allowance(now=10.0, sent=500, in_flight=100, rate=0.0) == 500
    assert p.allowance(now=99.0, sent=1000, in_flight=0) == 0


def test_the_window_shrinks_to_what_the_sibling_admits_within_a_share_of_the_grace() -> None:
    """At 20 admissions a second, 100 in flight would wait 5 s there: the whole grace."""
    p = pace(window=200, patience=5.0)
    assert p.limit(None) == 200  # not measured yet: the configured window
    assert p.limit(20.0) == round(20.0 * 5.0 * TARGET_SHARE) == 40
    assert p.allowance(now=2.0, sent=300, in_flight=40, rate=20.0) == 0
    assert p.allowance(now=2.0, sent=300, in_flight=30, rate=20.0) == 10


def test_a_fast_sibling_gets_the_whole_window_and_a_stalled_one_the_floor() -> None:
    p = pace(window=200, patience=5.0)
    assert p.limit(1000.0) == 200
    assert p.limit(0.0) == FLOOR
    assert p.allowance(now=3.0, sent=500, in_flight=0, rate=0.0) == FLOOR  # never a standstill


def test_the_drain_says_early_how_much_its_timeout_lacks_at_the_sibling_s_pace() -> None:
    p = pace(total=6000, timeout=10.0)
    assert p.short_by(now=1.0, sent=200, rate=200.0) == 1.0 + 5800 / 200.0 - 10.0
    assert p.short_by(now=1.0, sent=200, rate=1000.0) == 0.0
    assert p.short_by(now=0.5, sent=0, rate=None) == 0.0


def test_never_more_than_are_left() -> None:
    assert pace(window=100, total=30).allowance(now=0.0, sent=0, in_flight=0) == 30
    assert pace(window=100, total=30).allowance(now=0.0, sent=30, in_flight=0) == 0


def test_a_client_counts_until_it_is_back_or_for_patience_seconds_at_most() -> None:
    flight = SentAway(patience=2.0)
    flight.add("ws/a", 0.0)
    flight.add("ws/b", 0.5)
    flight.add("ws/c", 1.0)
    assert flight.count(1.0) == 3
    flight.back("ws/b", 1.0)
    assert flight.count(1.0) == 2
    assert flight.count(2.0) == 1  # a was sent 2 s ago and never came back: it no longer holds a place
    assert sorted(flight.flying()) == ["ws/c"]
    assert flight.count(3.0) == 0
    assert flight.sent == 3


def test_the_admission_rate_is_the_backs_of_the_last_span_once_the_first_had_time() -> None:
    flight = SentAway(patience=5.0)
    for i in range(50):
        flight.add(f"ws/c{i}", 0.0)
    for i in range(30):
        flight.back(f"ws/c{i}", 0.2 + i * 0.01)
    assert flight.rate(0.5) is None  # half a second in: too early to call the sibling slow
    assert flight.rate(RATE_SPAN) == 30 / RATE_SPAN
    assert flight.rate(0.2 + 29 * 0.01 + RATE_SPAN + 0.001) == 0.0  # nobody back for a span
    flight.back("ws/c0", 2.0)  # twice back, or after it stopped counting: once
    flight.skip()
    assert flight.sent == 51

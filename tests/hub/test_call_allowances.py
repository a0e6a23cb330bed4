"""Per-caller rate and calls in flight (hub/routing/limits.py), on the fake clock."""

from __future__ import annotations

import math

import pytest

from switchboard.errors import RateLimited
from switchboard.hub.routing.limits import Allowance, Allowances, TokenBucket, address_key
from switchboard.testing.clock import FakeClock


def test_a_bucket_takes_several_tokens_at_once_or_none_and_says_when_they_will_be_there():
    clock = FakeClock()
    bucket = TokenBucket(rate=10, burst=20, clock=clock)
    assert bucket.take(15)
    assert not bucket.take(8), "5 left: 8 are not taken, and none is"
    assert bucket.wait(8) == pytest.approx(0.3)
    clock.advance(0.3)
    assert bucket.take(8)
    assert bucket.wait(21) == math.inf, "more than the burst never fits"


def test_a_caller_is_refused_past_its_calls_in_flight_until_some_end():
    allowances = Allowances(rate=1000, burst=1000, limit=10, clock=FakeClock())
    caller = allowances.of("address:10.0.0.1", "me")
    caller.admit(1)
    caller.admit(8)
    with pytest.raises(RateLimited, match=r"Too many calls in flight: me has 9, this request needs 2 more, at most 10"):
        caller.admit(2)
    caller.done(8)
    with caller.holding(9):
        assert caller.in_flight == 10
    assert caller.in_flight == 1


def test_a_caller_is_refused_past_its_rate_with_the_time_to_wait():
    clock = FakeClock()
    allowances = Allowances(rate=20, burst=40, limit=1000, clock=clock)
    caller = allowances.of("user:u", "user u")
    for _ in range(4):
        with caller.holding(9):  # a select: of 8 candidates and its request
            pass
    with pytest.raises(RateLimited, match=r"Rate limit exceeded: user u may make at most 20 calls/s") as refused:
        caller.admit(9)
    assert refused.value.retry_after == pytest.approx(0.25)  # 4 tokens left, 5 more at 20/s
    assert caller.in_flight == 0, "a refused request counts nothing"
    clock.advance(0.25)
    caller.admit(9)


def test_callers_are_counted_apart():
    allowances = Allowances(rate=1, burst=1, limit=1, clock=FakeClock())
    allowances.of("address:a", "a").admit(1)
    allowances.of("address:b", "b").admit(1)  # another address: a bound of its own
    with pytest.raises(RateLimited):
        allowances.of("address:a", "a").admit(1)


def test_idle_callers_are_forgotten_and_the_table_stays_bounded():
    clock = FakeClock()
    allowances = Allowances(rate=10, burst=10, limit=5, clock=clock, max_principals=3)
    busy = allowances.of("busy", "busy")
    busy.admit(1)
    allowances.of("idle", "idle").admit(1)
    allowances.of("idle", "idle").done(1)
    allowances.of("fresh", "fresh")
    clock.advance(1.0)  # every bucket full again
    allowances.of("newcomer", "newcomer").admit(1)  # the table was full: the idle ones go, the busy one stays
    assert len(allowances) == 2
    assert allowances.of("busy", "busy") is busy
    allowances.of("another", "another").admit(1)
    with pytest.raises(RateLimited, match="Too many callers at once"):
        allowances.of("one-too-many", "one-too-many")


def test_a_connections_allowance_takes_from_its_own_frame_rate():
    clock = FakeClock()
    frames = TokenBucket(rate=10, burst=20, clock=clock)
    asking = Allowance(frames, 1000, "ws/c")
    assert frames.take(15)  # frames the connection sent
    with pytest.raises(RateLimited, match="Rate limit exceeded: ws/c may make at most 10 calls/s"):
        asking.admit(8)
    clock.advance(0.3)
    with asking.holding(8):
        assert not frames.take(1), "its selection's calls used its frames"


def test_an_ipv6_host_is_one_caller_whichever_address_of_its_64_it_picks():
    assert address_key("2001:db8:1:2::1") == address_key("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert address_key("2001:db8:1:3::1") != address_key("2001:db8:1:2::1")
    assert address_key("127.0.0.1") == "127.0.0.1"
    assert address_key("::ffff:10.0.0.7") == "10.0.0.7"
    assert address_key("not-an-address") == "not-an-address"

"""A token bucket lets bursts through and holds the average to its rate."""

from __future__ import annotations

from switchboard.hub.routing.limits import TokenBucket
from switchboard.testing.clock import FakeClock


def test_a_full_bucket_allows_a_burst_then_refuses():
    clock = FakeClock()
    bucket = TokenBucket(rate=10, burst=5, clock=clock)
    assert [bucket.take() for _ in range(6)] == [True] * 5 + [False]


def test_the_bucket_refills_at_its_rate():
    clock = FakeClock()
    bucket = TokenBucket(rate=10, burst=5, clock=clock)
    for _ in range(5):
        bucket.take()
    clock.advance(0.25)  # 2.5 tokens
    assert [bucket.take() for _ in range(3)] == [True, True, False]


def test_a_long_pause_never_banks_more_than_the_burst():
    clock = FakeClock()
    bucket = TokenBucket(rate=100, burst=3, clock=clock)
    clock.advance(3600)
    assert sum(bucket.take() for _ in range(10)) == 3


def test_sustained_traffic_is_held_to_the_rate():
    clock = FakeClock()
    bucket = TokenBucket(rate=200, burst=50, clock=clock)
    allowed = 0
    for _ in range(10_000):  # 10 s of offers at 1,000/s
        clock.advance(0.001)
        allowed += bucket.take()
    assert 2000 <= allowed <= 2000 + 50 + 1

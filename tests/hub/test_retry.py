"""Frames that reached nobody wait in order for a bounded window, then fail their callers."""

from __future__ import annotations

import asyncio

from switchboard.hub.routing.undelivered import Undelivered
from switchboard.hub.transit.retry import RetryWindow
from switchboard.testing.clock import FakeClock


class FlakyRoute:
    """A target nobody hears until ``heals_at`` (fake seconds)."""

    def __init__(self, clock: FakeClock, heals_at: float) -> None:
        self.clock = clock
        self.heals_at = heals_at
        self.delivered: list[bytes] = []
        self.attempts = 0

    async def publish(self, target: str, frame: bytes, event: bool) -> bool:
        self.attempts += 1
        if self.clock.monotonic() >= self.heals_at:
            self.delivered.append(frame)
            return True
        return False


async def drain(window: RetryWindow) -> None:
    for _ in range(100_000):
        if not window._tasks:
            return
        await asyncio.sleep(0)
    raise AssertionError("retry tasks did not finish")


async def test_frames_are_delivered_in_order_once_the_route_heals_within_the_window():
    clock = FakeClock()
    route = FlakyRoute(clock, heals_at=5.0)  # e.g. the 5 s reconcile repairs the subscription
    failed: list[Undelivered] = []
    window = RetryWindow(
        clock=clock, window=6.0, interval=0.1, publish=route.publish, give_up=lambda t, item: failed.append(item)
    )
    for i in range(3):
        window.add("ws/c", Undelivered(f"f{i}".encode(), "s", "ws/caller"))
    assert window.pending("ws/c")
    await drain(window)
    assert route.delivered == [b"f0", b"f1", b"f2"]
    assert failed == []
    assert not window.pending("ws/c")
    assert 5.0 <= clock.monotonic() <= 5.2


async def test_a_window_shorter_than_the_repair_fails_every_caller_at_its_end():
    clock = FakeClock()
    route = FlakyRoute(clock, heals_at=5.0)
    failed: list[Undelivered] = []
    window = RetryWindow(
        clock=clock, window=4.0, interval=0.1, publish=route.publish, give_up=lambda t, item: failed.append(item)
    )
    window.add("ws/c", Undelivered(b"a", "s1", "ws/caller"))
    window.add("ws/c", Undelivered(b"b", None, "ws/caller"))
    await drain(window)
    assert route.delivered == []
    assert [item.frame for item in failed] == [b"a", b"b"]
    assert 4.0 <= clock.monotonic() <= 4.2, "gives up at the window's end, not later"


async def test_retries_are_paced_by_the_interval_not_a_busy_loop():
    clock = FakeClock()
    route = FlakyRoute(clock, heals_at=1e9)
    window = RetryWindow(clock=clock, window=2.0, interval=0.1, publish=route.publish, give_up=lambda t, item: None)
    window.add("ws/c", Undelivered(b"a", None, "x"))
    await drain(window)
    assert 20 <= route.attempts <= 22


async def test_a_queue_over_its_bound_fails_the_newest_frame_at_once():
    clock = FakeClock()
    route = FlakyRoute(clock, heals_at=1e9)
    failed: list[Undelivered] = []
    window = RetryWindow(
        clock=clock,
        window=1.0,
        interval=0.1,
        publish=route.publish,
        give_up=lambda t, item: failed.append(item),
        max_frames=2,
    )
    for name in (b"1", b"2", b"3"):
        window.add("ws/c", Undelivered(name, None, "x"))
    assert [i.frame for i in failed] == [b"3"]
    await window.close()


class StoppedClock(FakeClock):
    """Time that does not pass: a retry's pause ends only when it is woken."""

    async def sleep(self, seconds: float) -> None:
        await asyncio.Event().wait()


async def test_a_target_back_from_transit_is_tried_at_once_not_at_the_next_interval():
    clock = StoppedClock()
    route = FlakyRoute(clock, heals_at=1e9)
    window = RetryWindow(clock=clock, window=6.0, interval=1.0, publish=route.publish, give_up=lambda t, item: None)
    window.add("ws/c", Undelivered(b"a", "s", "ws/caller"))
    for _ in range(20):
        await asyncio.sleep(0)
    assert route.attempts == 1, "the first try failed; now it pauses"
    route.heals_at = 0.0  # the client reconnected somewhere
    window.wake("ws/c")
    await drain(window)
    assert route.delivered == [b"a"]
    assert route.attempts == 2


async def test_the_window_counts_from_the_last_frame_that_got_through_not_from_the_first_that_waited():
    """A queue that keeps moving (replies to another replica's manager all pass through it)
    gives a frame that stops getting through its whole window, however old the queue is."""
    clock = FakeClock()
    outcomes = iter([False] * 10 + [True] + [False] * 55 + [True])  # through after 1 s; then 5.5 s more
    delivered: list[bytes] = []
    failed: list[Undelivered] = []

    async def publish(target: str, frame: bytes, event: bool) -> bool:
        if next(outcomes):
            delivered.append(frame)
            return True
        return False

    window = RetryWindow(
        clock=clock, window=6.0, interval=0.1, publish=publish, give_up=lambda t, item: failed.append(item)
    )
    window.add("rb", Undelivered(b"first", None, ""))
    window.add("rb", Undelivered(b"second", None, ""))
    await drain(window)
    assert delivered == [b"first", b"second"]
    assert failed == []

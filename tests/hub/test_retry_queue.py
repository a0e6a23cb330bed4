"""When a retry window gives a target's frames up: the rules of :class:`RetryQueue`, as tables.

A row is what the window's tries turned up, in order, on the hub's clock
(``reached at T``: the head reached the target at T; ``nobody at T``: a try
at T reached nobody), the bound the target's transit or a drain sets
(``held_until``), and what follows the last try: ``wait`` (try again after
the interval) or the frames that fail now. Nothing awaits: the window only
publishes, sleeps and fails what it is told.
"""

from __future__ import annotations

import pytest

from switchboard.hub.routing.actions import Fail
from switchboard.hub.routing.retry_queue import RetryQueue
from switchboard.hub.routing.undelivered import Undelivered

TARGET = "ws-1/away"
WINDOW = 6.0


def item(session: str) -> Undelivered:
    return Undelivered(session.encode(), session, "ws-1/caller")


def outcome(failed: list[Fail] | None) -> str:
    return "wait" if failed is None else "fail " + " ".join(str(f.item.session) for f in failed)


# the window × the tries so far × the bound of a transit or a drain → after the last try
TRIES = [
    ("within the window: tried again", WINDOW, ["nobody at 5.9"], None, "wait"),
    ("the window over: every waiting frame fails, in order", WINDOW, ["nobody at 6"], None, "fail a b c"),
    ("a client in transit: waited for until its grace ends", WINDOW, ["nobody at 6"], 8.0, "wait"),
    ("its grace over too: fails", WINDOW, ["nobody at 6", "nobody at 8"], 8.0, "fail a b c"),
    ("a bound before the window's end changes nothing", WINDOW, ["nobody at 3"], 2.0, "wait"),
    ("a success starts the window again", WINDOW, ["reached at 5", "nobody at 10.9"], None, "wait"),
    ("... for the frames behind it", WINDOW, ["reached at 5", "nobody at 11"], None, "fail b c"),
    ("no window: the first try that reaches nobody fails them", 0.0, ["nobody at 0"], None, "fail a b c"),
    ("no window, but in transit: waits for the grace", 0.0, ["nobody at 0"], 5.0, "wait"),
]


@pytest.mark.parametrize(("rule", "window", "tries", "held_until", "after"), TRIES, ids=[row[0] for row in TRIES])
def test_a_targets_frames_wait_while_its_window_or_its_bound_lasts_then_fail_together(
    rule: str, window: float, tries: list[str], held_until: float | None, after: str
) -> None:
    queue = RetryQueue(TARGET, window=window, max_frames=10)
    for session in "abc":
        assert queue.add(item(session)) is None
    queue.begin(0.0)
    failed: list[Fail] | None = None
    for attempt in tries:
        what, _, at = attempt.partition(" at ")
        head = queue.head
        assert head is not None
        if what == "reached":
            queue.reached(head, float(at))
        else:
            failed = queue.unreached(float(at), held_until)
    assert outcome(failed) == after
    if failed is not None:
        assert len(queue) == 0
        assert queue.head is None


# frames already waiting × the queue's bound → what adding one more does
OVERFLOW = [
    (0, 2, "kept"),
    (1, 2, "kept"),
    (2, 2, "fail new"),  # full: its caller is told at once
]


@pytest.mark.parametrize(("waiting", "max_frames", "after"), OVERFLOW)
def test_a_frame_that_finds_its_targets_queue_full_fails_at_once(waiting: int, max_frames: int, after: str) -> None:
    queue = RetryQueue(TARGET, window=WINDOW, max_frames=max_frames)
    for n in range(waiting):
        queue.add(item(f"old{n}"))
    refused = queue.add(item("new"))
    assert ("kept" if refused is None else f"fail {refused.item.session}") == after
    assert len(queue) == min(waiting + 1, max_frames)


def test_a_target_known_gone_fails_every_waiting_frame_in_order_once() -> None:
    queue = RetryQueue(TARGET, window=WINDOW, max_frames=10)
    for session in "ab":
        queue.add(item(session))
    assert outcome(queue.gone()) == "fail a b"
    assert queue.gone() == []


def test_a_head_that_reached_its_target_after_the_queue_was_failed_takes_nothing_else_with_it() -> None:
    """:meth:`RetryQueue.gone` may empty the queue while the head's publish is under way."""
    queue = RetryQueue(TARGET, window=WINDOW, max_frames=10)
    queue.add(item("a"))
    head = queue.head
    assert head is not None
    queue.gone()
    queue.add(item("b"))
    queue.reached(head, 1.0)
    assert [f.session for f in queue.frames] == ["b"]

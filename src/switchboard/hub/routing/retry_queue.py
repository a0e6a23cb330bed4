"""One target's frames in a retry window, and when they are given up: decisions as values, without I/O.

The retry window (:mod:`switchboard.hub.transit.retry`) publishes the head of
a :class:`RetryQueue` and sleeps between tries; what a try turned up (it
reached the target or nobody, at which time, until when the target's
transit or a drain may keep its frames) is reported here as a fact, and the
answer is the frames that fail now (:class:`~switchboard.hub.routing.actions.Fail`:
their callers are told "not connected"), or ``None``: try again after the
interval. A frame that finds its target's queue full fails at once (the
overflow).

Nothing here awaits: every rule is a row of a synchronous table
(``tests/hub/test_retry_queue.py``).
"""

from __future__ import annotations

from collections import deque

from switchboard.hub.routing.actions import Fail
from switchboard.hub.routing.undelivered import Undelivered


class RetryQueue:
    """The frames for ``target`` that reached nobody yet, in order, and until when they wait.

    The window (``window`` seconds) runs from the first try, and again from
    each try that reached the target: it bounds how long the target may stay
    unreachable, not how long a frame waits behind others.
    """

    __slots__ = ("target", "window", "max_frames", "frames", "deadline")

    def __init__(self, target: str, *, window: float, max_frames: int) -> None:
        self.target = target
        self.window = window
        self.max_frames = max_frames
        self.frames: deque[Undelivered] = deque()
        self.deadline: float | None = None  # set by the first try (begin)

    def __len__(self) -> int:
        return len(self.frames)

    @property
    def head(self) -> Undelivered | None:
        """The frame to try next; ``None``: nothing waits."""
        return self.frames[0] if self.frames else None

    def add(self, item: Undelivered) -> Fail | None:
        """Behind the frames already waiting; a :class:`Fail` for it if the queue is full."""
        if len(self.frames) >= self.max_frames:
            return Fail(self.target, item)
        self.frames.append(item)
        return None

    def begin(self, now: float) -> None:
        """The first try is made at ``now``: the window runs from here."""
        self.deadline = now + self.window

    def reached(self, head: Undelivered, now: float) -> None:
        """``head`` reached the target at ``now``: it leaves the queue (unless :meth:`gone` emptied it
        meanwhile), and the window starts again."""
        if self.frames and self.frames[0] is head:
            self.frames.popleft()
        self.deadline = now + self.window

    def unreached(self, now: float, held_until: float | None) -> list[Fail] | None:
        """A try at ``now`` reached nobody: once the window is over, and the bound the target's transit
        or a drain sets (``held_until``) too, every waiting frame fails (the list); else ``None``,
        try again after the interval."""
        deadline = now + self.window if self.deadline is None else self.deadline
        if now >= max(deadline, held_until or deadline):
            return self.gone()
        return None

    def gone(self) -> list[Fail]:
        """The target is known to be gone: every waiting frame fails now."""
        failed = [Fail(self.target, item) for item in self.frames]
        self.frames.clear()
        return failed

    def __repr__(self) -> str:
        return f"RetryQueue({self.target!r}, frames={len(self.frames)}, deadline={self.deadline})"

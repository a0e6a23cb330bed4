"""When Redis last answered, and how long a patient command may still wait (no I/O).

Every command of one client notes its answer here; a command made for a
client's request (:mod:`switchboard.backends.patience`) gives up once Redis
has been silent for its patience, counted from when it started or from
Redis's last answer to anyone, whichever is later. A Redis that answers
slowly but answers (a storm of connects queued on the pool) never trips it;
a Redis that answers nobody trips it after the patience exactly. Once one
command gave up, Redis is known silent: the next ones give it only
:data:`ONCE_SILENT` (a Redis that is back answers in milliseconds, and its
first answer ends the silence), so a request made during an outage fails at
once instead of each one waiting the whole patience. A check that comes
late (the event loop was held by other work) does not give up: what Redis
answered meanwhile may not have been read yet.
"""

from __future__ import annotations

#: Seconds late a check may come before it is taken for a held loop: then the answers it would
#: judge by may be waiting to be read, and it looks again this long after.
LATE = 0.1

#: Seconds a patient command waits for a Redis known silent: a Redis back answers within
#: milliseconds, even from another host, even on a loop that is busy.
ONCE_SILENT = 0.2


class Answers:
    """The last answer of one Redis client's connections, on the loop's clock."""

    def __init__(self) -> None:
        self.last = float("-inf")
        self.silent = False  # a command gave up since the last answer

    def heard(self, now: float) -> None:
        """A command got its answer at ``now``."""
        if now > self.last:
            self.last = now
        self.silent = False

    def gave_up(self) -> None:
        """A command waited its patience and heard nothing."""
        self.silent = True

    def give_up_at(self, started: float, patience: float) -> float:
        """When a command started at ``started`` gives up, as things stand; checked again then, since
        an answer may have come meanwhile (see the module docstring)."""
        if self.silent:
            return started + min(patience, ONCE_SILENT)
        return max(started, self.last) + patience

    def next_check(self, started: float, patience: float, *, now: float, planned: float) -> float | None:
        """At ``now``, a check planned for ``planned`` of a command started at ``started``: when to look
        again, or ``None``: give up now."""
        at = self.give_up_at(started, patience)
        if now < at:
            return at
        if now - planned > LATE:
            return now + LATE
        return None

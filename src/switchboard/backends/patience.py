"""How long a client's request may wait for a shared backend that has stopped answering.

A replica cut off from Redis (a partition, a dead NAT entry: no error, no
close) would hold each client's lookup, listing, HTTP call or admission for
the whole command timeout (2 s, more with a retry), while the client waits
for an answer that a healthy replica would give in milliseconds. The entry
points of the requests clients make (the manager's door, the HTTP routes, a
connection's admission) run them within :func:`patience`: a backend command
made for them gives up, with a retryable error, once the backend has said
nothing for that long, to this command or any other. Redis busy with a storm
keeps answering someone, so a command queued behind the storm keeps
waiting; the replica's own work (recovery, presence, clean-ups) runs outside
and keeps the full command timeout.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

#: Seconds of the backend's silence a client's request waits through (see the module docstring):
#: under the 1 s in which a request is answered while Redis is away, far above a command's
#: milliseconds on a loaded Redis (which keeps answering other commands meanwhile).
CONTROL_PATIENCE = 0.75

#: Why a command gave up (a store's ``BackendError`` carries it, and says to retry).
UNANSWERED = "Redis has not answered for {:g} s"

_PATIENCE: ContextVar[float | None] = ContextVar("switchboard_backend_patience", default=None)


@contextmanager
def patience(seconds: float = CONTROL_PATIENCE) -> Iterator[None]:
    """Backend commands made within (and by tasks started within) give up after ``seconds`` of silence."""
    if not seconds > 0:
        raise ValueError(f"patience must be above 0 s, got {seconds!r}")
    token = _PATIENCE.set(seconds)
    try:
        yield
    finally:
        _PATIENCE.reset(token)


def current_patience() -> float | None:
    """The patience of the request being served (``None``: the replica's own work, no bound but the command's)."""
    return _PATIENCE.get()

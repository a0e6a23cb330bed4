"""Connection events the application can observe: pass ``on_event`` to :func:`connect`.

Each event is a frozen value; ``kind`` names it for a ``match`` or a log.
A handler may be a plain function or a coroutine function; it runs without
blocking the reconnect loop and its exceptions are logged, never raised.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import ClassVar

from switchboard.client.errors import GaveUp, Refused


@dataclass(frozen=True, slots=True)
class Disconnected:
    """An established connection ended; reconnection starts at once."""

    kind: ClassVar[str] = "disconnected"
    url: str
    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class Reconnecting:
    """Attempt number ``attempt`` of the outage will dial ``url`` after ``delay`` s.

    ``elapsed`` counts from the outage's first failed attempt (0 before any),
    ``remaining`` is what is left of ``max_wait`` then; ``error`` is the
    failure that led here (``None`` for the first attempt after a drop).
    """

    kind: ClassVar[str] = "reconnecting"
    attempt: int
    url: str
    delay: float
    elapsed: float
    remaining: float
    error: BaseException | None


@dataclass(frozen=True, slots=True)
class Reconnected:
    """Back on ``url`` with the same client id and workspace, services re-registered."""

    kind: ClassVar[str] = "reconnected"
    url: str
    attempts: int
    outage_seconds: float
    remaining: float


@dataclass(frozen=True, slots=True)
class GivingUp:
    """The client stopped for good; pending and new calls raise ``error``."""

    kind: ClassVar[str] = "gave_up"
    error: GaveUp | Refused


Event = Disconnected | Reconnecting | Reconnected | GivingUp
EventHandler = Callable[[Event], Awaitable[None] | None]

"""Connection events the application can observe: pass ``on_event`` to :func:`connect`.

Each event is a frozen value; ``kind`` names it for a ``match`` or a log.
A handler may be a plain function or a coroutine function; it runs without
blocking the reconnect loop and its exceptions are logged, never raised.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from switchboard.errors import SwitchboardError


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
    """Back on ``url``: same client id and workspace, services re-registered, subscriptions restored.

    ``attempts`` counts the dials of the outage (this one included);
    ``outage_seconds`` runs from its first failed attempt (0 when the first
    attempt after the drop succeeded); ``remaining`` is the budget left.
    """

    kind: ClassVar[str] = "reconnected"
    url: str
    attempts: int
    outage_seconds: float
    remaining: float


@dataclass(frozen=True, slots=True)
class Rejoined:
    """``url`` no longer accepted the reconnection token (``reason``: its secret changed, or the token expired).

    The client joined again as the same ``client_id`` in ``workspace`` with the
    credential it was given (none: anonymous); its services are re-registered
    next, and ``Reconnected`` follows as after any reconnection. Peers saw it
    leave and come back.
    """

    kind: ClassVar[str] = "rejoined"
    url: str
    client_id: str
    workspace: str
    reason: str


@dataclass(frozen=True, slots=True)
class GivingUp:
    """The client stopped for good; pending and new calls raise ``error``.

    ``error`` is a :class:`GaveUp` (budget spent) or a :class:`Refused` (final refusal).
    """

    kind: ClassVar[str] = "gave_up"
    error: SwitchboardError


Event = Disconnected | Reconnecting | Reconnected | Rejoined | GivingUp
EventHandler = Callable[[Event], Awaitable[None] | None]


def describe(event: Event) -> str:
    """The log line for ``event``."""
    if isinstance(event, Disconnected):
        return f"disconnected from {event.url} (code {event.code}{' ' + event.reason if event.reason else ''})"
    if isinstance(event, Reconnecting):
        last = "none" if event.error is None else f"{type(event.error).__name__}: {event.error}"
        return (
            f"reconnecting to {event.url}: attempt {event.attempt} in {event.delay:.2f} s "
            f"({event.elapsed:.1f} s into the outage, {event.remaining:.1f} s left; last error: {last})"
        )
    if isinstance(event, Reconnected):
        return (
            f"reconnected to {event.url} after {event.outage_seconds:.1f} s and {event.attempts} "
            f"attempt{'s' if event.attempts != 1 else ''} ({event.remaining:.1f} s of budget left)"
        )
    if isinstance(event, Rejoined):
        return (
            f"{event.url} no longer accepts the reconnection token ({event.reason}): joined again as "
            f"{event.workspace}/{event.client_id} with the credential given"
        )
    return str(event.error)


class Listeners:
    """The application's event handlers: called in order, coroutines run as owned tasks."""

    def __init__(self) -> None:
        self._handlers: list[EventHandler] = []
        self._tasks: set[asyncio.Task[Any]] = set()

    def add(self, handler: EventHandler) -> None:
        self._handlers.append(handler)

    def remove(self, handler: EventHandler) -> None:
        self._handlers.remove(handler)

    def dispatch(self, event: Event) -> None:
        for handler in list(self._handlers):
            try:
                result = handler(event)
                if inspect.isawaitable(result):
                    task = asyncio.ensure_future(result)
                    self._tasks.add(task)
                    task.add_done_callback(self._done)
            except Exception:
                _log.exception("connection event handler failed on %s", event.kind)

    def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            _log.error("connection event handler failed", exc_info=task.exception())


_log = logging.getLogger(__name__)

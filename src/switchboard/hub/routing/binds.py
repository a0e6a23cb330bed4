"""A balanced handle bound on first use by a replica that did not make it, without I/O.

A handle lives on the replica its caller looked the service up on. A caller
that comes back on another replica (a drain, a reconnect) calls the same
virtual target, ``<workspace>/balance|<policy>|<name>``, which carries all a
lookup needs. That replica binds the handle for it on its first call there:
the router answers such a call "bind first" (:class:`~switchboard.hub.routing.actions.BindFirst`),
the manager looks the service up as the caller (its current identity, the same
rules as for ``get_service``), and the router routes the frames again
(:meth:`~switchboard.hub.routing.balanced_routes.BalancedRoutes.bound`), or
answers each with the lookup's error. A handle so bound reaches exactly what a
fresh lookup would. Meanwhile the caller's later frames for it wait here, a
bounded number (:data:`MAX_WAITING`).
"""

from __future__ import annotations

import enum

from switchboard.hub.routing import balance

# Frames one caller's calls through handles being bound may queue while the lookup runs. A
# caller sends a few calls before its first answer; beyond this, its calls are refused (retryable).
MAX_WAITING = 64


def parse_virtual(target: str) -> tuple[str, str, str] | None:
    """``<ws>/balance|<policy>|<name>`` → ``(ws, policy, name)``; ``None``: not one (an unknown policy, no name)."""
    ws, _, client = target.partition("/")
    kind, _, rest = client.partition("|")
    policy, _, name = rest.partition("|")
    if not ws or f"{kind}|" != "balance|" or policy not in balance.POLICIES or not name:
        return None
    return ws, policy, name


class BindWait(enum.Enum):
    """What became of a frame for a handle being bound: the first asks for the bind."""

    FIRST = "first"
    QUEUED = "queued"
    FULL = "full"


class PendingBinds:
    """The frames each caller sent through handles not yet bound here, in the order they came."""

    def __init__(self, limit: int = MAX_WAITING) -> None:
        self.limit = limit
        self._waiting: dict[str, dict[str, list[tuple[str, bytes]]]] = {}  # caller -> target -> (session, frame)

    def wait(self, caller: str, target: str, session: str, frame: bytes) -> BindWait:
        handles = self._waiting.setdefault(caller, {})
        if sum(len(frames) for frames in handles.values()) >= self.limit:
            return BindWait.FULL
        first = target not in handles
        handles.setdefault(target, []).append((session, frame))
        return BindWait.FIRST if first else BindWait.QUEUED

    def done(self, caller: str, target: str) -> list[tuple[str, bytes]]:
        """The bind of ``target`` for ``caller`` ended: its frames, to route again or refuse."""
        handles = self._waiting.get(caller, {})
        frames = handles.pop(target, [])
        if not handles:
            self._waiting.pop(caller, None)
        return frames

    def __len__(self) -> int:
        return sum(len(f) for handles in self._waiting.values() for f in handles.values())

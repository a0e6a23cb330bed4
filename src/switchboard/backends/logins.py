"""The pending sign-ins of ``public/hypha-login``: one interface, the embedded store, its bound.

An entry is a short JSON text under a name (a login key's, or a flow's ``state``),
kept until a deadline at most :data:`LOGIN_TIME` away; :meth:`LoginStore.take`
reads and removes it at once, so an entry is used once. Replicas of a hub share
:class:`switchboard.backends.redis.stores.logins.RedisLogins`, so a sign-in started on one
replica finishes on any other.
"""

from __future__ import annotations

import heapq
from typing import Protocol

from switchboard.clock import Clock
from switchboard.errors import LimitExceeded

# Hypha's login time: a key (and each flow it starts) lives 3 minutes, time to sign in at a provider.
LOGIN_TIME = 180.0
# Sign-ins pending on an embedded hub at once: each is a few hundred bytes, and 10,000 people signing
# in within 3 minutes is far beyond one process's users.
MAX_PENDING_LOGINS = 10_000
# Largest entry: a hub token with a user's labels is about 1 KiB.
MAX_ENTRY_BYTES = 8192


class LoginStore(Protocol):
    async def add(self, name: str, value: str, until: float) -> None:
        """Keep ``value`` under ``name`` until ``until`` (epoch s); :class:`LimitExceeded` when full."""
        ...

    async def get(self, name: str) -> str | None:
        """The value under ``name`` (``None``: none, or expired)."""
        ...

    async def replace(self, name: str, value: str) -> bool:
        """Put ``value`` under ``name`` if an entry is there (keeping its deadline); whether one was."""
        ...

    async def take(self, name: str) -> str | None:
        """The value under ``name``, removed in the same step (``None``: none)."""
        ...


def check_entry(value: str) -> None:
    if len(value.encode()) > MAX_ENTRY_BYTES:
        raise LimitExceeded(f"login entry of {len(value.encode())} bytes, at most {MAX_ENTRY_BYTES}")


def full() -> LimitExceeded:
    return LimitExceeded(f"{MAX_PENDING_LOGINS} sign-ins are pending on this hub: retry in a minute")


class MemoryLogins:
    """One process's pending sign-ins; expired ones are dropped by the operations that follow."""

    def __init__(self, clock: Clock, *, total: int = MAX_PENDING_LOGINS) -> None:
        self.clock = clock
        self.total = total
        self._entries: dict[str, tuple[str, float]] = {}
        self._expiring: list[tuple[float, str]] = []

    async def add(self, name: str, value: str, until: float) -> None:
        check_entry(value)
        self._drop_expired()
        if len(self._entries) >= self.total:
            raise full()
        self._entries[name] = (value, until)
        heapq.heappush(self._expiring, (until, name))

    async def get(self, name: str) -> str | None:
        self._drop_expired()
        entry = self._entries.get(name)
        return entry[0] if entry else None

    async def replace(self, name: str, value: str) -> bool:
        check_entry(value)
        self._drop_expired()
        entry = self._entries.get(name)
        if entry is None:
            return False
        self._entries[name] = (value, entry[1])
        return True

    async def take(self, name: str) -> str | None:
        self._drop_expired()
        entry = self._entries.pop(name, None)
        return entry[0] if entry else None

    def __len__(self) -> int:
        self._drop_expired()
        return len(self._entries)

    def _drop_expired(self) -> None:
        now = self.clock.time()
        while self._expiring and self._expiring[0][0] <= now:
            until, name = heapq.heappop(self._expiring)
            entry = self._entries.get(name)
            if entry is not None and entry[1] == until:
                del self._entries[name]

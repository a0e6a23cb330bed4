"""Revoked tokens, by token id (``jti``), each kept until the token itself would have expired.

One interface and the embedded store; the replicas of a hub share
:class:`switchboard.backends.redis.revoked.RedisRevocations` instead.

Every revocation is charged to a principal (the root of the revoked token's
chain): each principal holds at most ``per_principal`` live revocations, the
hub at most ``total``; a revoke past either bound is refused with
:class:`~switchboard.errors.LimitExceeded`, and a revocation stops counting
when its token expires. A revoke costs the same whatever the store holds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from switchboard.clock import Clock
from switchboard.errors import LimitExceeded


class Revocations(Protocol):
    async def revoke(self, token_id: str, *, until: float, principal: str) -> None:
        """Refuse ``token_id`` from now until ``until`` (epoch seconds, its own expiry), charged to
        ``principal``; :class:`LimitExceeded` past the principal's or the hub's bound."""
        ...

    async def any_revoked(self, token_ids: tuple[str, ...]) -> bool:
        """Whether any of these ids was revoked (and has not expired since)."""
        ...


def principal_full(principal: str, bound: int) -> LimitExceeded:
    return LimitExceeded(
        f"Too many revoked tokens for {principal}: at most {bound} at once (--max-revocations-per-user/"
        "SWITCHBOARD_MAX_REVOCATIONS_PER_USER); each is forgotten when its token expires"
    )


def hub_full(bound: int) -> LimitExceeded:
    return LimitExceeded(
        f"The hub holds its maximum of {bound} revoked tokens (--max-revocations/SWITCHBOARD_MAX_REVOCATIONS); "
        "each is forgotten when its token expires: retry later"
    )


@dataclass(slots=True)
class _Entry:
    until: float
    principal: str


class MemoryRevocations:
    """One process's revocations.

    Each entry is also filed under the whole second its token expires in; a
    revoke first drops the seconds that have passed since the last one (each
    entry is dropped once, so the work is paid for by the revokes that made
    the entries), then adds one entry: constant work per revoke, never a walk
    over every entry.
    """

    def __init__(self, clock: Clock, *, per_principal: int, total: int) -> None:
        self.clock = clock
        self.per_principal = per_principal
        self.total = total
        self._entries: dict[str, _Entry] = {}
        self._by_second: dict[int, list[str]] = {}  # ceil(until) -> token ids expiring in that second
        self._held: dict[str, int] = {}  # principal -> live revocations charged to it
        self._swept = math.ceil(clock.time())  # every second before this one was dropped

    async def revoke(self, token_id: str, *, until: float, principal: str) -> None:
        now = self.clock.time()
        self._drop_expired(now)
        if until <= now:
            return  # expired already: refused without being remembered
        entry = self._entries.get(token_id)
        if entry is not None:
            if until > entry.until:  # revoked again for longer: filed under its new second
                entry.until = until
                self._by_second.setdefault(math.ceil(until), []).append(token_id)
            return
        if self._held.get(principal, 0) >= self.per_principal:
            raise principal_full(principal, self.per_principal)
        if len(self._entries) >= self.total:
            raise hub_full(self.total)
        self._entries[token_id] = _Entry(until, principal)
        self._by_second.setdefault(math.ceil(until), []).append(token_id)
        self._held[principal] = self._held.get(principal, 0) + 1

    async def any_revoked(self, token_ids: tuple[str, ...]) -> bool:
        now = self.clock.time()
        for i in token_ids:
            entry = self._entries.get(i)
            if entry is not None and entry.until > now:
                return True
        return False

    def held_by(self, principal: str) -> int:
        """Live revocations charged to ``principal`` (the expired not yet dropped among them)."""
        return self._held.get(principal, 0)

    def __len__(self) -> int:
        """Revocations held, the expired not yet dropped among them."""
        return len(self._entries)

    def _drop_expired(self, now: float) -> None:
        last = math.floor(now)  # a second ``s`` holds tokens with until <= s: expired once s <= now
        if last < self._swept:
            return
        due: Iterable[int] = range(self._swept, last + 1)  # walk the seconds passed
        if last - self._swept >= len(self._by_second):  # long idle: fewer seconds are filed than have passed
            due = sorted(s for s in self._by_second if s <= last)
        for second in due:
            for token_id in self._by_second.pop(second, ()):
                entry = self._entries.get(token_id)
                if entry is not None and math.ceil(entry.until) == second:
                    del self._entries[token_id]
                    left = self._held[entry.principal] - 1
                    if left:
                        self._held[entry.principal] = left
                    else:
                        del self._held[entry.principal]
        self._swept = last + 1

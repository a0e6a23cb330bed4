"""Revoked tokens, by token id (``jti``), each kept until the token itself would have expired.

One interface and the embedded store; the replicas of a hub share
:class:`switchboard.backends.redis.revoked.RedisRevocations` instead.
"""

from __future__ import annotations

from typing import Protocol

from switchboard.clock import Clock


class Revocations(Protocol):
    async def revoke(self, token_id: str, *, until: float) -> None:
        """Refuse ``token_id`` from now until ``until`` (epoch seconds, its own expiry)."""
        ...

    async def any_revoked(self, token_ids: tuple[str, ...]) -> bool:
        """Whether any of these ids was revoked (and has not expired since)."""
        ...


class MemoryRevocations:
    """One process's revocations; expired entries are dropped as new ones come."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._until: dict[str, float] = {}

    async def revoke(self, token_id: str, *, until: float) -> None:
        now = self.clock.time()
        self._until = {k: t for k, t in self._until.items() if t > now}  # bounded by the live revoked tokens
        self._until[token_id] = max(until, self._until.get(token_id, 0.0))

    async def any_revoked(self, token_ids: tuple[str, ...]) -> bool:
        now = self.clock.time()
        return any(self._until.get(i, 0.0) > now for i in token_ids)

    def __len__(self) -> int:
        """Revocations held, the expired not yet dropped among them."""
        return len(self._until)

"""Revoked tokens, by token id (``jti``), each kept until the token itself would have expired.

One interface and the embedded store; the replicas of a hub share
:class:`switchboard.backends.redis.stores.revoked.RedisRevocations` instead.

Every revocation is charged to a principal (the root of the revoked token's
chain): each principal holds at most ``per_principal`` live revocations, the
hub at most ``total``; a revoke past either bound is refused with
:class:`~switchboard.errors.LimitExceeded`, and a revocation stops counting
when its token expires. A revoke costs the same whatever the store holds.
"""

from __future__ import annotations

from typing import Protocol

from switchboard.backends.expiring import ChargedExpiries
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


class MemoryRevocations:
    """One process's revocations (:class:`~switchboard.backends.expiring.ChargedExpiries`: constant
    work per revoke, never a walk over every entry)."""

    def __init__(self, clock: Clock, *, per_principal: int, total: int) -> None:
        self.clock = clock
        self._kept = ChargedExpiries(clock, per_principal=per_principal, total=total)

    async def revoke(self, token_id: str, *, until: float, principal: str) -> None:
        refused = self._kept.add(token_id, until=until, principal=principal)
        if refused == "principal":
            raise principal_full(principal, self._kept.per_principal)
        if refused == "total":
            raise hub_full(self._kept.total)

    async def any_revoked(self, token_ids: tuple[str, ...]) -> bool:
        return any(self._kept.get(i) is not None for i in token_ids)

    def held_by(self, principal: str) -> int:
        """Live revocations charged to ``principal`` (the expired not yet dropped among them)."""
        return self._kept.held_by(principal)

    def __len__(self) -> int:
        """Revocations held, the expired not yet dropped among them."""
        return len(self._kept)

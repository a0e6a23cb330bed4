"""Revoked tokens in Redis: one key per token id, with the token's remaining lifetime as its TTL.

Every replica reads the same keys on each verification, so a revocation made
on one replica holds on all of them at once, and Redis forgets it when the
token would have expired anyway. A check Redis cannot answer fails closed:
the token is refused with a retryable error, never taken as not revoked (in a
cluster, one shard's failover would otherwise readmit the revoked tokens whose
keys it holds while the registry's shard answers).

What each principal holds is counted in :class:`~.charged.ChargedSets`
(``p {revocations}:by:<principal>``, ``p {revocations}:all``), checked and
charged before the token's own key is written.
"""

from __future__ import annotations

import logging
from typing import Any

from redis.exceptions import RedisError

from switchboard.backends.redis.stores.charged import HUB_FULL, PRINCIPAL_FULL, ChargedSets
from switchboard.backends.revocations import hub_full, principal_full
from switchboard.clock import Clock
from switchboard.errors import BackendError

log = logging.getLogger(__name__)


def revoked_key(token_id: str, prefix: str = "sb:") -> str:
    return f"{prefix}revoked:{token_id}"


class RedisRevocations:
    def __init__(self, redis: Any, *, clock: Clock, per_principal: int, total: int, key_prefix: str = "sb:") -> None:
        self._r = redis
        self.clock = clock
        self._prefix = key_prefix
        self._charged = ChargedSets(
            redis, keyspace=f"{key_prefix}{{revocations}}", per_principal=per_principal, total=total
        )

    async def revoke(self, token_id: str, *, until: float, principal: str) -> None:
        now = self.clock.time()
        if until <= now:
            return  # expired already: refused without being remembered
        try:
            kept_ms = await self._charged.charge(token_id, until=until, now=now, principal=principal)
            if kept_ms == PRINCIPAL_FULL:
                raise principal_full(principal, self._charged.per_principal)
            if kept_ms == HUB_FULL:
                raise hub_full(self._charged.total)
            # charged first: a write that fails here leaves a charge that lapses with the token
            await self._r.set(revoked_key(token_id, self._prefix), b"1", px=kept_ms)
        except RedisError as exc:
            raise BackendError(f"revocation not stored: {exc}") from exc

    async def held_by(self, principal: str) -> int:
        """Revocations charged to ``principal`` (the expired not yet dropped among them)."""
        return await self._charged.held_by(principal)

    async def any_revoked(self, token_ids: tuple[str, ...]) -> bool:
        """One EXISTS per id (each its own key, so a cluster's slots never matter).

        Unreachable Redis: :class:`BackendError` (the door answers "retry"), as a
        revoked token must not pass because the one store that knows was away.
        """
        try:
            for token_id in token_ids:
                if await self._r.exists(revoked_key(token_id, self._prefix)):
                    return True
        except RedisError as exc:
            log.warning("token refused for now, revocations not checked (Redis unreachable): %s", exc)
            raise BackendError(f"revocations cannot be checked: {exc}") from exc
        return False

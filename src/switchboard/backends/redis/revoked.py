"""Revoked tokens in Redis: one key per token id, with the token's remaining lifetime as its TTL.

Every replica reads the same keys on each verification, so a revocation made
on one replica holds on all of them at once, and Redis forgets it when the
token would have expired anyway. A check Redis cannot answer fails closed:
the token is refused with a retryable error, never taken as not revoked (in a
cluster, one shard's failover would otherwise readmit the revoked tokens whose
keys it holds while the registry's shard answers).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from redis.exceptions import RedisError

from switchboard.clock import Clock
from switchboard.errors import BackendError

log = logging.getLogger(__name__)


def revoked_key(token_id: str, prefix: str = "sb:") -> str:
    return f"{prefix}revoked:{token_id}"


class RedisRevocations:
    def __init__(self, redis: Any, *, clock: Clock, key_prefix: str = "sb:") -> None:
        self._r = redis
        self.clock = clock
        self._prefix = key_prefix

    async def revoke(self, token_id: str, *, until: float) -> None:
        ttl = math.ceil(until - self.clock.time())
        if ttl <= 0:
            return  # expired already: refused without being remembered
        try:
            await self._r.set(revoked_key(token_id, self._prefix), b"1", ex=ttl)
        except RedisError as exc:
            raise BackendError(f"revocation not stored: {exc}") from exc

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

"""Revoked tokens in Redis: one key per token id, with the token's remaining lifetime as its TTL.

Every replica reads the same keys on each verification, so a revocation made
on one replica holds on all of them at once, and Redis forgets it when the
token would have expired anyway.
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

        Unreachable Redis: a token is taken as not revoked (logged), as the
        hub keeps serving through a backend outage rather than refuse everyone.
        """
        try:
            for token_id in token_ids:
                if await self._r.exists(revoked_key(token_id, self._prefix)):
                    return True
        except RedisError as exc:
            log.warning("revocations not checked (Redis unreachable): %s", exc)
        return False

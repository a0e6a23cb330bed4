"""Revoked tokens in Redis: one key per token id, with the token's remaining lifetime as its TTL.

Every replica reads the same keys on each verification, so a revocation made
on one replica holds on all of them at once, and Redis forgets it when the
token would have expired anyway. A check Redis cannot answer fails closed:
the token is refused with a retryable error, never taken as not revoked (in a
cluster, one shard's failover would otherwise readmit the revoked tokens whose
keys it holds while the registry's shard answers).

What each principal holds is counted in a sorted set per principal (token id
scored by its expiry) and the hub's total in one more: a revoke drops the
expired entries of both (each once), checks the bounds and adds one entry, in
one script, so its cost never grows with what the store holds (logarithmic in
a sorted set's size); then it writes the token's own key. The two sets share
one hash tag, so the script never crosses a cluster's slots.
"""

from __future__ import annotations

import logging
from typing import Any

from redis.exceptions import RedisError

from switchboard.backends.revocations import hub_full, principal_full
from switchboard.clock import Clock
from switchboard.errors import BackendError

log = logging.getLogger(__name__)

# KEYS: the principal's set, the hub's set. ARGV: token id, until (ms), now (ms), per-principal
# bound, hub bound. Returns how long (ms) the token stays revoked, -1 the principal is full, -2 the
# hub is full.
_REVOKE = """
local expiry, now = tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return -1 end
  if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[5]) then return -2 end
end
redis.call('ZADD', KEYS[1], 'GT', expiry, ARGV[1])
redis.call('ZADD', KEYS[2], 'GT', expiry, ARGV[1])
for _, k in ipairs(KEYS) do
  local last = tonumber(redis.call('ZRANGE', k, -1, -1, 'WITHSCORES')[2])
  redis.call('PEXPIRE', k, math.max(1, last - now))
end
return math.max(1, tonumber(redis.call('ZSCORE', KEYS[2], ARGV[1])) - now)
"""


def revoked_key(token_id: str, prefix: str = "sb:") -> str:
    return f"{prefix}revoked:{token_id}"


def charged_key(principal: str, prefix: str = "sb:") -> str:
    """The sorted set of the live revocations charged to ``principal`` (hash-tagged with :func:`all_key`)."""
    return f"{prefix}{{revocations}}:by:{principal}"


def all_key(prefix: str = "sb:") -> str:
    return f"{prefix}{{revocations}}:all"


class RedisRevocations:
    def __init__(self, redis: Any, *, clock: Clock, per_principal: int, total: int, key_prefix: str = "sb:") -> None:
        self._r = redis
        self.clock = clock
        self.per_principal = per_principal
        self.total = total
        self._prefix = key_prefix
        self._revoke = redis.register_script(_REVOKE)

    async def revoke(self, token_id: str, *, until: float, principal: str) -> None:
        now = self.clock.time()
        if until <= now:
            return  # expired already: refused without being remembered
        keys = [charged_key(principal, self._prefix), all_key(self._prefix)]
        args = [token_id, int(until * 1000), int(now * 1000), self.per_principal, self.total]
        try:
            kept_ms = int(await self._revoke(keys=keys, args=args))
            if kept_ms == -1:
                raise principal_full(principal, self.per_principal)
            if kept_ms == -2:
                raise hub_full(self.total)
            # charged first: a write that fails here leaves a charge that lapses with the token
            await self._r.set(revoked_key(token_id, self._prefix), b"1", px=kept_ms)
        except RedisError as exc:
            raise BackendError(f"revocation not stored: {exc}") from exc

    async def held_by(self, principal: str) -> int:
        """Revocations charged to ``principal`` (the expired not yet dropped among them)."""
        return int(await self._r.zcard(charged_key(principal, self._prefix)))

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

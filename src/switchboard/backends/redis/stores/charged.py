"""Members that expire, each charged to a principal, bounded per principal and in all, in Redis: the
revocations and the workspace deletion marks every replica shares.

What each principal holds is a sorted set (members scored by their expiry)
and the hub's total one more, both under one hash tag (``keyspace``), so the
script never crosses a cluster's slots: a charge drops the expired members
of both (each once), checks the bounds and adds one, so its cost never grows
with what the store holds (logarithmic in a sorted set's size). The caller
writes its own key for the member afterwards, with the TTL returned.
"""

from __future__ import annotations

from typing import Any

PRINCIPAL_FULL = -1
HUB_FULL = -2

# KEYS: the principal's set, the hub's set. ARGV: member, until (ms), now (ms), per-principal
# bound, hub bound. Returns how long (ms) the member is kept, -1 the principal is full, -2 the
# hub is full.
_CHARGE = """
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


class ChargedSets:
    def __init__(self, redis: Any, *, keyspace: str, per_principal: int, total: int) -> None:
        self._r = redis
        self._keyspace = keyspace
        self.per_principal = per_principal
        self.total = total
        self._charge = redis.register_script(_CHARGE)

    def _by(self, principal: str) -> str:
        return f"{self._keyspace}:by:{principal}"

    async def charge(self, member: str, *, until: float, now: float, principal: str) -> int:
        """Keep ``member`` until ``until`` (epoch s), charged to ``principal``: the milliseconds it is
        kept (the later of its expiries, if it was kept already), or :data:`PRINCIPAL_FULL` or
        :data:`HUB_FULL` (nothing charged)."""
        keys = [self._by(principal), f"{self._keyspace}:all"]
        args = [member, int(until * 1000), int(now * 1000), self.per_principal, self.total]
        return int(await self._charge(keys=keys, args=args))

    async def held_by(self, principal: str) -> int:
        """Members charged to ``principal`` (the expired not yet dropped among them)."""
        return int(await self._r.zcard(self._by(principal)))

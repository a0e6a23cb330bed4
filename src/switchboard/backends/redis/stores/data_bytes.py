"""What every workspace's data weighs in Redis, so that all of it together stays under one ceiling.

Each data key of a workspace (a table, the log) is charged its bytes under a
member ``<ws>/<part>`` of two keys, one hash tag (one slot of a cluster):

* ``p {workspace-data}:bytes``  hash, member → bytes charged
* ``p {workspace-data}:until``  sorted set, member → when its key expires (epoch ms; ``inf``: kept)
* ``p {workspace-data}:total``  string, the sum

A charge first drops the members whose key has expired (a few at a time, each
once), then adds ``delta`` unless that passes the ceiling. A key's expiry is
renewed with each write, as the key's own TTL is, so the charge lapses when
the data does.
"""

from __future__ import annotations

from typing import Any

# KEYS: bytes, until, total. ARGV: member, delta, expiry (ms, 'inf', or '' to leave it: then a member
# without a charge is given nothing back), now (ms), ceiling.
# Returns 1 (charged), 0 (it would pass the ceiling: nothing charged).
_CHARGE = """
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[4], 'LIMIT', 0, 64)) do
  redis.call('DECRBY', KEYS[3], tonumber(redis.call('HGET', KEYS[1], m) or '0'))
  redis.call('HDEL', KEYS[1], m)
  redis.call('ZREM', KEYS[2], m)
end
local delta = tonumber(ARGV[2])
if ARGV[3] == '' and not redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 1 end
if delta > 0 and tonumber(redis.call('GET', KEYS[3]) or '0') + delta > tonumber(ARGV[5]) then return 0 end
redis.call('HINCRBY', KEYS[1], ARGV[1], delta)
redis.call('INCRBY', KEYS[3], delta)
if ARGV[3] ~= '' then redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1]) end
return 1
"""

# KEYS: bytes, until, total. ARGV: members. Forget their charges (their keys were deleted).
_DROP = """
for _, m in ipairs(ARGV) do
  redis.call('DECRBY', KEYS[3], tonumber(redis.call('HGET', KEYS[1], m) or '0'))
  redis.call('HDEL', KEYS[1], m)
  redis.call('ZREM', KEYS[2], m)
end
return 1
"""

# KEYS: until. ARGV: members. Their keys are kept for good now (a persistent record).
_KEEP = """
for _, m in ipairs(ARGV) do redis.call('ZADD', KEYS[1], 'XX', 'inf', m) end
return 1
"""


UNCHANGED = ""  # an expiry for :meth:`DataBytes.charge`: leave the member's as it is


class DataBytes:
    """The charges of every workspace's data keys, against ``ceiling`` bytes in all."""

    def __init__(self, redis: Any, *, prefix: str, ceiling: int) -> None:
        self._r = redis
        self.ceiling = ceiling
        self._keys = [f"{prefix}{{workspace-data}}:{part}" for part in ("bytes", "until", "total")]
        self._charge = redis.register_script(_CHARGE)
        self._drop = redis.register_script(_DROP)
        self._keep = redis.register_script(_KEEP)

    async def charge(self, member: str, delta: int, *, expires_ms: int | None | str, now_ms: int) -> bool:
        """Charge ``delta`` bytes (negative: give back) to ``member``, whose key expires at ``expires_ms``
        (``None``: kept; :data:`UNCHANGED`: as before); ``False`` if that would pass the ceiling (nothing
        charged)."""
        expiry = "inf" if expires_ms is None else str(expires_ms)
        args = [member, delta, expiry, now_ms, self.ceiling]
        return bool(await self._charge(keys=self._keys, args=args))

    async def drop(self, members: list[str]) -> None:
        await self._drop(keys=self._keys, args=members)

    async def keep(self, members: list[str]) -> None:
        await self._keep(keys=[self._keys[1]], args=members)

    async def total(self) -> int:
        """Bytes charged (members expired but not yet dropped among them)."""
        return int(await self._r.get(self._keys[2]) or 0)

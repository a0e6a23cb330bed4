"""Connections per user and per workspace, counted across replicas.

Each counter is a hash with one field per replica (``sb:conns:u:<user>``
field ``<replica>`` → count), so a replica that dies does not leave its
connections counted forever: :meth:`RedisConnectionCounts.forget_replicas`
(run by the leader) drops the fields of replicas that are gone.
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import RedisError

from switchboard.errors import BackendError

_ADD = """
local u = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
local w = redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
local function total(key)
  local sum = 0
  for _, v in ipairs(redis.call('HVALS', key)) do sum = sum + tonumber(v) end
  return sum
end
return {total(KEYS[1]), total(KEYS[2])}
"""

_REMOVE = """
for i = 1, 2 do
  if redis.call('HINCRBY', KEYS[i], ARGV[1], -1) <= 0 then redis.call('HDEL', KEYS[i], ARGV[1]) end
end
return 1
"""


class RedisConnectionCounts:
    def __init__(self, redis: Any, *, replica_id: str, key_prefix: str = "sb:") -> None:
        self._r = redis
        self.replica_id = replica_id
        self._p = f"{key_prefix}conns:"
        self._add = redis.register_script(_ADD)
        self._remove = redis.register_script(_REMOVE)

    def _keys(self, user: str, workspace: str) -> list[str]:
        return [f"{self._p}u:{user}", f"{self._p}w:{workspace}"]

    async def add(self, user: str, workspace: str) -> tuple[int, int]:
        try:
            u, w = await self._add(keys=self._keys(user, workspace), args=[self.replica_id])
        except RedisError as exc:
            raise BackendError(f"connection count failed: {exc}") from exc
        return int(u), int(w)

    async def remove(self, user: str, workspace: str) -> None:
        try:
            await self._remove(keys=self._keys(user, workspace), args=[self.replica_id])
        except RedisError as exc:
            raise BackendError(f"connection count failed: {exc}") from exc

    async def forget_replicas(self, live: set[str]) -> int:
        """Drop the counts of every replica not in ``live``; return how many fields went."""
        dropped = 0
        async for key in self._r.scan_iter(match=self._p + "*", count=500):
            fields = await self._r.hkeys(key)
            dead = [f for f in fields if f.decode() not in live]
            if dead:
                dropped += await self._r.hdel(key, *dead)
        return dropped

"""Connections per user and per workspace, counted across replicas.

Each counter is a hash with one field per replica (``sb:conns:u:<user>``
field ``<replica>`` → count), so a replica that dies does not leave its
connections counted forever: :meth:`RedisConnectionCounts.forget_replica`
(run by the leader) drops the fields of a replica that is gone. Each replica
also lists the counters it touched (``sb:conns:keys:<replica>``), so that
clean-up reads one set instead of scanning the keyspace.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from redis.exceptions import RedisError

from switchboard.backends.redis.shared.batch import Batcher
from switchboard.errors import BackendError

_ADD = """
local u = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
local w = redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
redis.call('SADD', KEYS[3], KEYS[1], KEYS[2])
local function total(key)
  local sum = 0
  for _, v in ipairs(redis.call('HVALS', key)) do sum = sum + tonumber(v) end
  return sum
end
return {total(KEYS[1]), total(KEYS[2])}
"""

_REMOVE = """
for i = 1, 2 do
  if redis.call('HINCRBY', KEYS[i], ARGV[1], -1) <= 0 then
    redis.call('HDEL', KEYS[i], ARGV[1])
    redis.call('SREM', KEYS[3], KEYS[i])
  end
end
return 1
"""


def counter_keys(key_prefix: str, user: str, workspace: str, replica_id: str) -> tuple[str, str, str]:
    """The user's and the workspace's counters, and the set of counters ``replica_id`` touched
    (also for a script that counts a connection in with other work: ``entrance.py``)."""
    p = f"{key_prefix}conns:"
    return f"{p}u:{user}", f"{p}w:{workspace}", f"{p}keys:{replica_id}"


class RedisConnectionCounts:
    def __init__(self, redis: Any, *, replica_id: str, key_prefix: str = "sb:") -> None:
        self._r = redis
        self.replica_id = replica_id
        self._prefix = key_prefix
        self._p = f"{key_prefix}conns:"
        self._add = redis.register_script(_ADD)
        self._remove = redis.register_script(_REMOVE)
        self._batch = Batcher(redis)  # a crowd arriving or leaving at once: a few pipelines

    def _keys(self, user: str, workspace: str) -> list[str]:
        return list(counter_keys(self._prefix, user, workspace, self.replica_id)[:2])

    def _touched(self, replica_id: str) -> str:
        return counter_keys(self._prefix, "", "", replica_id)[2]

    async def add(self, user: str, workspace: str) -> tuple[int, int]:
        keys = [*self._keys(user, workspace), self._touched(self.replica_id)]
        try:
            u, w = await self._batch.run(self._add, keys, [self.replica_id])
        except RedisError as exc:
            raise BackendError(f"connection count failed: {exc}") from exc
        return int(u), int(w)

    async def remove(self, user: str, workspace: str) -> None:
        try:
            keys = [*self._keys(user, workspace), self._touched(self.replica_id)]
            await self._batch.run(self._remove, keys, [self.replica_id])
        except RedisError as exc:
            raise BackendError(f"connection count failed: {exc}") from exc

    async def rebuild(self, users: Mapping[str, int], workspaces: Mapping[str, int]) -> int:
        """After Redis lost data: set this replica's field of each counter to what its clients
        count now (absolute values, so a client counted again since the loss is not counted twice),
        and drop its field from every other counter it had touched: after a failover the promoted
        replica may lack the decrements of clients that left, which would count against their
        users' and workspaces' limits for good."""
        keys = {f"{self._p}u:{user}": n for user, n in users.items()}
        keys.update({f"{self._p}w:{workspace}": n for workspace, n in workspaces.items()})
        touched = self._touched(self.replica_id)
        try:
            stale = [k for k in map(_text, await self._r.smembers(touched)) if k not in keys]
            if not keys and not stale:
                return 0
            async with self._r.pipeline(transaction=False) as pipe:
                for key, n in keys.items():
                    pipe.hset(key, self.replica_id, n)
                for key in stale:
                    pipe.hdel(key, self.replica_id)
                if stale:
                    pipe.srem(touched, *stale)
                if keys:
                    pipe.sadd(touched, *keys)
                await pipe.execute()
        except RedisError as exc:
            raise BackendError(f"rebuilding the connection counts failed: {exc}") from exc
        return len(keys)

    async def forget_replica(self, replica_id: str) -> int:
        """Drop every count of a replica that is gone; return how many counters it had."""
        touched = self._touched(replica_id)
        try:
            keys = await self._r.smembers(touched)
            if keys:
                async with self._r.pipeline(transaction=False) as pipe:
                    for key in keys:
                        pipe.hdel(key, replica_id)
                    await pipe.execute()
            await self._r.delete(touched)
        except RedisError as exc:
            raise BackendError(f"forgetting the counts of {replica_id} failed: {exc}") from exc
        return len(keys)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

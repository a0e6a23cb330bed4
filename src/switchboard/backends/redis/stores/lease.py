"""A lease in Redis: one key holding its owner's id with a TTL.

Taken with ``SET NX PX`` and kept alive by a compare-and-extend script, so a
replica can only ever extend or delete its *own* lease. What a leader does
with it (campaign, renew, step down in time) is
:class:`switchboard.replicas.upkeep.lease.LeaderElector`'s; Redis's errors become
:class:`~switchboard.errors.BackendError` here.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, TypeVar

from redis.exceptions import RedisError

from switchboard.errors import BackendError, ConfigError

T = TypeVar("T")

# KEYS[1] = lease key, ARGV[1] = owner id, ARGV[2] = ttl in ms.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
# KEYS[1] = lease key, ARGV[1] = owner id.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""


class RedisLease:
    """The raw lease operations on one key (a :class:`~switchboard.replicas.upkeep.lease.Lease`).

    ``ttl_ms`` must never be rounded down (the key must not expire sooner
    than the leader believes); ``owner_id`` must be unique per process
    incarnation (e.g. replica id plus a start time).
    """

    def __init__(self, redis: Any, *, key: str, ttl_ms: int, owner_id: str) -> None:
        if not isinstance(owner_id, str) or not owner_id:
            raise ConfigError(f"lease owner_id={owner_id!r}: must be a non-empty string")
        self.redis = redis
        self.key = key
        self.ttl_ms = ttl_ms
        self.owner_id = owner_id
        self._renew = redis.register_script(_RENEW)
        self._release = redis.register_script(_RELEASE)

    async def _call(self, what: str, op: Awaitable[T]) -> T:
        try:
            return await op
        except RedisError as exc:
            raise BackendError(f"lease {self.key!r}: {what} failed: {exc}") from exc

    async def try_acquire(self) -> bool:
        """Take the lease if nobody holds it."""
        return bool(await self._call("acquire", self.redis.set(self.key, self.owner_id, nx=True, px=self.ttl_ms)))

    async def renew(self) -> bool:
        """Extend the lease to a full TTL, only if this owner still holds it."""
        return bool(await self._call("renew", self._renew(keys=[self.key], args=[self.owner_id, self.ttl_ms])))

    async def release(self) -> bool:
        """Delete the lease, only if this owner holds it; True if it did."""
        return bool(await self._call("release", self._release(keys=[self.key], args=[self.owner_id])))

    async def holder(self) -> str | None:
        """The current holder's owner id, or None if the lease is free."""
        value: bytes | str | None = await self._call("read", self.redis.get(self.key))
        if isinstance(value, bytes):
            return value.decode()
        return value

"""Whether Redis lost its data, and whether every replica has written its own back since.

``p epoch`` holds a random token: a new one means Redis lost its data. The
replica that notices first (it creates the new token) also writes ``p
epoch:settling``: the set of replicas it knew alive, itself included, each
of which must write its clients' registrations back before a lookup that
finds nothing may be trusted. Each takes itself out once it has
(:meth:`RedisEpoch.settled`); the set lasts at most the settling time, for
a replica that died meanwhile, or one the first did not know of (``expect``
unknown: the whole settling time). Replicas re-write at once when Redis
answers again (their pub/sub connection back), so the set empties within
milliseconds of Redis's return, not after a fixed wait.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import redis.asyncio as aredis

Call = Callable[[str, Awaitable[Any]], Awaitable[Any]]

#: The member that keeps the settling set for its whole time: the replicas to wait for are unknown.
UNKNOWN = "?"

# KEYS: epoch, settling. ARGV: a fresh token, the settling time in ms (0: none), the replicas to wait for.
_NEW_EPOCH = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX') then
  if tonumber(ARGV[2]) > 0 and #ARGV > 2 then
    redis.call('DEL', KEYS[2])
    redis.call('SADD', KEYS[2], unpack(ARGV, 3))
    redis.call('PEXPIRE', KEYS[2], ARGV[2])
  end
  return {1, ARGV[1]}
end
return {0, redis.call('GET', KEYS[1])}
"""


class RedisEpoch:
    """One replica's view of ``p epoch`` (see the module docstring); ``call`` wraps a command's errors."""

    def __init__(self, redis: aredis.Redis, *, prefix: str, replica_id: str, call: Call) -> None:
        self._r = redis
        self._key, self._settling = f"{prefix}epoch", f"{prefix}epoch:settling"
        self.replica_id = replica_id
        self._call = call
        self._new = redis.register_script(_NEW_EPOCH)
        self.token: bytes | None = None

    async def check_reset(self, *, settle: float = 0.0, expect: Iterable[str] | None = None) -> bool:
        """True if Redis lost its data since this replica's previous call (the first only records the
        token, creating one if needed). The replica that notices first marks the store settling for at
        most ``settle`` seconds, until itself and ``expect`` have each called :meth:`settled`."""
        waiting = [UNKNOWN] if expect is None else sorted({self.replica_id, *expect})
        ms = max(1, int(settle * 1000)) if settle > 0 and self.token is not None else 0
        keys = [self._key, self._settling]
        created, current = await self._call("check_reset", self._new(keys=keys, args=[uuid.uuid4().hex, ms, *waiting]))
        known, self.token = self.token, current
        return known is not None and current != known

    async def settled(self) -> None:
        """This replica has written its registrations back: lookups need not wait for it."""
        await self._call("settled", self._r.srem(self._settling, self.replica_id))

    async def lost_data(self) -> bool:
        """True if the token this replica recorded is gone or replaced, or some replica has not written
        its registrations back yet (read-only, unlike :meth:`check_reset`)."""
        if self.token is None:
            return False
        pipe = self._r.pipeline(transaction=False)
        pipe.get(self._key)
        pipe.exists(self._settling)
        current, settling = await self._call("lost_data", pipe.execute())
        return bool(current != self.token or settling)

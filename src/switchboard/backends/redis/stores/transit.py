"""Clients in transit, in Redis: the part of :class:`RedisRegistry` every replica agrees on.

Layout (``p`` = ``key_prefix``):

* ``p transit``       sorted set ``<ws>/<cid>`` scored by the end of its grace (ms, Redis's clock)
* ``p transit:left``  hash ``<ws>/<cid>`` → when it left (ms, Redis's clock)

Deadlines are read and written on Redis's own clock (``TIME`` inside the
scripts), so replicas on machines whose clocks differ still agree on when a
grace is over. A client in transit keeps its registrations and its owner
entry; whichever replica it comes back to takes the ownership over in the
same script that ends the transit, and whoever first finds the grace over
removes the registrations in the script that ends it: exactly one replica
then announces the departure.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from switchboard.backends.base import Expiry
from switchboard.backends.redis.shared.batch import Batcher
from switchboard.backends.redis.stores.client_fields import INDEX_LUA
from switchboard.errors import BackendError

_TRIES = 5  # scripts refused because the owner changed between tries: rare, a few tries suffice


@dataclass(frozen=True, slots=True)
class TransitKeys:
    """The registry's key names that the transit scripts touch (``p`` = its prefix)."""

    prefix: str

    @property
    def transit(self) -> str:
        return f"{self.prefix}transit"

    @property
    def transit_left(self) -> str:
        return f"{self.prefix}transit:left"

    @property
    def holder(self) -> str:
        return f"{self.prefix}holder"

    @property
    def owner(self) -> str:
        return f"{self.prefix}owner"

    @property
    def workspaces(self) -> str:
        return f"{self.prefix}workspaces"

    def svc(self, workspace: str) -> str:
        return f"{self.prefix}svc:{workspace}"

    def index(self, workspace: str) -> str:
        """Which fields of :meth:`svc` each client has (:mod:`.client_fields`)."""
        return f"{self.prefix}svcidx:{workspace}"

    def clients(self, replica_id: str) -> str:
        return f"{self.prefix}replica:{replica_id}:clients"


Call = Callable[[str, Awaitable[Any]], Awaitable[Any]]

_NOW = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: owner hash, transit zset, transit:left hash. ARGV: "<ws>/<cid>", owner, grace ms.
# Refused (0) once another replica owns the client: it is back already.
BEGIN = (
    _NOW
    + """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if current and current ~= ARGV[2] then return 0 end
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 1 end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], now)
return 1
"""
)

# KEYS: transit zset, transit:left hash, owner hash, the new owner's clients set, the old owner's.
# ARGV: "<ws>/<cid>", new owner, the old owner guessed (whose clients set KEYS[5] is).
# Returns the ms the client was in transit, -1 if it was not; {'retry', owner} if the guess was wrong.
END = (
    _NOW
    + """
local old = redis.call('HGET', KEYS[3], ARGV[1])
if old and old ~= ARGV[2] and old ~= ARGV[3] then return {'retry', old} end
local left = redis.call('HGET', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if old and old ~= ARGV[2] then
  redis.call('SREM', KEYS[5], ARGV[1])
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
  redis.call('SADD', KEYS[4], ARGV[1])
end
if not left then return -1 end
return math.max(0, now - tonumber(left))
"""
)

# KEYS: transit zset, transit:left hash, svc hash, workspaces set, owner hash, the owner's clients set,
# holder hash, svc index hash.
# ARGV: "<ws>/<cid>", cid, ws, the owner guessed (whose clients set KEYS[6] is).
# {'none'} | {'waiting', ms left} | {'expired', info...} | {'retry', owner} if the guess was wrong
EXPIRE = (
    _NOW
    + INDEX_LUA
    + """
local deadline = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not deadline then return {'none'} end
if tonumber(deadline) > now then return {'waiting', tostring(tonumber(deadline) - now)} end
local owner = redis.call('HGET', KEYS[5], ARGV[1])
if owner and owner ~= ARGV[4] then return {'retry', owner} end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
local out = {'expired'}
remove_fields(KEYS[3], KEYS[8], ARGV[2], out)
if redis.call('HLEN', KEYS[3]) == 0 then redis.call('SREM', KEYS[4], ARGV[3]) end
if owner then
  redis.call('SREM', KEYS[6], ARGV[1])
  redis.call('HDEL', KEYS[5], ARGV[1])
end
redis.call('HDEL', KEYS[7], ARGV[1])
return out
"""
)

# KEYS: transit zset. Every client whose grace is over, oldest first (bounded).
DUE = (
    _NOW
    + """
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
"""
)


class RedisTransit:
    """The transit methods of :class:`~switchboard.backends.redis.stores.registry.RedisRegistry`.

    The registry owns the client and the key layout and hands this what it
    needs: ``call`` is its way of awaiting a command (Redis errors become
    :class:`~switchboard.errors.BackendError` there), the key names are
    those its own scripts use, since ending a transit also moves ownership,
    and ``batch`` sends a crowd's per-client scripts in shared pipelines.
    """

    def __init__(self, redis: Any, keys: TransitKeys, call: Call, batch: Batcher) -> None:
        self._k = keys
        self._call = call
        self._batch = batch
        self._begin = redis.register_script(BEGIN)
        self._end = redis.register_script(END)
        self._expire = redis.register_script(EXPIRE)
        self._due = redis.register_script(DUE)

    async def begin_transit(self, workspace: str, client_id: str, *, owner: str, grace: float) -> bool:
        k = self._k
        keys = [k.owner, k.transit, k.transit_left]
        args = [f"{workspace}/{client_id}", owner, int(grace * 1000)]
        return bool(await self._call("begin_transit", self._batch.run(self._begin, keys, args)))

    async def end_transit(self, workspace: str, client_id: str, *, owner: str) -> float | None:
        k = self._k
        old = owner  # guessed; a wrong guess costs one more round trip (every key is in KEYS)
        for _ in range(_TRIES):
            keys = [k.transit, k.transit_left, k.owner, k.clients(owner), k.clients(old)]
            args = [f"{workspace}/{client_id}", owner, old]
            reply = await self._call("end_transit", self._batch.run(self._end, keys, args))
            if not isinstance(reply, list):
                away = int(reply)
                return None if away < 0 else away / 1000
            old = reply[1].decode()
        raise BackendError(f"end_transit of {workspace}/{client_id}: its owner kept changing")

    async def expire_transit(self, workspace: str, client_id: str) -> Expiry:
        k = self._k
        owner = ""
        for _ in range(_TRIES):
            keys = [
                k.transit,
                k.transit_left,
                k.svc(workspace),
                k.workspaces,
                k.owner,
                k.clients(owner),
                k.holder,
                k.index(workspace),
            ]
            args = [f"{workspace}/{client_id}", client_id, workspace, owner]
            reply = await self._call("expire_transit", self._batch.run(self._expire, keys, args))
            if reply[0] != b"retry":
                break
            owner = reply[1].decode()
        else:
            raise BackendError(f"expire_transit of {workspace}/{client_id}: its owner kept changing")
        state = reply[0].decode()
        if state == "waiting":
            return Expiry("waiting", remaining=int(reply[1]) / 1000)
        if state == "expired":
            return Expiry("expired", removed=[json.loads(raw) for raw in reply[1:]])
        return Expiry("none")

    async def transits_due(self, limit: int = 100) -> list[str]:
        raw = await self._call("transits_due", self._due(keys=[self._k.transit], args=[limit]))
        return [m.decode() for m in raw]

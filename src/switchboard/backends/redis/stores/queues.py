"""The task queues of ``public/queue`` in Redis, shared by every replica (:mod:`switchboard.backends.queues`).

All keys share one hash tag (``p {queues}:…``, one slot of a cluster), so each
operation is one script:

* ``p {queues}:q:<ws>/<queue>``  list of item ids, oldest first
* ``p {queues}:i:<id>``          the item: ``<principal>\\n<workspace>\\n<JSON>``, expiring with its lifetime
* ``p {queues}:ws:<ws>``, ``p {queues}:by:<principal>``, ``p {queues}:all``  sorted sets of the live item
  ids, scored by expiry (ms): the charges a push checks against the bounds

Each script first drops what has expired (the charges whose time passed, the
ids at a queue's head whose item is gone), a few at a time, each once; a pop
removes its item and its charges. A list and the sets expire with their newest
item, so nothing outlives what it counts.
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import RedisError

from switchboard.backends.queues import QueueBounds, QueueRefusal, new_item_id, refused
from switchboard.clock import Clock
from switchboard.errors import BackendError

# Drops ids at the head of KEYS[1] whose item (ARGV[1] .. id) expired, at most 64.
_TRIM = """
local function trim(list, prefix)
  for _ = 1, 64 do
    local head = redis.call('LINDEX', list, 0)
    if not head or redis.call('EXISTS', prefix .. head) == 1 then return end
    redis.call('LPOP', list)
  end
end
"""

# KEYS: list, item, ws set, principal set, all set. ARGV: item prefix, id, value, until ms, now ms,
# per workspace, per principal, total. Returns the list's length, or -1/-2/-3 (workspace/principal/hub full).
_PUSH = (
    _TRIM
    + """
local now, untl = tonumber(ARGV[5]), tonumber(ARGV[4])
for i = 3, 5 do redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now) end
if redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[6]) then return -1 end
if redis.call('ZCARD', KEYS[4]) >= tonumber(ARGV[7]) then return -2 end
if redis.call('ZCARD', KEYS[5]) >= tonumber(ARGV[8]) then return -3 end
trim(KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[3], 'PX', math.max(1, untl - now))
redis.call('RPUSH', KEYS[1], ARGV[2])
for i = 3, 5 do redis.call('ZADD', KEYS[i], untl, ARGV[2]) end
for _, k in ipairs({KEYS[1], KEYS[3], KEYS[4], KEYS[5]}) do
  local ttl = redis.call('PTTL', k)
  if ttl < 0 or ttl < untl - now then redis.call('PEXPIRE', k, math.max(1, untl - now)) end
end
return redis.call('LLEN', KEYS[1])
"""
)

# KEYS: list, all set. ARGV: item prefix, set prefix. Returns the oldest live item's JSON, or nil.
_POP = """
for _ = 1, 64 do
  local id = redis.call('LPOP', KEYS[1])
  if not id then return false end
  local value = redis.call('GET', ARGV[1] .. id)
  if value then
    redis.call('DEL', ARGV[1] .. id)
    local principal, ws, text = string.match(value, '^([^\\n]*)\\n([^\\n]*)\\n(.*)$')
    redis.call('ZREM', ARGV[2] .. 'by:' .. principal, id)
    redis.call('ZREM', ARGV[2] .. 'ws:' .. ws, id)
    redis.call('ZREM', KEYS[2], id)
    return text
  end
end
return false
"""

# KEYS: list. ARGV: item prefix. Returns the length, once expired ids at its head are dropped.
_LENGTH = (
    _TRIM
    + """
trim(KEYS[1], ARGV[1])
return redis.call('LLEN', KEYS[1])
"""
)


class RedisQueues:
    def __init__(self, redis: Any, *, clock: Clock, bounds: QueueBounds, key_prefix: str = "sb:") -> None:
        self._r = redis
        self.clock = clock
        self.bounds = bounds
        self._space = f"{key_prefix}{{queues}}:"
        self._push = redis.register_script(_PUSH)
        self._pop = redis.register_script(_POP)
        self._length = redis.register_script(_LENGTH)

    def _list(self, workspace: str, queue: str) -> str:
        return f"{self._space}q:{workspace}/{queue}"

    async def push(self, workspace: str, queue: str, item: str, *, principal: str, until: float) -> int:
        s = self._space
        item_id = new_item_id()
        b = self.bounds
        keys = [self._list(workspace, queue), f"{s}i:{item_id}", f"{s}ws:{workspace}", f"{s}by:{principal}", f"{s}all"]
        value = f"{principal}\n{workspace}\n{item}"
        now = self.clock.time()
        args = [f"{s}i:", item_id, value, int(until * 1000), int(now * 1000), b.per_workspace, b.per_principal, b.total]
        try:
            answer = int(await self._push(keys=keys, args=args))
        except RedisError as exc:
            raise BackendError(f"queue {queue} of {workspace} unavailable, please retry: {exc}") from exc
        if answer < 0:
            kinds: tuple[QueueRefusal, ...] = ("workspace", "principal", "total")
            kind = kinds[-answer - 1]
            raise refused(kind, b, workspace=workspace, principal=principal)
        return answer

    async def pop(self, workspace: str, queue: str) -> str | None:
        s = self._space
        try:
            text = await self._pop(keys=[self._list(workspace, queue), f"{s}all"], args=[f"{s}i:", s])
        except RedisError as exc:
            raise BackendError(f"queue {queue} of {workspace} unavailable, please retry: {exc}") from exc
        return None if text is None else _text(text)

    async def peek(self, workspace: str, queue: str, n: int) -> list[str]:
        s = self._space
        try:
            ids = await self._r.lrange(self._list(workspace, queue), 0, n - 1)
            values = await self._r.mget([f"{s}i:{_text(i)}" for i in ids]) if ids else []
        except RedisError as exc:
            raise BackendError(f"queue {queue} of {workspace} unavailable, please retry: {exc}") from exc
        return [_text(v).split("\n", 2)[2] for v in values if v is not None]

    async def length(self, workspace: str, queue: str) -> int:
        try:
            return int(await self._length(keys=[self._list(workspace, queue)], args=[f"{self._space}i:"]))
        except RedisError as exc:
            raise BackendError(f"queue {queue} of {workspace} unavailable, please retry: {exc}") from exc

    async def held_by(self, principal: str) -> int:
        return int(await self._r.zcard(f"{self._space}by:{principal}"))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

"""Replicas' presence records in Redis: who is alive, and what each last said about itself.

* ``sb:presence:<replica>``  a hash with a short TTL, rewritten every few seconds
  (address, clients, subscription health, running totals); expired = gone.
* ``sb:replicas``            every replica that announced itself, until the
  leader forgets it, so finding the dead needs no keyspace scan.
* ``sb:leader``              the leader lease's key (its holder, ``<replica>#<start>``).

Redis's errors become :class:`~switchboard.errors.BackendError` here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import RedisError

from switchboard.errors import BackendError

if TYPE_CHECKING:
    import redis.asyncio as aredis

T = TypeVar("T")

PRESENCE_PREFIX = "sb:presence:"
LEADER_KEY = "sb:leader"
REPLICAS_KEY = "sb:replicas"  # every replica that announced itself, until the leader forgets it


def presence_keys(key_prefix: str = "sb:") -> tuple[str, str, str]:
    """``(presence prefix, leader key, replicas key)`` under ``key_prefix`` (a cluster's is hash-tagged)."""
    return f"{key_prefix}presence:", f"{key_prefix}leader", f"{key_prefix}replicas"


async def _call(what: str, op: Awaitable[T]) -> T:
    try:
        return await op
    except (RedisError, OSError) as exc:
        raise BackendError(f"presence: {what} failed: {exc}") from exc


class RedisPresence:
    """This replica's presence record, and what the others' say (a ``PresenceStore``).

    ``writer`` (default ``redis``) rewrites the record: a client of its own, so that the
    record keeps its deadline while the clients' commands fill ``redis``'s pool (an
    expired record counts as a dead replica, and its clients are reaped).
    """

    def __init__(self, redis: Any, *, replica_id: str, key_prefix: str = "sb:", writer: Any = None) -> None:
        self.redis = redis
        self.writer = redis if writer is None else writer
        self.replica_id = replica_id
        self._prefix = key_prefix
        self._presence, self._leader, self._replicas = presence_keys(key_prefix)

    async def write(self, fields: Mapping[str, Any], *, ttl: float) -> None:
        """Rewrite this replica's record, alive for ``ttl`` seconds more."""
        key = self._presence + self.replica_id

        async def write() -> None:
            async with self.writer.pipeline(transaction=True) as pipe:
                pipe.hset(key, mapping=dict(fields))
                pipe.pexpire(key, int(ttl * 1000))
                pipe.sadd(self._replicas, self.replica_id)
                await pipe.execute()

        await _call("write", write())

    async def remove(self) -> None:
        """A clean shutdown: this replica's record goes, and only its own."""
        await _call("remove", self.redis.delete(self._presence + self.replica_id))
        await _call("remove", self.redis.srem(self._replicas, self.replica_id))

    async def known_and_live(self) -> tuple[set[str], set[str]]:
        """Replicas that ever announced themselves, and those whose record is current.

        One set read and one pipelined EXISTS per replica: the cost does not
        grow with the number of clients.
        """

        async def read() -> tuple[set[str], set[str]]:
            known = sorted(m.decode() for m in await self.redis.smembers(self._replicas))
            async with self.redis.pipeline(transaction=False) as pipe:
                for replica in known:
                    pipe.exists(self._presence + replica)
                alive = await pipe.execute()
            return set(known), {r for r, up in zip(known, alive, strict=True) if up}

        return await _call("read", read())

    async def forget(self, replica_id: str) -> None:
        """Drop a dead replica from the list of those that announced themselves."""
        await _call("forget", self.redis.srem(self._replicas, replica_id))

    async def read_all(self) -> tuple[list[dict[str, Any]], str | None]:
        """Every live replica's record (sorted by id) and the leader lease's holder."""
        return await _call("read", read_presence(self.redis, self._prefix))


async def read_presence(redis: aredis.Redis, key_prefix: str = "sb:") -> tuple[list[dict[str, Any]], str | None]:
    """The live replicas' presence records (sorted by id) and the leader, on an open client
    (one pipelined round trip per step)."""
    presence, leader_key, replicas_key = presence_keys(key_prefix)
    members = sorted(_text(m) for m in await redis.smembers(replicas_key))
    async with redis.pipeline(transaction=False) as pipe:
        for member in members:
            pipe.hgetall(presence + member)
        pipe.get(leader_key)
        *raws, holder = await pipe.execute()
    # a replica whose presence expired is gone
    replicas = [{k.decode(): v.decode() for k, v in raw.items()} for raw in raws if raw]
    leader = holder.decode().partition("#")[0] if holder else None
    return sorted(replicas, key=lambda r: r.get("id", "")), leader


def _text(value: bytes | str) -> str:
    """A Redis reply as text (the client is made without decode_responses: bytes)."""
    return value.decode() if isinstance(value, bytes) else value

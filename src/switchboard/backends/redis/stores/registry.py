"""The Redis service registry, shared by every replica.

Layout (``p`` = ``key_prefix``, default ``sb:``):

* ``p svc:<ws>``               hash ``<cid>:<svc>`` → service info JSON (a workspace is one HGETALL)
* ``p svcidx:<ws>``            hash ``<cid>`` → JSON list of its fields in ``svc:<ws>`` (:mod:`.client_fields`)
* ``p singleton:<ws>``         set of ``<cid>:<svc>`` registered as ``singleton`` (checked against ``svc:<ws>``
                               when read: a member whose service is gone or no longer a singleton is dropped)
* ``p workspaces``             set of workspaces with at least one service (for ``find("*")``)
* ``p owner``                  hash ``<ws>/<cid>`` → id of the replica the client is connected to
* ``p holder``                 hash ``<ws>/<cid>`` → id of the user holding the client id (until it leaves)
* ``p replica:<rid>:clients``  set of ``<ws>/<cid>`` that replica owns
* ``p epoch``                  a random token; a new one means Redis lost its data
* ``p epoch:settling``         the replicas yet to re-write their registrations after a loss (:mod:`.epoch`)
* ``p transit``, ``p transit:left``  clients in transit (:mod:`switchboard.backends.redis.stores.transit`)

Every multi-key change is one Lua script, so no reader ever sees half of it
and a crash cannot leave a service without its workspace or owner entry.
Nothing here ever deletes keys it does not own (no FLUSH, no broad DEL).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import redis.asyncio as aredis
from redis.exceptions import RedisError

from switchboard.backends.base import Claim, Expiry
from switchboard.backends.redis.shared.batch import Batcher
from switchboard.backends.redis.shared.connection import make_client
from switchboard.backends.redis.stores.claim import CLAIM_LUA
from switchboard.backends.redis.stores.client_fields import INDEX_LUA
from switchboard.backends.redis.stores.epoch import RedisEpoch
from switchboard.backends.redis.stores.stale import RedisStale
from switchboard.backends.redis.stores.transit import RedisTransit, TransitKeys
from switchboard.errors import BackendError, ProtocolError
from switchboard.protocol.hypha.services import ServiceInfo, ServiceQuery, matches, split_full_id

# KEYS: svc hash, workspaces set, owner hash, this replica's clients set, the current owner's clients set,
# svc index hash.
# ARGV: ws, field, json, "<ws>/<cid>", replica id, the owner whose clients set KEYS[5] is, cid.
# Every key is in KEYS (a cluster routes, and reshards, by them): when the client is owned
# by another replica than guessed, {'retry', owner} and the caller tries again with that one.
_REGISTER = (
    INDEX_LUA
    + """
local old = redis.call('HGET', KEYS[3], ARGV[4])
if old and old ~= ARGV[5] and old ~= ARGV[6] then return {'retry', old} end
local prev = redis.call('HGET', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
index_add(KEYS[6], ARGV[7], ARGV[2])
redis.call('SADD', KEYS[2], ARGV[1])
if old and old ~= ARGV[5] then
  redis.call('SREM', KEYS[5], ARGV[4])
end
redis.call('HSET', KEYS[3], ARGV[4], ARGV[5])
redis.call('SADD', KEYS[4], ARGV[4])
return prev
"""
)

# KEYS: svc hash, workspaces set, svc index hash. ARGV: ws, field, cid.
_UNREGISTER = (
    INDEX_LUA
    + """
local prev = redis.call('HGET', KEYS[1], ARGV[2])
if not prev then return false end
redis.call('HDEL', KEYS[1], ARGV[2])
index_remove(KEYS[3], ARGV[3], ARGV[2])
if redis.call('HLEN', KEYS[1]) == 0 then redis.call('SREM', KEYS[2], ARGV[1]) end
return prev
"""
)

# KEYS: svc hash, workspaces set, owner hash, transit zset, transit:left hash, the current owner's clients set,
# holder hash, svc index hash.
# ARGV: ws, cid, "<ws>/<cid>", the owner whose clients set KEYS[6] is, expected owner ("" = any).
# With an expected owner, a client another replica has taken over is left alone.
_REMOVE_CLIENT = (
    INDEX_LUA
    + """
local owner = redis.call('HGET', KEYS[3], ARGV[3])
if owner and owner ~= ARGV[4] and (ARGV[5] == '' or owner == ARGV[5]) then return {'retry', owner} end
local removed = {'removed'}
if ARGV[5] ~= '' and owner and owner ~= ARGV[5] then return removed end
redis.call('ZREM', KEYS[4], ARGV[3])
redis.call('HDEL', KEYS[5], ARGV[3])
redis.call('HDEL', KEYS[7], ARGV[3])
remove_fields(KEYS[1], KEYS[8], ARGV[2], removed)
if redis.call('HLEN', KEYS[1]) == 0 then redis.call('SREM', KEYS[2], ARGV[1]) end
if owner then
  redis.call('SREM', KEYS[6], ARGV[3])
  redis.call('HDEL', KEYS[3], ARGV[3])
end
return removed
"""
)

# KEYS: the replica's clients set, owner hash, workspaces set, transit zset, holder hash, then one svc
# hash per workspace named in ARGV[2..] (the workspaces of the set's members, read before), then
# the svc index hash of each, in the same order.
# ARGV: replica id, then those workspaces. A member of a workspace not passed (it arrived
# meanwhile): {'retry'}.
# Clients another replica has since taken over (owner changed) are left alone, and so
# are clients in transit: their grace decides (whoever they come back to owns them).
_REMOVE_REPLICA = (
    INDEX_LUA
    + """
local svc, idx = {}, {}
for i = 2, #ARGV do
  svc[ARGV[i]] = KEYS[i + 4]
  idx[ARGV[i]] = KEYS[i + 4 + #ARGV - 1]
end
local members = redis.call('SMEMBERS', KEYS[1])
for _, wc in ipairs(members) do
  local slash = string.find(wc, '/', 1, true)
  if not svc[string.sub(wc, 1, slash - 1)] then return {'retry'} end
end
local removed = {'removed'}
for _, wc in ipairs(members) do
  if redis.call('HGET', KEYS[2], wc) == ARGV[1] and not redis.call('ZSCORE', KEYS[4], wc) then
    local slash = string.find(wc, '/', 1, true)
    local ws = string.sub(wc, 1, slash - 1)
    local key = svc[ws]
    remove_fields(key, idx[ws], string.sub(wc, slash + 1), removed)
    if redis.call('HLEN', key) == 0 then redis.call('SREM', KEYS[3], ws) end
    redis.call('HDEL', KEYS[2], wc)
    redis.call('HDEL', KEYS[5], wc)
  end
end
redis.call('DEL', KEYS[1])
return removed
"""
)

# KEYS: holder hash, owner hash, the claiming replica's clients set, the guessed previous owner's clients set.
# ARGV: "<ws>/<cid>", user id, replica id, the previous owner guessed (whose clients set KEYS[4] is).
# {holder, ""} when another user holds the id (nothing changes), else {"", previous owner or ""};
# {"?", owner} if the guess was wrong ("?" is no user id: outside the id grammar).
_CLAIM = (
    CLAIM_LUA
    + """
local status, value = claim(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
if status == 'held' then return {value, ''} end
if status == '?' then return {'?', value} end
return {'', value}
"""
)

# KEYS: owner hash, workspaces set, this replica's clients set, then the svc hash of each info, then
# the svc index hash of each.
# ARGV: replica id, then (ws, field, "<ws>/<cid>", json) per info, in the order of their KEYS.
# A client now owned by another replica is skipped: the peer's copy is newer.
_REASSERT = (
    INDEX_LUA
    + """
local written = 0
local infos = (#ARGV - 1) / 4
for n = 0, infos - 1 do
  local i = 2 + n * 4
  local ws, field, wc, value = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local owner = redis.call('HGET', KEYS[1], wc)
  if (not owner) or owner == ARGV[1] then
    redis.call('HSET', KEYS[4 + n], field, value)
    index_add(KEYS[4 + infos + n], string.sub(wc, string.find(wc, '/', 1, true) + 1), field)
    redis.call('SADD', KEYS[2], ws)
    redis.call('HSET', KEYS[1], wc, ARGV[1])
    redis.call('SADD', KEYS[3], wc)
    written = written + 1
  end
end
return written
"""
)

_CAS_TRIES = 5  # a script refused because the owner changed between read and write is rare: a few tries


def _retry_with(reply: Any) -> str | None:
    """The owner to try again with, if the script refused for lack of that owner's key."""
    if isinstance(reply, list) and reply[:1] == [b"retry"]:
        return str(reply[1].decode()) if len(reply) > 1 else ""
    return None


def _is_singleton(info: ServiceInfo) -> bool:
    return bool((info.get("config") or {}).get("singleton"))


def _decode(raw: bytes | str) -> ServiceInfo:
    info: ServiceInfo = json.loads(raw)
    return info


class RedisRegistry:
    """:class:`~switchboard.backends.base.Registry` in Redis, with per-replica ownership.

    ``redis`` is a client (left open on :meth:`close`) or a URL (a client with
    explicit retries is made, and closed on :meth:`close`).
    """

    def __init__(self, redis: aredis.Redis | str, *, replica_id: str, key_prefix: str = "sb:") -> None:
        self._owns_client = isinstance(redis, str)
        self._r = make_client(redis) if isinstance(redis, str) else redis
        self.replica_id = replica_id
        self._p = key_prefix
        self._ws_key = f"{key_prefix}workspaces"
        self._owner_key = f"{key_prefix}owner"
        self._epoch = RedisEpoch(self._r, prefix=key_prefix, replica_id=replica_id, call=self._call)
        self._register = self._r.register_script(_REGISTER)
        self._unregister = self._r.register_script(_UNREGISTER)
        self._remove_client = self._r.register_script(_REMOVE_CLIENT)
        self._remove_replica = self._r.register_script(_REMOVE_REPLICA)
        self._reassert = self._r.register_script(_REASSERT)
        self._claim = self._r.register_script(_CLAIM)
        self._keys = TransitKeys(key_prefix)
        self._transit_key = self._keys.transit
        # a crowd leaving (or coming back) at once: its per-client scripts go in a few pipelines
        self._batch = Batcher(self._r)
        self._transit = RedisTransit(self._r, self._keys, self._call, self._batch)
        # after a failover: this replica's clients' entries that came back although deleted
        self.stale = RedisStale(self._r, self._keys, replica_id, self._call, self._batch)

    def _svc_key(self, workspace: str) -> str:
        return self._keys.svc(workspace)

    def _singleton_key(self, workspace: str) -> str:
        return f"{self._p}singleton:{workspace}"

    def _clients_key(self, replica_id: str) -> str:
        return self._keys.clients(replica_id)

    async def _call(self, what: str, coro: Any) -> Any:
        try:
            return await coro
        except RedisError as exc:
            raise BackendError(f"registry {what} failed: {exc}") from exc

    # -- Registry -------------------------------------------------------------

    async def register(self, info: ServiceInfo, *, encoded: str | None = None) -> ServiceInfo | None:
        ws, cid, svc = split_full_id(info["id"])
        text = json.dumps(info) if encoded is None else encoded
        wc = f"{ws}/{cid}"
        owner = self.replica_id  # the usual case: our own client, or nobody's yet
        for _ in range(_CAS_TRIES):
            keys = [
                self._svc_key(ws),
                self._ws_key,
                self._owner_key,
                self._clients_key(self.replica_id),
                self._clients_key(owner),
                self._keys.index(ws),
            ]
            args = [ws, f"{cid}:{svc}", text, wc, self.replica_id, owner, cid]
            prev = await self._call("register", self._batch.run(self._register, keys, args))
            if (retry := _retry_with(prev)) is None:
                if _is_singleton(info):
                    await self._call("register", self._r.sadd(self._singleton_key(ws), f"{cid}:{svc}"))
                return None if prev is None else _decode(prev)
            owner = retry
        raise BackendError(f"registry register failed: the owner of {wc} kept changing")

    async def unregister(self, service_id: str) -> ServiceInfo | None:
        try:
            ws, cid, svc = split_full_id(service_id)
        except ProtocolError:
            return None  # as the memory registry: a malformed id is simply not there
        keys = [self._svc_key(ws), self._ws_key, self._keys.index(ws)]
        prev = await self._call("unregister", self._unregister(keys=keys, args=[ws, f"{cid}:{svc}", cid]))
        return None if prev is None else _decode(prev)

    async def remove_client(self, workspace: str, client_id: str, *, owner: str | None = None) -> list[ServiceInfo]:
        wc = f"{workspace}/{client_id}"
        current = owner or self.replica_id
        for _ in range(_CAS_TRIES):
            keys = [
                self._svc_key(workspace),
                self._ws_key,
                self._owner_key,
                self._transit_key,
                self._keys.transit_left,
                self._clients_key(current),
                self._keys.holder,
                self._keys.index(workspace),
            ]
            args = [workspace, client_id, wc, current, owner or ""]
            removed = await self._call("remove_client", self._batch.run(self._remove_client, keys, args))
            if (retry := _retry_with(removed)) is None:
                return [_decode(raw) for raw in removed[1:]]
            current = retry
        raise BackendError(f"registry remove_client failed: the owner of {wc} kept changing")

    # -- who holds a client id ---------------------------------------------------

    async def holder(self, workspace: str, client_id: str) -> str | None:
        raw = await self._call("holder", self._r.hget(self._keys.holder, f"{workspace}/{client_id}"))
        return None if raw is None else str(raw.decode())

    async def claim(self, workspace: str, client_id: str, *, user: str, owner: str) -> Claim:
        wc = f"{workspace}/{client_id}"
        previous = owner  # guessed; a wrong guess costs one more round trip (every key is in KEYS)
        for _ in range(_CAS_TRIES):
            keys = [self._keys.holder, self._owner_key, self._clients_key(owner), self._clients_key(previous)]
            reply = await self._call("claim", self._claim(keys=keys, args=[wc, user, owner, previous]))
            holder, old = (v.decode() for v in reply)
            if holder != "?":
                return Claim(holder=holder or None, previous_owner=old or None)
            previous = old
        raise BackendError(f"registry claim failed: the owner of {wc} kept changing")

    # -- clients in transit (backends/redis/stores/transit.py) -------------------------

    async def begin_transit(self, workspace: str, client_id: str, *, owner: str, grace: float) -> bool:
        return await self._transit.begin_transit(workspace, client_id, owner=owner, grace=grace)

    async def end_transit(self, workspace: str, client_id: str, *, owner: str) -> float | None:
        return await self._transit.end_transit(workspace, client_id, owner=owner)

    async def expire_transit(self, workspace: str, client_id: str) -> Expiry:
        return await self._transit.expire_transit(workspace, client_id)

    async def transits_due(self, limit: int = 100) -> list[str]:
        return await self._transit.transits_due(limit)

    async def find(self, query: ServiceQuery) -> list[ServiceInfo]:
        """One round trip for a workspace (HGET for an exact id); two for ``*``."""
        if query.workspace == "*":
            workspaces = sorted(await self._call("find", self._r.smembers(self._ws_key)))
            pipe = self._r.pipeline(transaction=False)
            for ws in workspaces:
                pipe.hvals(self._svc_key(ws.decode()))
            raws = [raw for values in await self._call("find", pipe.execute()) for raw in values]
        elif query.client_id != "*" and query.service_id != "*":
            field = f"{query.client_id}:{query.service_id}"
            raw = await self._call("find", self._r.hget(self._svc_key(query.workspace), field))
            raws = [] if raw is None else [raw]
        else:
            raws = await self._call("find", self._r.hvals(self._svc_key(query.workspace)))
        infos = (_decode(raw) for raw in raws)
        return [info for info in infos if matches(info, query)]

    async def singletons(self, workspace: str, name: str) -> list[ServiceInfo]:
        """Two round trips at most, whatever the size of the workspace (one while it has no singleton)."""
        key = self._singleton_key(workspace)
        fields = sorted(await self._call("singletons", self._r.smembers(key)))
        if not fields:
            return []
        raws = await self._call("singletons", self._r.hmget(self._svc_key(workspace), fields))
        found: list[ServiceInfo] = []
        stale: list[bytes] = []
        for field, raw in zip(fields, raws, strict=True):
            info = None if raw is None else _decode(raw)
            if info is None or not _is_singleton(info):
                stale.append(field)
            elif matches(info, ServiceQuery(workspace, "*", name)):
                found.append(info)
        if stale:  # gone, or registered again without the flag; a racing re-registration SADDs after its write
            still = await self._call("singletons", self._r.hmget(self._svc_key(workspace), stale))
            gone = [f for f, raw in zip(stale, still, strict=True) if raw is None or not _is_singleton(_decode(raw))]
            if gone:
                await self._call("singletons", self._r.srem(key, *gone))
        return found

    async def close(self) -> None:
        """Shared state stays in Redis for the other replicas; only our client is closed."""
        await self._batch.close()
        if self._owns_client:
            await self._r.aclose()

    # -- ownership, for the reaper and for recovery ---------------------------

    async def owned_by(self, replica_id: str) -> list[tuple[str, str]]:
        """``(workspace, client_id)`` of every client ``replica_id`` owns, sorted."""
        members = await self._call("owned_by", self._r.smembers(self._clients_key(replica_id)))
        pairs = (m.decode().partition("/") for m in members)
        return sorted((ws, cid) for ws, _, cid in pairs)

    async def owners(self) -> dict[str, str]:
        """``<ws>/<cid>`` → replica id, for every client with registrations."""
        raw = await self._call("owners", self._r.hgetall(self._owner_key))
        return {k.decode(): v.decode() for k, v in raw.items()}

    async def remove_replica_state(self, replica_id: str) -> list[ServiceInfo]:
        """Remove the registrations of ``replica_id``'s clients (a dead replica); return them.

        Only that replica's keys and clients: a client a peer has taken over
        keeps its registrations, and no peer key is touched.
        """
        for _ in range(_CAS_TRIES):
            members = await self._call("remove_replica_state", self._r.smembers(self._clients_key(replica_id)))
            workspaces = sorted({m.decode().partition("/")[0] for m in members})
            keys = [self._clients_key(replica_id), self._owner_key, self._ws_key, self._transit_key, self._keys.holder]
            keys += [self._svc_key(ws) for ws in workspaces] + [self._keys.index(ws) for ws in workspaces]
            reply = await self._call(
                "remove_replica_state", self._remove_replica(keys=keys, args=[replica_id, *workspaces])
            )
            if _retry_with(reply) is None:
                return [_decode(raw) for raw in reply[1:]]
        raise BackendError(f"registry remove_replica_state failed: {replica_id}'s clients kept changing")

    async def reassert(self, infos: Iterable[ServiceInfo]) -> int:
        """Re-write this replica's ``infos`` (after Redis came back empty); return how many.

        Infos of clients a peer now owns are skipped.
        """
        args: list[str] = [self.replica_id]
        svc_keys: list[str] = []
        index_keys: list[str] = []
        singletons: list[tuple[str, str]] = []
        for info in infos:
            ws, cid, svc = split_full_id(info["id"])
            args += [ws, f"{cid}:{svc}", f"{ws}/{cid}", json.dumps(info)]
            if _is_singleton(info):
                singletons.append((ws, f"{cid}:{svc}"))
            svc_keys.append(self._svc_key(ws))
            index_keys.append(self._keys.index(ws))
        if not svc_keys:
            return 0
        keys = [self._owner_key, self._ws_key, self._clients_key(self.replica_id), *svc_keys, *index_keys]
        count = int(await self._call("reassert", self._reassert(keys=keys, args=args)))
        if singletons:  # a member whose client a peer owns now is checked, and dropped if stale, when read
            pipe = self._r.pipeline(transaction=False)
            for ws, field in singletons:
                pipe.sadd(self._singleton_key(ws), field)
            await self._call("reassert", pipe.execute())
        return count

    async def check_reset(self, *, settle: float = 0.0, expect: Iterable[str] | None = None) -> bool:
        """True if Redis lost its data since this replica's previous call (then :meth:`reassert`, then
        :meth:`settled`); see :class:`~switchboard.backends.redis.stores.epoch.RedisEpoch`."""
        return await self._epoch.check_reset(settle=settle, expect=expect)

    async def settled(self) -> None:
        """This replica's registrations are written back after a loss."""
        await self._epoch.settled()

    async def lost_data(self) -> bool:
        """True while a loss is not yet made good by every replica (read-only)."""
        return await self._epoch.lost_data()

    def __repr__(self) -> str:
        return f"RedisRegistry(replica={self.replica_id!r}, prefix={self._p!r})"

"""Entries of a replica's clients that a failover brought back: read them, remove them (compared).

What is stale is decided by :mod:`switchboard.replicas.upkeep.stale` (I/O-free);
this reads the registry's side of the comparison for the clients one replica
owns (:meth:`RedisStale.owned`, a few round trips whatever their number) and
removes what was decided (:meth:`RedisStale.remove`, one script per client,
sent together through the registry's :class:`~.batch.Batcher`). The script
deletes a service only if its stored value is still the one read, and a
client only if this replica still owns it, it is not in transit and none of
its services changed: whatever was written since the read stays.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable
from typing import Any

from switchboard.backends.owned import Recorded, Stale
from switchboard.backends.redis.shared.batch import Batcher
from switchboard.backends.redis.stores.client_fields import INDEX_LUA
from switchboard.backends.redis.stores.transit import Call, TransitKeys
from switchboard.protocol.hypha.services import ServiceInfo

# KEYS: owner hash, transit zset, this replica's clients set, holder hash, svc hash, svc index hash,
# workspaces set.
# ARGV: replica id, "<ws>/<cid>", cid, ws, "1" if the client departed, then (field, value read) pairs.
# {'gone' | 'kept', the values removed...}; {} if the client is another replica's now, or (departed)
# in transit or changed since the read (a value, or how many services its index entry lists).
_REMOVE_STALE = (
    INDEX_LUA
    + """
if redis.call('HGET', KEYS[1], ARGV[2]) ~= ARGV[1] then return {} end
local departed = ARGV[5] == '1'
if departed then
  if redis.call('ZSCORE', KEYS[2], ARGV[2]) then return {} end
  local raw = redis.call('HGET', KEYS[6], ARGV[3])
  local listed = raw and cjson.decode(raw) or {}
  if #listed * 2 ~= #ARGV - 5 then return {} end  -- a service added (or removed) since the read
  for i = 6, #ARGV, 2 do
    if redis.call('HGET', KEYS[5], ARGV[i]) ~= ARGV[i + 1] then return {} end
  end
end
local out = {departed and 'gone' or 'kept'}
for i = 6, #ARGV, 2 do
  if redis.call('HGET', KEYS[5], ARGV[i]) == ARGV[i + 1] then
    redis.call('HDEL', KEYS[5], ARGV[i])
    index_remove(KEYS[6], ARGV[3], ARGV[i])
    table.insert(out, ARGV[i + 1])
  end
end
if redis.call('HLEN', KEYS[5]) == 0 then redis.call('SREM', KEYS[7], ARGV[4]) end
if departed then
  redis.call('HDEL', KEYS[1], ARGV[2])
  redis.call('SREM', KEYS[3], ARGV[2])
  redis.call('HDEL', KEYS[4], ARGV[2])
end
return out
"""
)


class RedisStale:
    """The registry's side of undoing lost deletes, for replica ``replica_id`` (a part of
    :class:`~.registry.RedisRegistry`, which hands it its client, key names, error translation
    and batcher)."""

    def __init__(self, redis: Any, keys: TransitKeys, replica_id: str, call: Call, batch: Batcher) -> None:
        self._r = redis
        self._k = keys
        self.replica_id = replica_id
        self._call = call
        self._batch = batch
        self._remove = redis.register_script(_REMOVE_STALE)

    async def owned(self, wanted: Callable[[str, str], bool] = lambda client, field: True) -> list[Recorded]:
        """What the registry holds for every client it says this replica owns: three round trips
        (the replica's clients; their owners, transit marks and index entries; their services).

        Only the values of the fields ``wanted(client, field)`` are read (the others, the services
        a live client holds, come with the value ``""``): a look after a failover costs what may
        be stale, not every service's description.
        """
        k = self._k
        raw = await self._call("owned", self._r.smembers(k.clients(self.replica_id)))
        clients = sorted(m.decode() for m in raw)
        if not clients:
            return []
        by_ws: dict[str, list[str]] = {}
        for wc in clients:
            ws, _, cid = wc.partition("/")
            by_ws.setdefault(ws, []).append(cid)
        pipe = self._r.pipeline(transaction=False)
        pipe.hmget(k.owner, clients)
        pipe.zmscore(k.transit, clients)
        for ws, cids in by_ws.items():
            pipe.hmget(k.index(ws), cids)
        owners, transit, *indexes = await self._call("owned", pipe.execute())
        mine = {wc for wc, owner in zip(clients, owners, strict=True) if owner == self.replica_id.encode()}
        away = {wc for wc, score in zip(clients, transit, strict=True) if score is not None}
        fields: dict[str, list[str]] = {}
        for (ws, cids), entries in zip(by_ws.items(), indexes, strict=True):
            for cid, entry in zip(cids, entries, strict=True):
                if f"{ws}/{cid}" in mine:
                    fields[f"{ws}/{cid}"] = [str(f) for f in json.loads(entry)] if entry else []
        asked = [(wc, read) for wc in sorted(fields) if (read := [f for f in fields[wc] if wanted(wc, f)])]
        values: list[list[bytes | None]] = []
        if asked:
            pipe = self._r.pipeline(transaction=False)
            for wc, read in asked:
                pipe.hmget(k.svc(wc.partition("/")[0]), read)
            values = await self._call("owned", pipe.execute())
        stored = {wc: dict(zip(read, got, strict=True)) for (wc, read), got in zip(asked, values, strict=True)}

        def services(wc: str) -> dict[str, str]:
            read, out = stored.get(wc, {}), {}
            for f in fields[wc]:
                if f not in read:
                    out[f] = ""  # not read
                elif (value := read[f]) is not None:
                    out[f] = value.decode()
            return out

        return [Recorded(wc, services(wc), in_transit=wc in away) for wc in sorted(fields)]

    async def remove(self, stale: Iterable[Stale]) -> list[tuple[Stale, bool, list[ServiceInfo]]]:
        """Remove ``stale`` entries, each compared in Redis first; per entry: whether the client
        itself went, and the services removed (an entry changed since: nothing)."""
        entries = list(stale)
        k = self._k
        calls = []
        for entry in entries:
            ws, _, cid = entry.client.partition("/")
            keys = [
                k.owner,
                k.transit,
                k.clients(self.replica_id),
                k.holder,
                k.svc(ws),
                k.index(ws),
                k.workspaces,
            ]
            args = [self.replica_id, entry.client, cid, ws, "1" if entry.departed else ""]
            args += [part for item in entry.services.items() for part in item]
            calls.append(self._call("remove_stale", self._batch.run(self._remove, keys, args)))
        replies = await asyncio.gather(*calls)
        return [
            (entry, bool(reply) and reply[0] == b"gone", [json.loads(raw) for raw in reply[1:]])
            for entry, reply in zip(entries, replies, strict=True)
        ]

"""Workspace records and their data on Redis, shared by every replica.

Layout (``p`` = ``key_prefix``, default ``sb:``), every key built by :func:`key`:

* ``p wsrec``                      hash ``<ws>`` → record JSON (one key: listing is one HSCAN)
* ``p wsdata:<ws>:env|types|bookmarks``  hash, one table of the workspace
* ``p wsdata:<ws>:log``            stream, the workspace's event log (``XADD MAXLEN ~``)
* ``p wsdata:<ws>:gone``           string, when the workspace was deleted (its tombstone), with a TTL;
  not one of its data keys: deleting the workspace writes it

Each command touches one key, and the one script (:data:`_TABLE_SET`) one
key too, so keys of different workspaces never meet in one command. Data
keys of a workspace without a persistent record carry a TTL renewed at each
write; a persistent record's creation makes them permanent (``PERSIST``).
"""

from __future__ import annotations

import json
from typing import Any

from redis.exceptions import RedisError

from switchboard.errors import BackendError

TABLES = ("env", "types", "bookmarks")

# KEYS: the table. ARGV: field, value, max entries, only_new (1/0), ttl ms (0 = keep).
# One key: set unless it would pass the bound (or exists and only_new), then renew the TTL.
_TABLE_SET = """
local exists = redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1
if exists and ARGV[4] == '1' then return 0 end
if not exists and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if ARGV[5] ~= '0' then redis.call('PEXPIRE', KEYS[1], ARGV[5]) else redis.call('PERSIST', KEYS[1]) end
return 1
"""


def key(prefix: str, part: str, workspace: str | None = None) -> str:
    """The one place a key of this module is spelled (cluster mode may hash-tag the workspace here)."""
    if workspace is None:
        return f"{prefix}{part}"
    return f"{prefix}wsdata:{workspace}:{part}"


class RedisWorkspaceStore:
    def __init__(self, redis: Any, *, ttl: float, key_prefix: str = "sb:") -> None:
        self._r = redis
        self._p = key_prefix
        self._ttl_ms = max(1, int(ttl * 1000))
        self._table_set = redis.register_script(_TABLE_SET)

    def _data_keys(self, workspace: str) -> list[str]:
        return [key(self._p, t, workspace) for t in (*TABLES, "log")]

    async def get(self, workspace: str) -> dict[str, Any] | None:
        try:
            raw = await self._r.hget(key(self._p, "wsrec"), workspace)
        except RedisError as exc:
            raise BackendError(f"reading workspace {workspace} failed: {exc}") from exc
        return None if raw is None else dict(json.loads(raw))

    async def put(self, record: dict[str, Any], *, overwrite: bool) -> bool:
        ws = record["id"]
        text = json.dumps(record)
        try:
            if overwrite:
                await self._r.hset(key(self._p, "wsrec"), ws, text)
            elif not await self._r.hsetnx(key(self._p, "wsrec"), ws, text):
                return False
            if record.get("persistent"):
                for k in self._data_keys(ws):  # one key per command: no slot is crossed
                    await self._r.persist(k)
        except RedisError as exc:
            raise BackendError(f"writing workspace {ws} failed: {exc}") from exc
        return True

    async def remove(self, workspace: str) -> dict[str, Any] | None:
        try:
            record = await self.get(workspace)
            for k in self._data_keys(workspace):
                await self._r.delete(k)
            await self._r.hdel(key(self._p, "wsrec"), workspace)
        except RedisError as exc:
            raise BackendError(f"deleting workspace {workspace} failed: {exc}") from exc
        return record

    async def records(self, limit: int) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        try:
            async for _, raw in self._r.hscan_iter(key(self._p, "wsrec"), count=256):
                found.append(dict(json.loads(raw)))
                if len(found) >= limit:
                    break
        except RedisError as exc:
            raise BackendError(f"listing workspaces failed: {exc}") from exc
        return found

    async def table_set(
        self, workspace: str, table: str, key_: str, value: str | None, *, max_entries: int, keep: bool, only_new: bool
    ) -> bool:
        k = key(self._p, table, workspace)
        try:
            if value is None:
                await self._r.hdel(k, key_)
                return True
            done = await self._table_set(
                keys=[k], args=[key_, value, max_entries, "1" if only_new else "0", 0 if keep else self._ttl_ms]
            )
        except RedisError as exc:
            raise BackendError(f"writing {table} of workspace {workspace} failed: {exc}") from exc
        return bool(done)

    async def table(self, workspace: str, table: str) -> dict[str, str]:
        try:
            raw = await self._r.hgetall(key(self._p, table, workspace))
        except RedisError as exc:
            raise BackendError(f"reading {table} of workspace {workspace} failed: {exc}") from exc
        return {_text(k): _text(v) for k, v in raw.items()}

    async def log_append(self, workspace: str, entry: str, *, max_entries: int, keep: bool) -> None:
        k = key(self._p, "log", workspace)
        try:
            await self._r.xadd(k, {"e": entry}, maxlen=max_entries, approximate=True)
            if keep:
                await self._r.persist(k)
            else:
                await self._r.pexpire(k, self._ttl_ms)
        except RedisError as exc:
            raise BackendError(f"logging in workspace {workspace} failed: {exc}") from exc

    async def log_entries(self, workspace: str, limit: int) -> list[str]:
        try:
            raw = await self._r.xrevrange(key(self._p, "log", workspace), count=limit)
        except RedisError as exc:
            raise BackendError(f"reading the log of workspace {workspace} failed: {exc}") from exc
        return [_text(fields.get(b"e", fields.get("e", b""))) for _, fields in reversed(raw)]

    async def mark_deleted(self, workspace: str, at: float, *, ttl: float) -> None:
        try:
            await self._r.set(key(self._p, "gone", workspace), repr(at), px=max(1, int(ttl * 1000)))
        except RedisError as exc:
            raise BackendError(f"recording the deletion of workspace {workspace} failed: {exc}") from exc

    async def deleted_at(self, workspace: str) -> float | None:
        try:
            raw = await self._r.get(key(self._p, "gone", workspace))
        except RedisError as exc:
            raise BackendError(f"reading whether workspace {workspace} was deleted failed: {exc}") from exc
        return None if raw is None else float(_text(raw))

    def __repr__(self) -> str:
        return f"RedisWorkspaceStore(prefix={self._p!r})"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

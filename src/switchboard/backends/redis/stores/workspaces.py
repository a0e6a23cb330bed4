"""Workspace records and their data on Redis, shared by every replica.

Layout (``p`` = ``key_prefix``, default ``sb:``), every key built by :func:`key`:

* ``p wsrec``                      hash ``<ws>`` → record JSON (one key: listing is one HSCAN)
* ``p wsdata:<ws>:env|types|bookmarks``  hash, one table of the workspace
* ``p wsdata:<ws>:log``            stream, the workspace's event log (``XADD MAXLEN ~``)
* ``p wsdata:<ws>:gone``           string, when the workspace was deleted (its tombstone), with a TTL;
  not one of its data keys: deleting the workspace writes it, charged to the deleter first
  (``p {deletions}:by:<principal>``, ``p {deletions}:all``: :mod:`.charged`)

Each command touches one key, and the scripts (:data:`_TABLE_SET`,
:data:`_LOG_APPEND`) one key too, so keys of different workspaces never meet
in one command. Data keys of a workspace without a persistent record carry a
TTL renewed at each write; a persistent record's creation makes them
permanent (``PERSIST``). With ``max_bytes``, every data key's bytes are
charged against that ceiling before they are written (:mod:`.data_bytes`).
"""

from __future__ import annotations

import json
from typing import Any

from redis.exceptions import RedisError

from switchboard.backends.base import (
    MAX_DELETIONS,
    MAX_DELETIONS_PER_PRINCIPAL,
    deletions_full,
    workspace_data_full,
)
from switchboard.backends.redis.stores.charged import HUB_FULL, PRINCIPAL_FULL, ChargedSets
from switchboard.backends.redis.stores.data_bytes import UNCHANGED, DataBytes
from switchboard.clock import Clock, SystemClock
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

# KEYS: the log. ARGV: entry, max entries, ttl ms (0 = keep). Appends, drops the oldest entries
# beyond the bound, renews the TTL; returns the bytes of the entries dropped.
_LOG_APPEND = """
redis.call('XADD', KEYS[1], '*', 'e', ARGV[1])
local dropped = 0
local over = redis.call('XLEN', KEYS[1]) - tonumber(ARGV[2])
if over > 0 then
  for _, e in ipairs(redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', over)) do
    dropped = dropped + #e[2][2]
    redis.call('XDEL', KEYS[1], e[1])
  end
end
if ARGV[3] ~= '0' then redis.call('PEXPIRE', KEYS[1], ARGV[3]) else redis.call('PERSIST', KEYS[1]) end
return dropped
"""


def key(prefix: str, part: str, workspace: str | None = None) -> str:
    """The one place a key of this module is spelled (cluster mode may hash-tag the workspace here)."""
    if workspace is None:
        return f"{prefix}{part}"
    return f"{prefix}wsdata:{workspace}:{part}"


class RedisWorkspaceStore:
    def __init__(
        self,
        redis: Any,
        *,
        ttl: float,
        key_prefix: str = "sb:",
        clock: Clock | None = None,
        max_bytes: int | None = None,
        deletions_per_principal: int = MAX_DELETIONS_PER_PRINCIPAL,
        deletions: int = MAX_DELETIONS,
    ) -> None:
        self._r = redis
        self._p = key_prefix
        self._ttl_ms = max(1, int(ttl * 1000))
        self._clock = clock or SystemClock()
        self._table_set = redis.register_script(_TABLE_SET)
        self._log_append = redis.register_script(_LOG_APPEND)
        self._bytes = None if max_bytes is None else DataBytes(redis, prefix=key_prefix, ceiling=max_bytes)
        self._deletions = ChargedSets(
            redis, keyspace=f"{key_prefix}{{deletions}}", per_principal=deletions_per_principal, total=deletions
        )

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
                if self._bytes is not None:
                    await self._bytes.keep(_members(ws))
        except RedisError as exc:
            raise BackendError(f"writing workspace {ws} failed: {exc}") from exc
        return True

    async def remove(self, workspace: str) -> dict[str, Any] | None:
        try:
            record = await self.get(workspace)
            for k in self._data_keys(workspace):
                await self._r.delete(k)
            if self._bytes is not None:
                await self._bytes.drop(_members(workspace))
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
            if self._bytes is None:
                if value is None:
                    await self._r.hdel(k, key_)
                    return True
                return bool(
                    await self._table_set(keys=[k], args=self._set_args(key_, value, max_entries, keep, only_new))
                )
            return await self._charged_set(workspace, table, key_, value, max_entries, keep, only_new)
        except RedisError as exc:
            raise BackendError(f"writing {table} of workspace {workspace} failed: {exc}") from exc

    def _set_args(self, key_: str, value: str, max_entries: int, keep: bool, only_new: bool) -> list[Any]:
        return [key_, value, max_entries, "1" if only_new else "0", 0 if keep else self._ttl_ms]

    async def _charged_set(
        self, workspace: str, table: str, key_: str, value: str | None, max_entries: int, keep: bool, only_new: bool
    ) -> bool:
        """:meth:`table_set` with the entry's bytes charged before it is written, given back if it is not."""
        assert self._bytes is not None
        k, member, now = key(self._p, table, workspace), f"{workspace}/{table}", self._now_ms()
        old = int(await self._r.hstrlen(k, key_))  # 0: none (a value is JSON, never empty)
        old_bytes = len(key_.encode()) + old if old else 0
        if value is None:
            if old and await self._r.hdel(k, key_):
                await self._bytes.charge(member, -old_bytes, expires_ms=UNCHANGED, now_ms=now)
            return True
        delta = len(key_.encode()) + len(value.encode()) - old_bytes
        expires = None if keep else now + self._ttl_ms
        if not await self._bytes.charge(member, max(delta, 0), expires_ms=expires, now_ms=now):
            raise workspace_data_full(self._bytes.ceiling)
        done = bool(await self._table_set(keys=[k], args=self._set_args(key_, value, max_entries, keep, only_new)))
        if not done and delta > 0:
            await self._bytes.charge(member, -delta, expires_ms=UNCHANGED, now_ms=now)  # nothing written
        elif done and delta < 0:
            await self._bytes.charge(member, delta, expires_ms=UNCHANGED, now_ms=now)
        return done

    async def table(self, workspace: str, table: str) -> dict[str, str]:
        try:
            raw = await self._r.hgetall(key(self._p, table, workspace))
        except RedisError as exc:
            raise BackendError(f"reading {table} of workspace {workspace} failed: {exc}") from exc
        return {_text(k): _text(v) for k, v in raw.items()}

    async def log_append(self, workspace: str, entry: str, *, max_entries: int, keep: bool) -> None:
        k, member, now = key(self._p, "log", workspace), f"{workspace}/log", self._now_ms()
        try:
            size = len(entry.encode())
            expires = None if keep else now + self._ttl_ms
            if self._bytes is not None and not await self._bytes.charge(member, size, expires_ms=expires, now_ms=now):
                raise workspace_data_full(self._bytes.ceiling)
            dropped = int(await self._log_append(keys=[k], args=[entry, max_entries, 0 if keep else self._ttl_ms]))
            if self._bytes is not None and dropped:
                await self._bytes.charge(member, -dropped, expires_ms=UNCHANGED, now_ms=now)
        except RedisError as exc:
            raise BackendError(f"logging in workspace {workspace} failed: {exc}") from exc

    async def log_entries(self, workspace: str, limit: int) -> list[str]:
        try:
            raw = await self._r.xrevrange(key(self._p, "log", workspace), count=limit)
        except RedisError as exc:
            raise BackendError(f"reading the log of workspace {workspace} failed: {exc}") from exc
        return [_text(fields.get(b"e", fields.get("e", b""))) for _, fields in reversed(raw)]

    async def mark_deleted(self, workspace: str, at: float, *, ttl: float, principal: str) -> None:
        now = self._clock.time()
        try:
            kept_ms = await self._deletions.charge(workspace, until=now + ttl, now=now, principal=principal)
            if kept_ms == PRINCIPAL_FULL:
                raise deletions_full(principal, self._deletions.per_principal)
            if kept_ms == HUB_FULL:
                raise deletions_full(None, self._deletions.total)
            await self._r.set(key(self._p, "gone", workspace), repr(at), px=kept_ms)
        except RedisError as exc:
            raise BackendError(f"recording the deletion of workspace {workspace} failed: {exc}") from exc

    async def deleted_at(self, workspace: str) -> float | None:
        try:
            raw = await self._r.get(key(self._p, "gone", workspace))
        except RedisError as exc:
            raise BackendError(f"reading whether workspace {workspace} was deleted failed: {exc}") from exc
        return None if raw is None else float(_text(raw))

    def _now_ms(self) -> int:
        return int(self._clock.time() * 1000)

    def __repr__(self) -> str:
        return f"RedisWorkspaceStore(prefix={self._p!r})"


def _members(workspace: str) -> list[str]:
    """The names a workspace's data keys are charged under (:mod:`.data_bytes`)."""
    return [f"{workspace}/{part}" for part in (*TABLES, "log")]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

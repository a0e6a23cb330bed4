"""Pending sign-ins in Redis (:mod:`switchboard.backends.logins`), shared by every replica.

One key per entry, ``sb:login:<name>``, expiring at its deadline: a login key's
entry, and a flow's (its ``state``). Each operation is one command on one key
(``SET NX PX``, ``GET``, ``SET XX KEEPTTL``, ``GETDEL``), so a cluster needs no
hash tag, and an entry is taken by one replica only. Entries are bounded in size
and in time (at most :data:`~switchboard.backends.logins.LOGIN_TIME`); how many
are started is bounded by the call rate of those who start them.
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import RedisError

from switchboard.backends.logins import check_entry
from switchboard.clock import Clock
from switchboard.errors import BackendError


class RedisLogins:
    def __init__(self, redis: Any, *, clock: Clock, key_prefix: str = "sb:") -> None:
        self._r = redis
        self.clock = clock
        self._prefix = f"{key_prefix}login:"

    async def add(self, name: str, value: str, until: float) -> None:
        check_entry(value)
        ms = max(1, int((until - self.clock.time()) * 1000))
        try:
            await self._r.set(self._prefix + name, value, px=ms, nx=True)
        except RedisError as exc:
            raise BackendError(f"sign-in unavailable, please retry: {exc}") from exc

    async def get(self, name: str) -> str | None:
        try:
            return _text(await self._r.get(self._prefix + name))
        except RedisError as exc:
            raise BackendError(f"sign-in unavailable, please retry: {exc}") from exc

    async def replace(self, name: str, value: str) -> bool:
        check_entry(value)
        try:
            return bool(await self._r.set(self._prefix + name, value, xx=True, keepttl=True))
        except RedisError as exc:
            raise BackendError(f"sign-in unavailable, please retry: {exc}") from exc

    async def take(self, name: str) -> str | None:
        try:
            return _text(await self._r.getdel(self._prefix + name))
        except RedisError as exc:
            raise BackendError(f"sign-in unavailable, please retry: {exc}") from exc


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value

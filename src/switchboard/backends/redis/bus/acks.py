"""Waiting for acknowledgements that arrive on the pub/sub connection.

Acks (SUBSCRIBE/UNSUBSCRIBE confirmations, a probe's echo) arrive on the
reader task, not as replies to the sender, so a sender registers interest
*before* it sends (the ack may otherwise beat it) and then waits, bounded,
for the reader to resolve it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import RedisError

Key = tuple[bytes, str]


class Acks:
    """Futures keyed by ``(kind, name)``, e.g. ``(b"subscribe", channel)``."""

    def __init__(self) -> None:
        self._pending: dict[Key, list[asyncio.Future[None]]] = {}

    def expect(self, kind: bytes, name: str) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.setdefault((kind, name), []).append(fut)
        return fut

    async def wait(self, kind: bytes, name: str, fut: asyncio.Future[None], timeout: float) -> bool:
        """True if ``fut`` resolved within ``timeout`` real seconds; always unregisters it.

        A cancellation of the caller propagates (only the timeout is absorbed).
        """
        try:
            if not fut.done() and timeout > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await asyncio.shield(fut)
            return fut.done() and not fut.cancelled()
        finally:
            self.forget(kind, name, fut)

    def forget(self, kind: bytes, name: str, fut: asyncio.Future[None]) -> None:
        futures = self._pending.get((kind, name), [])
        if fut in futures:
            futures.remove(fut)
        if not futures:
            self._pending.pop((kind, name), None)

    def resolve(self, kind: bytes, name: str) -> None:
        for fut in self._pending.get((kind, name), []):
            if not fut.done():
                fut.set_result(None)

    def pending(self, kind: bytes, name: str) -> bool:
        return (kind, name) in self._pending

    def cancel_all(self) -> None:
        for futures in self._pending.values():
            for fut in futures:
                fut.cancel()
        self._pending.clear()


NO_SUBSCRIBER = "probe reached no subscriber"  # Redis itself says the connection lost its subscription


async def echo(
    publish: Callable[[str, str], Awaitable[Any]], channel: str, token: str, acks: Acks, timeout: float
) -> str:
    """Publish ``token`` on ``channel`` and wait for the reader to resolve ``(b"probe", token)``.

    Returns ``""`` if it came back within ``timeout``, else why not: proof, end
    to end, that the pub/sub connection really delivers (a half-open socket
    raises no error, it just stays silent).
    """
    deadline = asyncio.get_running_loop().time() + timeout
    ack = acks.expect(b"probe", token)
    try:
        async with asyncio.timeout(timeout):
            receivers = int(await publish(channel, token))
    except (RedisError, OSError, TimeoutError) as exc:
        acks.forget(b"probe", token, ack)
        return f"probe publish failed: {exc!r}"
    except BaseException:
        acks.forget(b"probe", token, ack)
        raise
    if receivers == 0:
        acks.forget(b"probe", token, ack)
        return NO_SUBSCRIBER
    if await acks.wait(b"probe", token, ack, deadline - asyncio.get_running_loop().time()):
        return ""
    return f"probe not received within {timeout}s (half-open?)"

"""Keeping the bus's one pub/sub connection alive, and checking it is.

Part of :class:`~switchboard.backends.redis.bus.RedisBus` (a mixin, kept apart
so that each file reads in one sitting): a supervisor connects, re-wires the
desired channels and reads until the connection dies, then backs off (capped)
and starts again; a reconciler re-sends what Redis has not confirmed; a probe
published to our own channel catches a connection that died silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from typing import TYPE_CHECKING, Any

from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ResponseError

from switchboard.backends.redis.acks import echo
from switchboard.backends.redis.breaker import backoff_delay

if TYPE_CHECKING:
    import redis.asyncio as aredis

    from switchboard.backends.redis.acks import Acks
    from switchboard.backends.redis.breaker import CircuitBreaker
    from switchboard.backends.redis.connection import PubSubConnectionFactory
    from switchboard.backends.redis.subscriptions import SubscriptionSet
    from switchboard.clock import Clock

logger = logging.getLogger(__name__)


class ConnectionKeeping:
    """The connection half of the bus; the attributes below are the bus's own."""

    subs: SubscriptionSet
    breaker: CircuitBreaker
    acks: Acks
    probe_channel: str
    _clock: Clock
    _factory: PubSubConnectionFactory
    _publisher: aredis.Redis
    _op_timeout: float
    _probe_timeout: float
    _backoff: tuple[float, float]
    _closed: bool
    _extra: dict[str, str]
    _counts: Any
    _conn: AbstractConnection | None
    _drop_event: asyncio.Event
    _drop_reason: str
    _down_reason: str
    _wired_on_conn: bool
    _last_rx: float
    _probe_seq: int

    if TYPE_CHECKING:  # the bus's own methods, used here

        async def _wire(self, channels: list[str], conn: AbstractConnection) -> bool: ...

        def _on_reply(self, reply: Any) -> None: ...

    # -- the connection -----------------------------------------------------

    async def _supervise(self) -> None:
        """Connect, re-wire, read until the connection dies; back off (capped) and repeat."""
        attempt = 0
        first = True
        while not self._closed:  # also ends a loop whose cancel redis-py swallowed
            conn = self._factory()
            try:
                async with asyncio.timeout(self._op_timeout * 2):
                    await conn.connect()  # type: ignore[no-untyped-call]  # redis-py leaves connect() unannotated
            except Exception as exc:  # any failure to connect is retried, never fatal
                self._down_reason = f"pub/sub connect failed: {exc!r}"
                logger.warning("%s", self._down_reason, extra=self._extra)
                with contextlib.suppress(Exception):
                    await conn.disconnect(nowait=True)
            else:
                if not first:
                    self._counts.reconnects += 1
                first = False
                try:
                    reason = await self._serve(conn)
                except Exception as exc:  # a bug must not end reconnection for good
                    logger.exception("pub/sub connection failed", extra=self._extra)
                    reason = repr(exc)
                self._down_reason = f"pub/sub connection lost: {reason}"
                logger.warning("%s; reconnecting", self._down_reason, extra=self._extra)
                if self._wired_on_conn:
                    attempt = 0  # it worked for a while: reconnect quickly
            await self._clock.sleep(backoff_delay(attempt, *self._backoff))
            attempt += 1

    async def _serve(self, conn: AbstractConnection) -> str:
        """Own one live connection until it fails or is dropped; return why it ended."""
        self.subs.on_connection_lost()  # a fresh socket has no subscriptions
        self.breaker.reset()  # before re-wiring: a stale open breaker must not refuse it
        self._conn, self._wired_on_conn = conn, False
        self._drop_event, self._drop_reason = asyncio.Event(), ""
        self._last_rx = self._clock.monotonic()
        reader = asyncio.create_task(self._read_loop(conn), name="switchboard-bus-reader")
        dropped = asyncio.create_task(self._drop_event.wait())
        try:
            desired = self.subs.missing()
            if await self._wire(desired, conn):
                logger.info("re-wiring %d channel(s)", len(desired), extra=self._extra)
            await asyncio.wait({reader, dropped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._conn, self._down_reason = None, "pub/sub connection lost"
            self.subs.on_connection_lost()
            reader.cancel()
            dropped.cancel()
            await asyncio.gather(reader, dropped, return_exceptions=True)
            with contextlib.suppress(Exception):
                await conn.disconnect(nowait=True)
        if self._drop_reason:
            return self._drop_reason
        exc = None if reader.cancelled() else reader.exception()
        return repr(exc) if exc is not None else "reader stopped"

    async def _read_loop(self, conn: AbstractConnection) -> None:
        """The only reader of the pub/sub connection; a handler error never ends it."""
        while not self._closed:  # also ends a loop whose cancel redis-py swallowed
            try:
                reply = await conn.read_response(timeout=math.inf, disconnect_on_error=False)
            except ResponseError as exc:  # e.g. a SUBSCRIBE refused: stays unconfirmed
                logger.warning("pub/sub error reply: %s", exc, extra=self._extra)
                continue
            self._last_rx = self._clock.monotonic()
            self._on_reply(reply)

    def _drop(self, conn: AbstractConnection, reason: str) -> None:
        """Ask the supervisor to abandon ``conn`` (if it is still the live one)."""
        if conn is self._conn and not self._drop_event.is_set():
            self._drop_reason = reason
            self._drop_event.set()

    # -- background loops ---------------------------------------------------

    async def reconcile_once(self) -> int:
        """Retry ``desired - confirmed`` on the live connection; return how many were sent."""
        conn, todo = self._conn, self.subs.missing()
        if conn is None or not todo or not await self._wire(todo, conn):
            return 0
        self._counts.repairs += len(todo)
        logger.info("reconciler re-sent %d subscription(s): %s", len(todo), todo[:10], extra=self._extra)
        return len(todo)

    async def _reconcile_loop(self, interval: float) -> None:
        while not self._closed:  # also ends a loop whose cancel redis-py swallowed
            await self._clock.sleep(interval)
            try:
                await self.reconcile_once()
            except Exception:
                logger.exception("reconcile failed", extra=self._extra)

    async def _probe_loop(self, idle: float) -> None:
        while not self._closed:  # also ends a loop whose cancel redis-py swallowed
            await self._clock.sleep(min(idle / 2, 1.0))
            conn = self._conn
            if conn is None or self._clock.monotonic() - self._last_rx < idle:
                continue  # traffic is proof of life
            try:
                await self.probe_once()
            except Exception:
                logger.exception("probe failed unexpectedly", extra=self._extra)

    async def probe_once(self) -> bool:
        """Publish to our own probe channel and wait for it to come back; drop the connection if not."""
        conn = self._conn
        if conn is None:
            return False
        self._probe_seq += 1
        failure = await echo(
            self._publisher,
            self.probe_channel,
            str(self._probe_seq),
            self.acks,
            self._probe_timeout,
        )
        if not failure:
            return True
        self._counts.probe_failures += 1
        logger.warning("%s; dropping pub/sub connection", failure, extra=self._extra)
        self._drop(conn, failure)
        return False

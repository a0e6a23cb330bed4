"""The Redis event bus: exact-channel pub/sub that cannot silently lose a subscription.

One dedicated pub/sub connection, read by one reader task. A channel counts as
subscribed only when Redis's ``subscribe`` confirmation for it arrives on the
live connection (:class:`SubscriptionSet`). Three paths converge ``desired``
onto ``confirmed``: a repeated :meth:`RedisBus.subscribe`, re-wiring on every
reconnect (breaker reset first), and a periodic reconciler. A probe published
to a per-replica channel catches half-open connections that fail silently.
The connection's supervisor and those two loops are at the end of the class.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import redis.asyncio as aredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import RedisError, ResponseError

from switchboard.backends.base import BusHandler
from switchboard.backends.redis.bus.acks import NO_SUBSCRIBER, Acks, echo
from switchboard.backends.redis.bus.outbox import Outbox
from switchboard.backends.redis.bus.pubsub_dialect import PubSubDialect
from switchboard.backends.redis.bus.subscriptions import SubscriptionSet
from switchboard.backends.redis.shared.batch import Batcher
from switchboard.backends.redis.shared.breaker import CircuitBreaker, backoff_delay
from switchboard.backends.redis.shared.connection import (
    PubSubConnectionFactory,
    client_name,
    resolve_source,
)
from switchboard.clock import Clock
from switchboard.errors import BackendError
from switchboard.tasks import cancel_and_wait

# Seconds the pub/sub reader may handle buffered messages before it lets the loop run others.
TURN = 0.01

logger = logging.getLogger(__name__)


@dataclass
class BusStats:
    """Counters for metrics; :attr:`RedisBus.stats` returns a snapshot."""

    desired: int = 0
    confirmed: int = 0
    repairs: int = 0  # subscriptions re-sent by the reconciler or a repeated subscribe
    publishes_to_nobody: int = 0
    reconnects: int = 0
    probe_failures: int = 0


class RedisBus:
    """:class:`~switchboard.backends.base.EventBus` over Redis pub/sub.

    ``source`` is a Redis URL, or a factory of unconnected pub/sub connections
    (then ``publisher`` is required). ``reconcile_interval`` / ``probe_idle``
    of ``None`` disable those loops (tests isolate one mechanism that way).

    ``sharded``: one master of a Redis Cluster, with ``SSUBSCRIBE``/``SPUBLISH``
    (:class:`~switchboard.backends.redis.bus.cluster_bus.ClusterBus` runs one per
    master); ``on_hint(reason)`` then hears what suggests the slot map changed
    (a MOVED reply, an unsolicited ``sunsubscribe``, a lost connection).
    """

    def __init__(
        self,
        source: str | PubSubConnectionFactory,
        *,
        clock: Clock,
        replica_id: str,
        publisher: aredis.Redis | None = None,
        reconcile_interval: float | None = 5.0,
        probe_idle: float | None = 3.0,
        probe_timeout: float = 2.0,
        subscribe_timeout: float = 2.0,
        op_timeout: float = 2.0,
        backoff_initial: float = 0.1,
        backoff_max: float = 0.5,  # a Redis back is heard within half a second: clients back at once
        breaker: CircuitBreaker | None = None,
        key_prefix: str = "sb:",
        sharded: bool = False,
        probe_channel: str | None = None,
        on_hint: Callable[[str], None] | None = None,
    ) -> None:
        self.replica_id = replica_id
        self.sharded = sharded
        self._dialect = PubSubDialect(sharded)
        self._on_hint = on_hint
        self._clock = clock
        self._factory, self._publisher, self._owned_publisher = resolve_source(
            source, publisher, timeout=op_timeout, name=client_name(replica_id, "bus")
        )
        # a crowd's events (10,000 clients leaving at once: as many client_disconnected) go out in
        # pipelines over one connection, in the order they were published, never draining the pool
        self._publishes = Batcher(self._publisher)
        # ... and their unsubscribes in a few commands (one per loop turn), not one each
        self.unsubscribes = Outbox(self._unsubscribe_now)
        self._reconcile_interval = reconcile_interval
        self._probe_idle = probe_idle
        self._probe_timeout = probe_timeout
        self._subscribe_timeout = subscribe_timeout
        self._op_timeout = op_timeout
        self._backoff = (backoff_initial, backoff_max)
        self.breaker = breaker or CircuitBreaker(clock)
        self.probe_channel = probe_channel or f"{key_prefix}probe:{replica_id}"
        self.subs = SubscriptionSet()
        # channels whose messages reach the listener: the desired ones, and one being unsubscribed
        # until Redis acks (a message Redis counted as received before that must still arrive)
        self._heard: set[str] = set()
        self._handler: BusHandler | None = None
        self.acks = Acks()
        self._conn: AbstractConnection | None = None
        self._drop_event = asyncio.Event()
        self._drop_reason = ""
        self._wired_on_conn = False
        self._last_rx = 0.0
        self._probe_seq = 0
        self._down_reason = "not started"
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._extra = {"replica": replica_id}
        self._counts = BusStats()

    # -- EventBus -----------------------------------------------------------

    async def start(self, wait: float | None = 5.0) -> bool:
        """Start the owned tasks; wait up to ``wait`` s for health. Never raises for Redis."""
        if self._tasks or self._closed:
            return self.health[0]
        self.subs.want(self.probe_channel)
        ack = self.acks.expect(b"subscribe", self.probe_channel)
        self._spawn(self._supervise(), "supervisor")
        if self._reconcile_interval is not None:
            self._spawn(self._reconcile_loop(self._reconcile_interval), "reconciler")
        if self._probe_idle is not None:
            self._spawn(self._probe_loop(self._probe_idle), "probe")
        await self.acks.wait(b"subscribe", self.probe_channel, ack, wait or 0)
        return self.health[0]

    async def publish(self, channel: str, data: bytes) -> int:
        """PUBLISH; return Redis's receiver count faithfully (0 = nobody)."""
        try:
            receivers = int(await self._send(channel, data))
        except (RedisError, OSError) as exc:
            raise BackendError(f"publish to {channel!r} failed: {exc}") from exc
        if receivers == 0:
            self._counts.publishes_to_nobody += 1
        return receivers

    def listen(self, handler: BusHandler) -> None:
        """``handler(channel, data)`` for every message on a subscribed channel (the probe's aside)."""
        self._handler = handler

    async def subscribe(self, channel: str) -> None:
        """Desire ``channel`` and try to wire it now, waiting (bounded) for Redis's confirmation.

        Never raises for an unconfirmed subscribe: it stays desired and the
        reconnect and reconcile paths finish the job.
        """
        if self._closed:
            raise BackendError("bus is closed")
        retry = channel in self.subs.desired
        self._heard.add(channel)
        if not self.subs.want(channel):
            return  # the guard tests CONFIRMED, never DESIRED
        conn = self._conn
        if conn is None or not self.breaker.allow():
            return  # wired on (re)connect or by the reconciler once allowed
        if retry:
            self._counts.repairs += 1
        ack = self.acks.expect(b"subscribe", channel)  # before sending: the ack may beat us
        wired = await self._wire([channel], conn)
        timeout = self._subscribe_timeout if wired else 0
        if not await self.acks.wait(b"subscribe", channel, ack, timeout) and wired:
            self.breaker.record_failure()
            logger.warning(
                "subscribe %s not confirmed within %.1fs; it stays desired and will be retried",
                channel,
                self._subscribe_timeout,
                extra=self._extra,
            )

    async def unsubscribe(self, channel: str) -> None:
        """Stop delivery now; wait (bounded) for Redis's ack so a later PUBLISH counts 0.

        Sent even if unconfirmed: a SUBSCRIBE may be in flight, and Redis
        handles the two in order on the one connection. Sent with the others
        asked in the same turn of the loop, as one command (:class:`Outbox`).
        """
        self.subs.drop(channel)
        conn = self._conn
        if conn is None or not conn.is_connected:
            self._unheard(channel)
            return  # a reconnect wires only what is desired
        ack = self.acks.expect(b"unsubscribe", channel)
        self.unsubscribes.add(channel)
        try:
            await self.acks.wait(b"unsubscribe", channel, ack, self._subscribe_timeout)
        finally:
            # Only now: a message Redis counted as received before the ack must
            # still reach the listener, or its sender would think it delivered.
            self._unheard(channel)

    async def _unsubscribe_now(self, channels: list[str]) -> None:
        """One write of ``UNSUBSCRIBE`` naming ``channels`` (a command per group the dialect needs,
        packed together: nothing can come between them). If it fails, the connection is dropped
        (the new one has none of them anyway) and their waiters are let go at once."""
        conn = self._conn
        try:
            if conn is None or not conn.is_connected:
                raise ConnectionError("no pub/sub connection")
            packed = conn.pack_commands(
                [(self._dialect.unsubscribe, *group) for group in self._dialect.batches(channels)]
            )
            async with asyncio.timeout(self._op_timeout):
                await conn.send_packed_command(packed, check_health=False)
        except (RedisError, OSError, TimeoutError) as exc:
            if conn is not None:
                self._drop(conn, f"UNSUBSCRIBE failed: {exc!r}")
            for channel in channels:
                self.acks.resolve(b"unsubscribe", channel)

    def forget(self, channel: str) -> None:
        """Stop wanting ``channel`` without telling Redis: the server already dropped it (its slot
        moved to another master) or the connection is gone."""
        self.subs.drop(channel)
        self._unheard(channel)

    def _unheard(self, channel: str) -> None:
        """Stop handing ``channel``'s messages on, unless it was subscribed again meanwhile."""
        if channel not in self.subs.desired:
            self._heard.discard(channel)

    async def close(self) -> None:
        """Cancel every owned task and close what this bus created."""
        if self._closed:
            return
        self._closed = True
        tasks, self._tasks = self._tasks, []
        await cancel_and_wait(tasks)
        await self.unsubscribes.close()
        await self._publishes.close()
        if self._owned_publisher:
            await self._publisher.aclose()
        self.acks.cancel_all()

    # -- health and metrics -------------------------------------------------

    @property
    def health(self) -> tuple[bool, str]:
        """``(ready, reason)`` for the server's readiness check."""
        if self._closed:
            return False, "closed"
        if self._conn is None:
            return False, self._down_reason
        if self._drop_event.is_set():
            return False, f"pub/sub connection being replaced: {self._drop_reason}"
        if not self.subs.is_confirmed(self.probe_channel):
            return False, "pub/sub connected, subscriptions not yet confirmed"
        unconfirmed = self.subs.unconfirmed()
        if unconfirmed:
            return True, f"ok, {unconfirmed} subscription(s) awaiting confirmation"
        return True, "ok"

    @property
    def stats(self) -> BusStats:
        desired, confirmed = len(self.subs.desired), len(self.subs.confirmed)
        snapshot: BusStats = replace(self._counts, desired=desired, confirmed=confirmed)
        return snapshot

    @property
    def subscriptions(self) -> tuple[int, int]:
        """``(desired, confirmed)``: what the reconciler still has to wire is the difference."""
        return len(self.subs.desired), len(self.subs.confirmed)

    def is_confirmed(self, channel: str) -> bool:
        return self.subs.is_confirmed(channel)

    # -- wiring -------------------------------------------------------------

    async def _wire(self, channels: list[str], conn: AbstractConnection) -> bool:
        """Send SUBSCRIBE for ``channels`` on ``conn``; never touches ``desired``.

        A send error means the connection is broken: it is dropped (the
        supervisor reconnects and re-wires everything still desired).
        """
        if not channels or conn is not self._conn or not self.breaker.allow():
            return False
        await self.unsubscribes.flush()  # an unsubscribe asked before must not overtake these
        try:
            for group in self._dialect.batches(channels):
                # Checked right before each send: a disconnected redis-py connection
                # would silently reconnect itself inside send_command, and a channel
                # unsubscribed meanwhile must not be wired again behind its back.
                batch = [c for c in group if c in self.subs.desired]
                if conn is not self._conn or not conn.is_connected:
                    return False
                if batch:
                    async with asyncio.timeout(self._op_timeout):
                        await conn.send_command(self._dialect.subscribe, *batch, check_health=False)
        except (RedisError, OSError, TimeoutError) as exc:
            self.breaker.record_failure()
            self._drop(conn, f"SUBSCRIBE failed: {exc!r}")
            return False
        return True

    def _on_reply(self, reply: Any) -> None:
        """Dispatch one pub/sub reply from the live connection."""
        if not isinstance(reply, list) or len(reply) < 3:
            return  # e.g. a PONG
        kind = self._dialect.kind(reply[0])
        channel = reply[1].decode("utf-8", "surrogateescape")
        if kind == b"message":
            if channel == self.probe_channel:
                self.acks.resolve(b"probe", reply[2].decode("ascii", "replace"))
                return
            if channel not in self._heard or self._handler is None:
                return
            try:
                self._handler(channel, reply[2])
            except Exception:  # the listener's bug is logged, never raised into the reader
                logger.exception("handler for %s failed", channel, extra=self._extra)
        elif kind == b"subscribe":
            if self.subs.on_confirmed(channel):
                self._wired_on_conn = True
                self.breaker.record_success()
                self.acks.resolve(kind, channel)
        elif kind == b"unsubscribe":
            if channel in self.subs.desired:  # not asked for: the server moved the channel's slot away
                self._hint(f"server unsubscribed {channel!r}")
            self.subs.on_unsubscribed(channel)
            self.acks.resolve(kind, channel)

    def _hint(self, reason: str) -> None:
        if self._on_hint is not None:
            self._on_hint(reason)

    def _spawn(self, coro: Any, name: str) -> None:
        self._tasks.append(asyncio.create_task(coro, name=f"switchboard-bus-{name}"))

    def __repr__(self) -> str:
        ok, reason = self.health
        return f"RedisBus(replica={self.replica_id!r}, {self.subs!r}, ready={ok}, {reason!r})"

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
            except asyncio.CancelledError:  # closed while connecting: the half-open socket goes too
                with contextlib.suppress(Exception):
                    await conn.disconnect(nowait=True)
                raise
            except Exception as exc:  # any failure to connect is retried, never fatal
                self._down_reason = f"pub/sub connect failed: {exc!r}"
                self._hint(self._down_reason)
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
                self._hint(self._down_reason)
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
            # why it was dropped stays in the readiness reason while the old socket is taken down
            lost = f"pub/sub connection lost: {self._drop_reason}" if self._drop_reason else "pub/sub connection lost"
            self._conn, self._down_reason = None, lost
            self.subs.on_connection_lost()
            try:
                # not cancel-then-gather: a cancel redis-py swallows would leave the reader
                # on the old socket and this supervisor waiting for it forever, never reconnecting
                await cancel_and_wait([reader, dropped])
                if reader.done() and not reader.cancelled():
                    reader.exception()  # retrieved: why it ended is the drop reason, already logged
            finally:
                # Even when a second cancel cuts the wait short: close() cancels again every
                # 50 ms, and on a busy loop that lands here, which once left the socket open.
                with contextlib.suppress(Exception):
                    await conn.disconnect(nowait=True)
        if self._drop_reason:
            return self._drop_reason
        exc = None if reader.cancelled() else reader.exception()
        return repr(exc) if exc is not None else "reader stopped"

    async def _read_loop(self, conn: AbstractConnection) -> None:
        """The only reader of the pub/sub connection; a handler error never ends it.

        redis-py hands over a reply already buffered without giving the loop a turn, so
        under a flood that keeps the socket full this loop would never yield: it does,
        every :data:`TURN` seconds, so that the lease's renewal and every client keep
        their times (a flood once starved the loop for over 3 s and cost the lease).
        """
        clock = self._clock
        turn_ends = clock.monotonic() + TURN
        while not self._closed:  # also ends a loop whose cancel redis-py swallowed
            try:
                reply = await conn.read_response(timeout=math.inf, disconnect_on_error=False)
            except ResponseError as exc:  # e.g. a SUBSCRIBE refused: stays unconfirmed
                logger.warning("pub/sub error reply: %s", exc, extra=self._extra)
                self._hint(f"pub/sub error reply: {exc}")  # MOVED: the slot map changed
                continue
            self._last_rx = now = clock.monotonic()
            self._on_reply(reply)
            if now >= turn_ends:
                await asyncio.sleep(0)  # a turn for everybody else
                turn_ends = clock.monotonic() + TURN

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
        started = self._clock.monotonic()
        failure = await echo(
            self._send,
            self.probe_channel,
            str(self._probe_seq),
            self.acks,
            self._probe_timeout,
        )
        if not failure:
            return True
        if failure != NO_SUBSCRIBER and conn is self._conn and self._last_rx > started:
            # late, yet the connection delivered meanwhile: the replica is busy (a storm of clients
            # queues the probe's publish behind theirs), its pub/sub is alive; dropping it would
            # re-wire every channel and turn new clients away, under the very load that made it late
            logger.info("%s, but the pub/sub connection delivered meanwhile: kept", failure, extra=self._extra)
            return True
        self._counts.probe_failures += 1
        logger.warning("%s; dropping pub/sub connection", failure, extra=self._extra)
        self._drop(conn, failure)
        return False

    async def _send(self, channel: str, data: bytes | str) -> Any:
        return await self._publishes.command(self._dialect.publish, channel, data)

"""Leadership: singleton background work on exactly one replica, under a lease.

A lease is an owned token with a TTL in the shared store, taken only when
free and kept alive by a compare-and-extend (the store's side:
:class:`Lease`, e.g. :class:`~switchboard.backends.redis.stores.lease.RedisLease`).
If the leader dies (even with SIGKILL) the token expires and another replica
takes over within one TTL plus one retry interval.

Safety rule: a leader that cannot reach the store does not know whether its
token is still there, so it must stop acting as leader *before* it could
have expired. The earliest it can expire is ``ttl`` after the last successful
renew was *sent*, so leadership is only trusted until that moment minus a
safety margin (see :attr:`LeasePolicy.step_down_margin`). It holds whichever
thread renews: :attr:`LeaderElector.is_leader` reads the clock and the time
the last good renew was sent, nothing else.

The elector may run on a thread of its own (:mod:`.liveness`), so that a
starved event loop does not cost the lease; it then renews only while the
serving loop still turns (:func:`hold_decision`): a loop hung for good loses
the lease, and the leader's chores, which run on that loop, go to a sibling.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from switchboard.clock import Clock
from switchboard.errors import BackendError, ConfigError
from switchboard.replicas.upkeep.liveness import LOOP_STALL_LIMIT, loop_alive

logger = logging.getLogger(__name__)


class LeaseLost(BackendError):
    """This replica is not (or no longer certainly) the lease holder."""


@dataclass(frozen=True)
class LeasePolicy:
    """Which key, how long a lease lives, and how often the leader renews it.

    ``renew_every`` must be well below ``ttl``: the gap is the time a leader
    has to ride out Redis hiccups before it has to step down. Followers try to
    acquire every ``renew_every`` too, so failover takes at most
    ``ttl + renew_every`` after the leader's last renew.
    """

    key: str
    ttl: float
    renew_every: float

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise ConfigError(f"LeasePolicy.key={self.key!r}: must be a non-empty string")
        if not self.ttl > 0:
            raise ConfigError(f"LeasePolicy.ttl={self.ttl!r}: must be > 0 seconds")
        if not self.renew_every > 0:
            raise ConfigError(f"LeasePolicy.renew_every={self.renew_every!r}: must be > 0 seconds")
        if not self.renew_every < self.ttl:
            raise ConfigError(
                f"LeasePolicy.renew_every={self.renew_every} must be less than ttl={self.ttl}: "
                "a leader that renews no faster than its lease expires loses it"
            )

    @property
    def ttl_ms(self) -> int:
        """The TTL sent to Redis, rounded *up*: the key must never expire sooner
        than the leader believes."""
        return max(1, math.ceil(self.ttl * 1000))

    @property
    def step_down_margin(self) -> float:
        """How long before the earliest possible expiry an unreachable leader
        stops leading (covers clock-rate drift and scheduling delay)."""
        return min(0.2 * self.ttl, (self.ttl - self.renew_every) / 2)


class Lease(Protocol):
    """The store's side of one lease: each operation one atomic round trip.

    Failures raise :class:`BackendError` (the outcome is then unknown).
    ``owner_id`` must be unique per process incarnation, or a restarted
    replica could renew its dead twin's lease.
    """

    owner_id: str

    async def try_acquire(self) -> bool:
        """Take the lease if nobody holds it."""
        ...

    async def renew(self) -> bool:
        """Extend it to a full TTL, only if this owner still holds it."""
        ...

    async def release(self) -> bool:
        """Delete it, only if this owner holds it."""
        ...

    async def holder(self) -> str | None:
        """The current holder's owner id, or ``None`` if the lease is free."""
        ...


class Renewal(Enum):
    """What a leader does when its renewal is due."""

    RENEW = "renew"
    EXPIRING = "not renewed in time: the lease could expire"
    LOOP_HUNG = "the event loop stopped turning"


def hold_decision(
    now: float, *, renewed_at: float, loop_tick: float, policy: LeasePolicy, stall_limit: float = LOOP_STALL_LIMIT
) -> Renewal:
    """Renew, or step down: once the lease could have expired (the safety rule), or once the
    serving loop has not turned for ``stall_limit`` (its chores no longer run: another should lead)."""
    if now >= renewed_at + policy.ttl - policy.step_down_margin:
        return Renewal.EXPIRING
    if not loop_alive(now, loop_tick, stall_limit):
        return Renewal.LOOP_HUNG
    return Renewal.RENEW


Callback = Callable[..., Awaitable[None] | None]


async def _call(callback: Callback | None, *args: Any) -> None:
    """Run a sync or async callback; its errors are logged, never propagated,
    so a buggy callback cannot stop the lease loop (and leave a stale leader)."""
    if callback is None:
        return
    try:
        result = callback(*args)
        if inspect.isawaitable(result):
            await result
    except Exception:
        logger.exception("lease callback %r failed", callback)


class LeaderElector:
    """Campaigns for a :class:`Lease` and holds it while it can.

    ``await run()`` loops forever: followers try to acquire every
    ``renew_every``; the leader renews every ``renew_every``. Gaining the
    lease calls ``on_elected()``; losing it calls ``on_lost(LeaseLost)``.
    Callbacks run inline in the loop and should return quickly (start or stop
    a task), since renewals wait for them.

    Cancelling ``run()`` stops at once without releasing or callbacks, like a
    crash: the lease expires on its own, and :attr:`is_leader` stays True only
    until the step-down deadline, while the lease is certainly still ours. For
    a clean shutdown cancel it and ``await resign()``.
    Work done under the lease should check :attr:`is_leader` (or call
    :meth:`ensure_leader`), which turns False at the step-down deadline even
    if the loop itself is stuck.

    ``loop_tick`` (when ``run()`` runs on a thread of its own): the monotonic
    time the serving loop last turned; the elector campaigns and renews only
    while that is within ``stall_limit``. Without it, ``run()`` runs on the
    serving loop itself, which then turns whenever it runs.
    """

    def __init__(
        self,
        lease: Lease,
        *,
        policy: LeasePolicy,
        clock: Clock,
        on_elected: Callback | None = None,
        on_lost: Callback | None = None,
        loop_tick: Callable[[], float] | None = None,
        stall_limit: float = LOOP_STALL_LIMIT,
    ) -> None:
        self.lease = lease
        self._loop_tick = loop_tick or clock.monotonic
        self.stall_limit = stall_limit
        self.policy = policy
        self.clock = clock
        self.on_elected = on_elected
        self.on_lost = on_lost
        self._leading = False
        self._renewed_at = -math.inf  # monotonic time the last good SET/renew was sent

    @property
    def valid_until(self) -> float:
        """Monotonic deadline after which this replica no longer trusts its lease."""
        policy = self.policy
        return self._renewed_at + policy.ttl - policy.step_down_margin

    @property
    def is_leader(self) -> bool:
        return self._leading and self.clock.monotonic() < self.valid_until

    def ensure_leader(self) -> None:
        """Raise :class:`LeaseLost` unless this replica certainly holds the lease."""
        if not self.is_leader:
            raise LeaseLost(f"not the holder of lease {self.policy.key!r}")

    async def run(self) -> None:
        policy, clock = self.policy, self.clock
        while True:
            if loop_alive(clock.monotonic(), self._loop_tick(), self.stall_limit) and await self._campaign():
                lost = await self._hold()
                self._leading = False
                logger.warning("lost lease %r: %s", policy.key, lost)
                await _call(self.on_lost, lost)
                await self._release_quietly()
                continue  # the key may already be free: campaign again at once
            await clock.sleep(policy.renew_every)

    async def resign(self) -> None:
        """Stop leading and free the lease for others (call after cancelling run)."""
        was_leading, self._leading = self._leading, False
        if was_leading:
            await _call(self.on_lost, LeaseLost(f"resigned lease {self.policy.key!r}"))
        await self._release_quietly()

    async def _campaign(self) -> bool:
        policy, clock = self.policy, self.clock
        started = clock.monotonic()
        try:
            async with asyncio.timeout(policy.renew_every):
                acquired = await self.lease.try_acquire()
        except (BackendError, TimeoutError, OSError) as exc:
            logger.debug("lease %r: acquire failed: %r", policy.key, exc)
            return False
        if not acquired:
            return False
        # The key was set no earlier than `started`, so it lives at least until started + ttl.
        self._renewed_at = started
        self._leading = True
        logger.info("acquired lease %r as %s", policy.key, self.lease.owner_id)
        await _call(self.on_elected)
        return True

    async def _hold(self) -> LeaseLost:
        """Renew until the lease is lost; return why."""
        policy, clock = self.policy, self.clock
        next_try = self._renewed_at + policy.renew_every
        while True:
            await clock.sleep(max(0.0, next_try - clock.monotonic()))
            started = clock.monotonic()
            tick = self._loop_tick()
            decision = hold_decision(
                started, renewed_at=self._renewed_at, loop_tick=tick, policy=policy, stall_limit=self.stall_limit
            )
            if decision is Renewal.EXPIRING:
                return LeaseLost(
                    f"lease {policy.key!r} not renewed for {started - self._renewed_at:.3f}s "
                    f"(ttl {policy.ttl}s): stepped down before it could expire"
                )
            if decision is Renewal.LOOP_HUNG:
                return LeaseLost(
                    f"the event loop has not turned for {started - tick:.1f}s: stepped down from {policy.key!r}"
                )
            remaining = self.valid_until - started
            try:
                async with asyncio.timeout(remaining):
                    renewed = await self.lease.renew()
            except (BackendError, TimeoutError, OSError) as exc:
                # Unknown outcome: keep leading only while the old renew still covers us.
                logger.warning(
                    "lease %r: renew failed (%r); %.3fs left before stepping down",
                    policy.key,
                    exc,
                    remaining,
                )
                next_try = min(started + policy.renew_every / 4, self.valid_until)
                continue
            if not renewed:
                return LeaseLost(f"lease {policy.key!r} expired or was taken over")
            self._renewed_at = started
            next_try = started + policy.renew_every

    async def _release_quietly(self) -> None:
        """Best effort: free the key so a follower need not wait out the TTL."""
        with contextlib.suppress(BackendError, TimeoutError, OSError):
            async with asyncio.timeout(self.policy.renew_every):
                await self.lease.release()

"""Renew or step down, given the serving loop's last tick, the last renewal and the clock.

The lease and the presence record are kept on a thread of their own
(:mod:`switchboard.replicas.upkeep.liveness`) so that a starved loop does not cost
them, yet only while that loop still turns: a loop hung for good must lose
both. The decision is pure; the elector carries it out. Real processes:
tests/cluster/test_lease_starved_loop.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import pytest

from switchboard.replicas.upkeep.lease import LeaderElector, LeasePolicy, Renewal, hold_decision
from switchboard.replicas.upkeep.liveness import LOOP_STALL_LIMIT, LoopBeat, loop_alive
from switchboard.testing import FakeClock

POLICY = LeasePolicy(key="sb:leader", ttl=3.0, renew_every=1.0)  # trusted until 2.4 s after a renewal
TRUSTED = POLICY.ttl - POLICY.step_down_margin


@pytest.mark.parametrize(
    ("now", "renewed_at", "loop_tick", "expected"),
    [
        (100.0, 99.0, 100.0, Renewal.RENEW),  # renewal due, loop turning
        (100.0, 99.0, 100.0 - 10.0, Renewal.RENEW),  # a loop starved for 10 s but turning keeps the lease
        (100.0, 99.0, 100.0 - LOOP_STALL_LIMIT, Renewal.RENEW),  # the limit itself still counts as turning
        (100.0, 99.0, 100.0 - LOOP_STALL_LIMIT - 0.1, Renewal.LOOP_HUNG),  # hung: step down, another leads
        (100.0, 100.0 - TRUSTED, 100.0, Renewal.EXPIRING),  # the safety rule, whatever the loop does
        (100.0, 100.0 - TRUSTED + 0.01, 100.0, Renewal.RENEW),
        (100.0, 100.0 - TRUSTED, 0.0, Renewal.EXPIRING),  # both: could have expired comes first
    ],
)
def test_a_leader_renews_while_its_lease_is_certain_and_its_loop_turns(
    now: float, renewed_at: float, loop_tick: float, expected: Renewal
) -> None:
    assert hold_decision(now, renewed_at=renewed_at, loop_tick=loop_tick, policy=POLICY) is expected


@pytest.mark.parametrize(
    ("now", "loop_tick", "limit", "alive"),
    [(10.0, 10.0, 15.0, True), (25.0, 10.0, 15.0, True), (25.01, 10.0, 15.0, False), (3.0, 1.0, 1.0, False)],
)
def test_a_loop_counts_as_turning_while_its_last_tick_is_within_the_limit(
    now: float, loop_tick: float, limit: float, alive: bool
) -> None:
    assert loop_alive(now, loop_tick, limit) is alive


def test_the_beat_records_when_the_loop_last_turned() -> None:
    clock = FakeClock(start=5.0)
    beat = LoopBeat(clock)
    assert beat.last == 5.0
    clock.advance(3.0)
    beat.tick()
    assert beat.last == 8.0


@dataclass
class Lease:
    """A lease in memory, recording what the elector did with it."""

    clock: FakeClock
    owner_id: str = "ra#1"
    holder_id: str | None = None
    calls: list[str] = field(default_factory=list)
    released_at: float | None = None

    async def try_acquire(self) -> bool:
        self.calls.append("acquire")
        if self.holder_id is None:
            self.holder_id = self.owner_id
            return True
        return False

    async def renew(self) -> bool:
        self.calls.append("renew")
        return self.holder_id == self.owner_id

    async def release(self) -> bool:
        self.calls.append("release")
        self.released_at = self.clock.monotonic()
        freed = self.holder_id == self.owner_id
        if freed:
            self.holder_id = None
        return freed

    async def holder(self) -> str | None:
        return self.holder_id


async def turns_until(condition, limit: int = 2000) -> bool:  # type: ignore[no-untyped-def]
    for _ in range(limit):
        if condition():
            return True
        await asyncio.sleep(0)
    return bool(condition())


async def test_a_leader_whose_loop_hangs_steps_down_frees_the_lease_and_stays_out_until_it_turns() -> None:
    clock = FakeClock()
    beat = LoopBeat(clock)  # ticked once, at 0, and then never: the serving loop hangs
    lease = Lease(clock)
    elector = LeaderElector(lease, policy=POLICY, clock=clock, loop_tick=lambda: beat.last)
    task = asyncio.create_task(elector.run())
    try:
        assert await turns_until(lambda: elector.is_leader)
        assert await turns_until(lambda: "release" in lease.calls), "a hung loop's leader must step down"
        assert lease.released_at is not None
        hung_for = lease.released_at - beat.last
        assert LOOP_STALL_LIMIT < hung_for <= LOOP_STALL_LIMIT + POLICY.renew_every, (
            "at its first renewal past the limit"
        )
        assert not elector.is_leader
        assert lease.holder_id is None, "freed for a sibling at once, not left to expire"
        renewals = lease.calls.count("renew")
        assert renewals >= LOOP_STALL_LIMIT / POLICY.renew_every - 1, "renewed all along while the loop counted"
        calls = len(lease.calls)
        for _ in range(50):  # more time passes, the loop still hung: no campaign
            await asyncio.sleep(0)
        assert lease.calls[calls:] == [], "a hung loop's replica does not campaign"
        beat.tick()  # the loop turns again
        assert await turns_until(lambda: elector.is_leader), "it leads again once its loop turns"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_without_a_loop_tick_the_elector_runs_on_the_loop_it_serves() -> None:
    clock = FakeClock()
    lease = Lease(clock)
    elector = LeaderElector(lease, policy=POLICY, clock=clock)
    task = asyncio.create_task(elector.run())
    try:
        assert await turns_until(lambda: lease.calls.count("renew") >= 30)
        assert elector.is_leader, "its loop turns whenever it runs: never hung"
        assert "release" not in lease.calls
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

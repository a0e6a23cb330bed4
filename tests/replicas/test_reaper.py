"""The orphan reaper, pure: a fake clock, fake candidates and scripted probes.

A live client must never be reaped for one lost probe; a dead one must be
reaped after ``min_failures`` failed probes in a row."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import pytest

from support.debug_loop import BOUNDS_TIME
from switchboard.errors import ConfigError
from switchboard.replicas.upkeep.reaper import (
    FailureLedger,
    OrphanReaper,
    PassReport,
    ReaperPolicy,
)
from switchboard.testing import FakeClock
from switchboard.testing.wait import scaled

N = ReaperPolicy().min_failures


class Stop(Exception):
    """Raised by HorizonClock to end an otherwise endless loop."""


class HorizonClock(FakeClock):
    """A FakeClock that ends the run when a sleep would pass ``horizon``."""

    def __init__(self, horizon: float) -> None:
        super().__init__()
        self.horizon = horizon

    async def sleep(self, seconds: float) -> None:
        if self.monotonic() + seconds > self.horizon:
            raise Stop
        await super().sleep(seconds)


class World:
    """Candidates and scripted probe answers; records what the reaper did."""

    def __init__(self, candidates: Iterable[str] = (), clock: FakeClock | None = None) -> None:
        self.candidates = set(candidates)
        self.answers: dict[str, list[bool | None]] = {}  # per id, popped per probe
        self.default = False  # answer once a script runs out: dead
        self.reaped: list[str] = []
        self.reaped_at: list[float] = []
        self.leader = True
        self.clock = clock or FakeClock()
        self.passes_at: list[float] = []

    async def list_candidates(self) -> set[str]:
        self.passes_at.append(self.clock.monotonic())
        return set(self.candidates)

    async def probe(self, cid: str) -> bool:
        script = self.answers.get(cid)
        answer = script.pop(0) if script else self.default
        if answer is None:
            raise RuntimeError("probe crashed")
        return answer

    async def reap(self, cid: str) -> None:
        self.reaped.append(cid)
        self.reaped_at.append(self.clock.monotonic())
        self.candidates.discard(cid)

    def reaper(self, policy: ReaperPolicy | None = None, **overrides: object) -> OrphanReaper:
        return OrphanReaper(
            policy=policy or ReaperPolicy(),
            clock=self.clock,
            list_candidates=self.list_candidates,
            probe=overrides.get("probe", self.probe),  # type: ignore[arg-type]
            reap=self.reap,
            is_leader=overrides.get("is_leader", lambda: self.leader),  # type: ignore[arg-type]
        )


def test_policy_defaults_and_validation() -> None:
    policy = ReaperPolicy()
    assert (policy.interval, policy.first_pass_delay, policy.min_failures) == (300.0, 5.0, 3)
    assert (policy.probe_concurrency, policy.probe_timeout) == (64, 5.0)
    with pytest.raises(ConfigError, match="min_failures=1: must be at least 2"):
        ReaperPolicy(min_failures=1)
    with pytest.raises(ConfigError, match="min_failures"):
        ReaperPolicy(min_failures=2.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="interval"):
        ReaperPolicy(interval=0)
    with pytest.raises(ConfigError, match="probe_concurrency"):
        ReaperPolicy(probe_concurrency=0)
    with pytest.raises(ConfigError, match="probe_timeout"):
        ReaperPolicy(probe_timeout=0)
    with pytest.raises(ConfigError, match="probe_timeout"):
        ReaperPolicy(interval=1.0, probe_timeout=2.0)
    with pytest.raises(ConfigError, match="first_pass_delay"):
        ReaperPolicy(first_pass_delay=-1)


# -- the ledger (pure) --------------------------------------------------------


def test_ledger_counts_resets_prunes_and_forgets() -> None:
    ledger = FailureLedger(3)
    assert ledger.record({"a": False, "b": True}) == []
    assert (ledger.failures("a"), ledger.failures("b")) == (1, 0)
    assert ledger.record({"a": False, "b": False}) == []
    assert ledger.record({"a": None, "b": True}) == []  # inconclusive: kept, not reset
    assert (ledger.failures("a"), ledger.failures("b")) == (2, 0)
    assert ledger.record({"a": False, "b": False}) == ["a"]
    assert ledger.failures("a") == 0  # reaped: forgotten
    assert ledger.record({"c": False}) == []  # b left the candidate set
    assert len(ledger) == 1
    assert ledger.failures("b") == 0


# -- passes ------------------------------------------------------------------


async def test_one_dropped_probe_does_not_reap() -> None:
    world = World({"live"})
    world.answers["live"] = [False]  # one lost ping...
    world.default = True  # ...then it answers again, as a live client does
    reaper = world.reaper()
    first = await reaper.run_pass()
    assert (first.probed, first.failed, first.reaped) == (1, 1, ())
    for _ in range(2 * N):
        report = await reaper.run_pass()
        assert report.failed == 0
    assert world.reaped == []


async def test_n_consecutive_failures_reap() -> None:
    world = World({"dead", "live"})
    world.answers["live"] = [True] * (N + 1)
    reaper = world.reaper()
    for i in range(N - 1):
        report = await reaper.run_pass()
        assert report.reaped == (), f"reaped after {i + 1} failures"
        assert reaper.ledger.failures("dead") == i + 1
    report = await reaper.run_pass()
    assert report == PassReport(probed=2, failed=1, inconclusive=0, reaped=("dead",), duration=0)
    assert world.reaped == ["dead"]
    assert len(reaper.ledger) == 0
    assert (await reaper.run_pass()).probed == 1  # gone, and reaped only once


async def test_a_success_in_between_resets_the_count() -> None:
    world = World({"flaky"})
    world.answers["flaky"] = [False] * (N - 1) + [True] + [False] * (N - 1)
    reaper = world.reaper()
    for _ in range(2 * N - 1):
        await reaper.run_pass()
    assert world.reaped == []
    assert reaper.ledger.failures("flaky") == N - 1
    await reaper.run_pass()  # the N-th failure in a row since the success
    assert world.reaped == ["flaky"]


async def test_a_crashed_probe_is_inconclusive() -> None:
    world = World({"x"})
    world.answers["x"] = [False] * (N - 1) + [None]
    reaper = world.reaper()
    for _ in range(N):
        await reaper.run_pass()
    assert world.reaped == []
    assert reaper.ledger.failures("x") == N - 1
    await reaper.run_pass()
    assert world.reaped == ["x"]


async def test_a_vanished_candidate_is_pruned() -> None:
    world = World({"c"})
    reaper = world.reaper()
    for _ in range(N - 1):
        await reaper.run_pass()
    assert reaper.ledger.failures("c") == N - 1
    world.candidates.clear()  # e.g. its replica came back and vouches for it
    await reaper.run_pass()
    assert len(reaper.ledger) == 0
    world.candidates.add("c")  # orphaned again: starts from zero
    for _ in range(N - 1):
        await reaper.run_pass()
    assert world.reaped == []
    await reaper.run_pass()
    assert world.reaped == ["c"]


async def test_lost_leadership_during_probes_discards_the_pass() -> None:
    world = World({"dead"})
    reaper = world.reaper()
    for _ in range(N - 1):
        await reaper.run_pass()
    world.candidates.add("new")

    async def probe_then_lose(cid: str) -> bool:
        world.leader = False
        return False

    reaper.probe = probe_then_lose
    report = await reaper.run_pass()
    assert report.reaped == ()
    assert world.reaped == []
    assert len(reaper.ledger) == 0  # no stale counts for a later term either


async def test_lost_leadership_while_reaping_stops_reaping() -> None:
    world = World({"a", "b", "c"})
    reaper = world.reaper()
    for _ in range(N - 1):
        await reaper.run_pass()

    async def reap_then_lose(cid: str) -> None:
        world.reaped.append(cid)
        world.leader = False

    reaper.reap = reap_then_lose
    report = await reaper.run_pass()
    assert report.reaped == ("a",)
    assert world.reaped == ["a"]


async def test_probes_run_concurrently_up_to_the_cap() -> None:
    cap = 8
    in_flight = max_in_flight = 0

    async def probe(cid: str) -> bool:
        nonlocal in_flight, max_in_flight
        in_flight += 1
        max_in_flight = max(max_in_flight, in_flight)
        for _ in range(5):
            await asyncio.sleep(0)  # stay in flight while others start
        in_flight -= 1
        return True

    world = World(f"c{i}" for i in range(100))
    reaper = world.reaper(ReaperPolicy(probe_concurrency=cap), probe=probe)
    report = await reaper.run_pass()
    assert report.probed == 100
    assert max_in_flight == cap


@pytest.mark.no_asyncio_debug(BOUNDS_TIME)
async def test_hanging_probes_time_out_as_failures_in_about_one_timeout() -> None:
    """1,000 probes that never answer all hang at once (the cap is 1,000) and are all cut
    by one timeout: the pass ends after about one timeout, not 1,000 of them (50 s)."""
    timeout = 0.05
    hang = asyncio.Event()  # never set
    in_flight = max_in_flight = 0

    async def probe(cid: str) -> bool:
        nonlocal in_flight, max_in_flight
        in_flight += 1
        max_in_flight = max(max_in_flight, in_flight)
        try:
            await hang.wait()
        finally:
            in_flight -= 1
        return True

    world = World(f"dead{i}" for i in range(1000))
    policy = ReaperPolicy(probe_concurrency=1000, probe_timeout=timeout, min_failures=2)
    reaper = world.reaper(policy, probe=probe)
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with asyncio.timeout(5):
        report = await reaper.run_pass()
    elapsed = loop.time() - started
    assert (report.probed, report.failed, report.reaped) == (1000, 1000, ())
    assert max_in_flight == 1000, "every probe hung at the same time"
    # one timeout, plus the time to start and cut 1,000 tasks (0.34 s once on a loaded
    # 2-core machine); a lower cap fails the count above, serial probes would take 50 s
    assert timeout <= elapsed < scaled(1.0), f"pass took {elapsed:.3f}s"
    async with asyncio.timeout(5):
        report = await reaper.run_pass()
    assert len(report.reaped) == 1000  # a timeout is a failure like any other


# -- the loop ----------------------------------------------------------------


async def run_until(world: World, policy: ReaperPolicy, horizon: float, **kw: object) -> None:
    assert isinstance(world.clock, HorizonClock)
    world.clock.horizon = horizon
    with pytest.raises(Stop):
        await world.reaper(policy, **kw).run()


async def test_run_passes_on_the_clock_schedule_only_while_leader() -> None:
    policy = ReaperPolicy(interval=300.0, first_pass_delay=5.0)
    world = World({"dead"}, clock=HorizonClock(0))
    await run_until(world, policy, horizon=1000.0)
    assert world.passes_at == [5.0, 305.0, 605.0, 905.0]
    assert world.reaped_at == [world.passes_at[N - 1]]

    idle = World({"dead"}, clock=HorizonClock(0))
    idle.leader = False
    await run_until(idle, policy, horizon=10_000.0)
    assert idle.passes_at == []
    assert idle.reaped == []


async def test_counts_do_not_survive_a_gap_in_leadership() -> None:
    clock = HorizonClock(0)
    world = World({"dead"}, clock=clock)
    policy = ReaperPolicy(interval=100.0, first_pass_delay=0.0)
    gap = (N - 1) * 100.0  # leader for N - 1 failing passes, then not for one slot
    await run_until(world, policy, horizon=gap + N * 100.0 + 50.0, is_leader=lambda: clock.monotonic() != gap)
    assert gap not in world.passes_at
    assert len(world.passes_at) == 2 * N - 1
    # Reaped only after N failures in the new term, not at its first pass.
    assert world.reaped_at == [gap + N * 100.0]

"""The orphan reaper: removes registrations of clients that are really gone.

A replica that dies (kill -9) leaves its clients' registrations behind; nobody
else will delete them. But deleting a *live* client's registrations is a
silent, permanent outage, and one probe can fail for reasons that say nothing
about the client (pub/sub does not buffer, a message is lost). So a candidate
is reaped only after ``min_failures`` failed probes in a row, in separate
passes minutes apart; any answer resets its count.

The reaper is generic: the hub supplies ``list_candidates`` (clients with
registrations but no live owner it can vouch for), ``probe`` and ``reap``.
``reap`` should itself re-check atomically that the client is still ownerless,
since it may have reconnected since its last probe.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from switchboard.clock import Clock
from switchboard.errors import ConfigError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReaperPolicy:
    """How often to look for orphans and how sure to be before reaping.

    Defaults: a pass every 5 minutes (``SWITCHBOARD_ORPHAN_REAP_INTERVAL``),
    the first 5 s after :meth:`OrphanReaper.run` starts (start it from the
    lease's ``on_elected`` to get it shortly after gaining leadership),
    reaping after 3 consecutive failed probes
    (``SWITCHBOARD_ORPHAN_REAP_MIN_FAILURES``), at most 64 probes in flight,
    each given 5 s: 1,000 dead clients take about 16 probe timeouts.
    """

    interval: float = 300.0
    first_pass_delay: float = 5.0
    min_failures: int = 3
    probe_concurrency: int = 64
    probe_timeout: float = 5.0

    def __post_init__(self) -> None:
        for name in ("min_failures", "probe_concurrency"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"ReaperPolicy.{name}={value!r}: must be an integer")
        if not self.interval > 0:
            raise ConfigError(f"ReaperPolicy.interval={self.interval!r}: must be > 0 seconds")
        if not self.first_pass_delay >= 0:
            raise ConfigError(f"ReaperPolicy.first_pass_delay={self.first_pass_delay!r}: must be >= 0 seconds")
        if self.min_failures < 2:
            raise ConfigError(
                f"ReaperPolicy.min_failures={self.min_failures}: must be at least 2, "
                "or a single lost probe would delete a live client's registrations"
            )
        if self.probe_concurrency < 1:
            raise ConfigError(f"ReaperPolicy.probe_concurrency={self.probe_concurrency}: must be at least 1")
        if not 0 < self.probe_timeout <= self.interval:
            raise ConfigError(
                f"ReaperPolicy.probe_timeout={self.probe_timeout!r}: must be > 0 and "
                f"at most the interval ({self.interval}s)"
            )


class FailureLedger:
    """Consecutive failed probes per candidate, across passes. Pure: no I/O.

    ``record`` takes one pass's results for the *whole* candidate set:
    True (answered: count reset), False (no answer: count + 1) or None
    (inconclusive, e.g. the probe itself crashed: count kept). Ids absent
    from the results are no longer candidates and are forgotten, so a client
    that comes back later starts from zero. Ids returned for reaping are
    forgotten too.
    """

    def __init__(self, min_failures: int) -> None:
        if min_failures < 1:
            raise ValueError(f"min_failures must be >= 1, got {min_failures}")
        self.min_failures = min_failures
        self._failures: dict[str, int] = {}

    def record(self, results: Mapping[str, bool | None]) -> list[str]:
        """Update the counts with one pass; return the ids to reap, sorted."""
        for gone in self._failures.keys() - results.keys():
            del self._failures[gone]
        to_reap = []
        for cid, ok in results.items():
            if ok is None:
                continue
            if ok:
                self._failures.pop(cid, None)
                continue
            count = self._failures.get(cid, 0) + 1
            if count >= self.min_failures:
                self._failures.pop(cid, None)
                to_reap.append(cid)
            else:
                self._failures[cid] = count
        return sorted(to_reap)

    def failures(self, cid: str) -> int:
        """Current consecutive failures of ``cid`` (0 if unknown)."""
        return self._failures.get(cid, 0)

    def clear(self) -> None:
        self._failures.clear()

    def __len__(self) -> int:
        return len(self._failures)


@dataclass(frozen=True)
class PassReport:
    """What one pass did; ``duration`` is on the reaper's clock."""

    probed: int
    failed: int
    inconclusive: int
    reaped: tuple[str, ...]
    duration: float


class OrphanReaper:
    """Runs reaper passes on the leader only; see the module docstring."""

    def __init__(
        self,
        *,
        policy: ReaperPolicy,
        clock: Clock,
        list_candidates: Callable[[], Awaitable[set[str]]],
        probe: Callable[[str], Awaitable[bool]],
        reap: Callable[[str], Awaitable[None]],
        is_leader: Callable[[], bool],
    ) -> None:
        self.policy = policy
        self.clock = clock
        self.list_candidates = list_candidates
        self.probe = probe
        self.reap = reap
        self.is_leader = is_leader
        self.ledger = FailureLedger(policy.min_failures)

    async def run(self) -> None:
        """First pass after ``first_pass_delay``, then one every ``interval``,
        each only if this replica leads at that moment. Counts do not survive
        a gap in leadership: another leader may have seen answers meanwhile."""
        policy, clock = self.policy, self.clock
        next_due = clock.monotonic() + policy.first_pass_delay
        while True:
            await clock.sleep(max(0.0, next_due - clock.monotonic()))
            if self.is_leader():
                try:
                    await self.run_pass()
                except Exception:
                    logger.exception("orphan reaper pass failed")
            elif len(self.ledger):
                logger.info("not leader: forgetting %d failure counts", len(self.ledger))
                self.ledger.clear()
            next_due += policy.interval
            now = clock.monotonic()
            if next_due <= now:
                logger.warning("orphan reaper pass overran its %ss interval", policy.interval)
                next_due = now + policy.interval

    async def run_pass(self) -> PassReport:
        """Probe every candidate once (concurrently, capped, each with a
        timeout), update the ledger, and reap those that failed too often."""
        started = self.clock.monotonic()
        candidates = set(await self.list_candidates())
        semaphore = asyncio.Semaphore(self.policy.probe_concurrency)

        async def probe_one(cid: str) -> tuple[str, bool | None]:
            async with semaphore:
                try:
                    async with asyncio.timeout(self.policy.probe_timeout):
                        return cid, bool(await self.probe(cid))
                except TimeoutError:
                    return cid, False
                except Exception:
                    logger.exception("probe of %s crashed: counted as inconclusive", cid)
                    return cid, None

        results = dict(await asyncio.gather(*(probe_one(cid) for cid in candidates)))
        failed = sum(1 for ok in results.values() if ok is False)
        inconclusive = sum(1 for ok in results.values() if ok is None)
        reaped: list[str] = []
        if not self.is_leader():
            # Leadership lapsed mid-pass: another replica may be reaping now.
            logger.info("lost leadership during a reaper pass: discarding its results")
            self.ledger.clear()
        else:
            for cid in self.ledger.record(results):
                if not self.is_leader():
                    logger.info("lost leadership while reaping: stopping")
                    break
                try:
                    await self.reap(cid)
                except Exception:
                    # Its count was already forgotten: it needs min_failures more passes.
                    logger.exception("reaping %s failed", cid)
                    continue
                logger.warning(
                    "reaped %s: no answer to %d probes in a row",
                    cid,
                    self.policy.min_failures,
                )
                reaped.append(cid)
        report = PassReport(
            probed=len(results),
            failed=failed,
            inconclusive=inconclusive,
            reaped=tuple(reaped),
            duration=self.clock.monotonic() - started,
        )
        log = logger.info if report.probed else logger.debug  # passes with suspects are worth a line
        log(
            "reaper pass: %d probed, %d failed, %d inconclusive, %d reaped in %.3fs",
            report.probed,
            report.failed,
            report.inconclusive,
            len(report.reaped),
            report.duration,
        )
        return report

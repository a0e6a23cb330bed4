"""An operator's chaos drill, timed: traffic of several kinds at once, each request's duration and outcome.

:class:`Drill` runs series of requests side by side (calls at 20 a second,
lookups every second, a new connection every few seconds), each open loop: a
request that hangs does not hold up the next one. The caller marks moments
(``cut``, ``healed``) and reads each series between two marks. The Redis-cut
test (``tests/cluster/test_cut_off_replica_under_load.py``) and its bench
(``bench/redis_cut.py``) share it.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

Request = Callable[[], Awaitable[object]]


@dataclass(frozen=True)
class Sample:
    """One request: when it started (seconds since the drill began), how long it took, what went wrong."""

    at: float
    took: float
    error: str | None


@dataclass
class Series:
    name: str
    period: float
    samples: list[Sample] = field(default_factory=list)

    def between(self, start: float, end: float) -> list[Sample]:
        """The requests started in ``[start, end)``."""
        return [s for s in self.samples if start <= s.at < end]


def median(samples: list[Sample]) -> float:
    return statistics.median(s.took for s in samples) if samples else float("nan")


def slowest(samples: list[Sample]) -> float:
    return max((s.took for s in samples), default=float("nan"))


class Drill:
    """Series of requests run side by side until :meth:`stop` (see the module docstring).

    ``timeout`` bounds every request (one that takes longer counts as failed
    after ``timeout``); ``limit`` bounds the whole drill, whatever its caller does.
    """

    def __init__(self, *, timeout: float = 12.0, limit: float = 120.0) -> None:
        self.timeout = timeout
        self.limit = limit
        self.series: dict[str, Series] = {}
        self.marks: dict[str, float] = {}
        self._loop = asyncio.get_running_loop()
        self._started = self._loop.time()
        self._stop = asyncio.Event()
        self._runners: list[asyncio.Task[None]] = []

    def now(self) -> float:
        """Seconds since the drill began."""
        return self._loop.time() - self._started

    def mark(self, name: str) -> float:
        self.marks[name] = self.now()
        return self.marks[name]

    def run(self, name: str, request: Request, *, every: float) -> None:
        """Start ``request`` every ``every`` seconds from now on."""
        series = self.series[name] = Series(name, every)
        self._runners.append(self._loop.create_task(self._keep_running(series, request), name=f"drill {name}"))

    async def keep_on(self, seconds: float) -> None:
        """Let the traffic run for ``seconds`` (a phase of the drill: its length is the point, not a wait for something)."""
        await asyncio.sleep(seconds)

    async def stop(self) -> None:
        """Start nothing more; wait for the requests under way (each bounded by ``timeout``)."""
        self._stop.set()
        await asyncio.gather(*self._runners)

    async def _keep_running(self, series: Series, request: Request) -> None:
        pending: set[asyncio.Task[None]] = set()
        first = self._loop.time()
        for tick in range(int(self.limit / series.period)):
            pending.add(self._loop.create_task(self._one(series, request)))
            wait = first + (tick + 1) * series.period - self._loop.time()
            try:
                await asyncio.wait_for(self._stop.wait(), max(0.0, wait))
            except TimeoutError:
                continue
            break
        await asyncio.gather(*pending)

    async def _one(self, series: Series, request: Request) -> None:
        started = self.now()
        error = None
        try:
            await asyncio.wait_for(request(), self.timeout)
        except Exception as exc:  # noqa: BLE001 - every failure is recorded, and judged by the caller
            error = f"{type(exc).__name__}: {str(exc)[-160:]}"
        series.samples.append(Sample(started, self.now() - started, error))

    def report(self, phases: list[tuple[str, str, str]]) -> str:
        """One line per series and phase (``(label, from mark, to mark)``; ``end``: the drill's end):
        how many requests, how many failed, median and maximum in ms."""
        end = self.now()
        lines = []
        for series in self.series.values():
            for label, start, stop in phases:
                got = series.between(self.marks.get(start, 0.0), self.marks.get(stop, end))
                failed = sum(1 for s in got if s.error)
                lines.append(
                    f"{series.name:<18} {label:<8} n={len(got):<4} failed={failed:<3} "
                    f"median={median(got) * 1000:8.1f} ms  max={slowest(got) * 1000:8.1f} ms"
                )
        return "\n".join(lines)

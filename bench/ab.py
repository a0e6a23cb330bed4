#!/usr/bin/env python
"""Two revisions of Switchboard side by side: is a change to the hot path faster?

    .venv/bin/python bench/ab.py [--base GIT_REF] [--blocks N] [--block-size N]
                                 [--callers N] [--tp-seconds S]

A quick ``compare.py`` run per revision is too noisy on a shared machine to show a
10 % change: runs minutes apart see different foreign load. Here both revisions run
at once, each as two replicas sharing their own Valkey, with a provider on replica A
and callers on replica B, and the measurements alternate between the two in blocks,
so that a burst of foreign load hits both alike. Two phases, each reported as the
figures of both revisions, the ratio new / base overall and as the median of the
per-block ratios, and the CPU time both replicas of each revision used per call (Linux):

1. latency: one caller's sequential 32 B echo calls, ``--block-size`` per block;
   p50/p90 (below 1: the working tree is faster);
2. throughput: ``--callers`` concurrent callers (default 32, over four client
   connections on B, as ``compare.py``'s workload 3), each calling echo in a loop for
   ``--tp-seconds`` per block after half a second unmeasured; calls/s (above 1: the
   working tree is faster). ``--callers 0`` skips it.

``--base HEAD`` with a clean working tree runs the same code on both sides: the ratios
then come out near 1.00, which is the bench's own check of its noise.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import pct, raise_fd_limit, say  # noqa: E402
from _workloads import CALL_TIMEOUT, DEFAULT, SMALL, Endpoint, RpcSide, concurrent, make_servers  # noqa: E402
from compare import checkout_src  # noqa: E402

TP_WARMUP = 0.5  # seconds of each throughput block not counted: the callers' first calls, the loops' ramp


class Pair:
    """Two replicas of one revision (``src`` on PYTHONPATH, or the installed package) with
    their own Valkey, a provider on A and an echo caller on B."""

    def __init__(self, name: str, src: str | None, work: Path) -> None:
        self.name = name
        self.src = src
        self.work = work / name
        self.valkey: Any = None
        self.servers: list[Any] = []
        self.side: RpcSide | None = None
        self.echo: Any = None
        self.callers: list[Endpoint] = []

    async def start(self) -> None:
        from switchboard.testing import ValkeyServer

        self.work.mkdir(parents=True, exist_ok=True)
        self.valkey = ValkeyServer()
        await asyncio.to_thread(self.valkey.start)
        old = os.environ.pop("BENCH_SWITCHBOARD_SRC", None)
        if self.src:
            os.environ["BENCH_SWITCHBOARD_SRC"] = self.src
        try:
            self.servers = make_servers("switchboard", self.valkey.url)
        finally:
            os.environ.pop("BENCH_SWITCHBOARD_SRC", None)
            if old is not None:
                os.environ["BENCH_SWITCHBOARD_SRC"] = old
        for s in self.servers:
            await asyncio.to_thread(s.start)
            await asyncio.to_thread(s.wait_ready)
        self.side = RpcSide(self.servers, self.work)
        await self.side.setup()
        self.echo = (await self.side.endpoint(1, f"ab-{self.name}")).echo
        for i in range(DEFAULT.tp_connections):
            self.callers.append(await self.side.endpoint(1, f"ab-{self.name}-tp{i}"))

    def pids(self) -> dict[str, int | None]:
        return {s.name: s.pid for s in self.servers}

    def cpu_seconds(self) -> float:
        """CPU time the two replicas have used so far (user + system, from Linux's /proc; 0 elsewhere)."""
        total = 0.0
        for s in self.servers:
            if s.proc is not None:
                try:
                    fields = Path(f"/proc/{s.proc.pid}/stat").read_text().rpartition(")")[2].split()
                except OSError:
                    return 0.0
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total

    async def stop(self) -> None:
        if self.side is not None:
            await asyncio.wait_for(self.side.close(), 30)
        for s in self.servers:
            await asyncio.to_thread(s.kill)
        if self.valkey is not None:
            await asyncio.to_thread(self.valkey.stop)


async def block(echo: Any, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        result = await asyncio.wait_for(echo(SMALL), CALL_TIMEOUT)
        out.append(time.perf_counter() - t)
        if result != SMALL:
            raise RuntimeError("wrong echo result")
    return out


async def burst(pair: Pair, callers: int, seconds: float) -> tuple[float, int, float]:
    """(calls/s, calls, CPU seconds of both replicas) of ``callers`` concurrent callers on B
    calling for ``seconds`` after :data:`TP_WARMUP` unmeasured."""
    r = await concurrent(pair.callers, callers, seconds, TP_WARMUP, pair.pids())
    if r["errors"] or not r["calls"]:
        raise RuntimeError(f"{pair.name}: calls failed under {callers} callers: {r['errors']}")
    cpu = sum(us * r["calls"] / 1e6 for us in r["cpu_us_per_call"].values())
    return r["calls_per_s"], r["calls"], cpu


async def throughput(pairs: list[Pair], args: argparse.Namespace) -> None:
    rates: dict[str, list[float]] = {p.name: [] for p in pairs}
    calls = {p.name: 0 for p in pairs}
    cpu = {p.name: 0.0 for p in pairs}
    ratios = []
    for i in range(args.blocks):
        for p in pairs if i % 2 == 0 else pairs[::-1]:
            rate, n, seconds = await burst(p, args.callers, args.tp_seconds)
            rates[p.name].append(rate)
            calls[p.name] += n
            cpu[p.name] += seconds
        ratios.append(rates["new"][-1] / rates["base"][-1])
    for name, values in rates.items():
        say(
            f"{name:>4}: {args.callers} concurrent callers, median {statistics.median(values):,.0f} calls/s"
            f"  ({calls[name]} calls in {len(values)} blocks of {args.tp_seconds:g} s)"
        )
    say(
        f"new/base throughput x{statistics.median(rates['new']) / statistics.median(rates['base']):.3f}; "
        f"median of {len(ratios)} block ratios x{statistics.median(ratios):.3f}"
        f" (range {min(ratios):.3f}-{max(ratios):.3f})"
    )
    per_call = {name: cpu[name] / calls[name] * 1e6 for name in cpu}
    if per_call["base"] > 0:
        say(
            f"replicas' CPU per call under {args.callers} callers: new {per_call['new']:.0f} us, "
            f"base {per_call['base']:.0f} us, x{per_call['new'] / per_call['base']:.3f}"
        )


async def run(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-ab-"))
    pairs = [Pair("new", None, work), Pair("base", checkout_src(args.base), work)]
    try:
        for p in pairs:
            await p.start()
        for p in pairs:
            await block(p.echo, 200)  # warm-up: routes learnt, links dialled
        samples: dict[str, list[float]] = {p.name: [] for p in pairs}
        cpu = {p.name: 0.0 for p in pairs}
        ratios = []
        for i in range(args.blocks):
            order = pairs if i % 2 == 0 else pairs[::-1]
            got = {}
            for p in order:
                before = p.cpu_seconds()
                got[p.name] = await block(p.echo, args.block_size)
                cpu[p.name] += p.cpu_seconds() - before
            for name, values in got.items():
                samples[name] += values
            ratios.append(statistics.median(got["new"]) / statistics.median(got["base"]))
        for name, values in samples.items():
            values.sort()
            say(
                f"{name:>4}: p50 {pct(values, 50) * 1e3:.3f} ms  p90 {pct(values, 90) * 1e3:.3f} ms"
                f"  ({len(values)} calls)"
            )
        new, base = sorted(samples["new"]), sorted(samples["base"])
        say(
            f"new/base p50 x{pct(new, 50) / pct(base, 50):.3f}, p90 x{pct(new, 90) / pct(base, 90):.3f}; "
            f"median of {len(ratios)} block ratios x{statistics.median(ratios):.3f}"
            f" (range {min(ratios):.3f}-{max(ratios):.3f})"
        )
        per_call = {name: cpu[name] / len(samples[name]) * 1e6 for name in cpu}
        if per_call["base"] > 0:
            say(
                f"replicas' CPU per call: new {per_call['new']:.0f} us, base {per_call['base']:.0f} us, "
                f"x{per_call['new'] / per_call['base']:.3f} (10 ms ticks: rough below a few thousand calls)"
            )
        if args.callers:
            await throughput(pairs, args)
    finally:
        for p in pairs:
            await p.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD", metavar="GIT_REF", help="the revision to compare against")
    parser.add_argument("--blocks", type=int, default=20, help="blocks per revision (default 20)")
    parser.add_argument("--block-size", type=int, default=250, help="calls per block (default 250)")
    parser.add_argument(
        "--callers",
        type=int,
        default=DEFAULT.tp_callers,
        help=f"then N concurrent callers on replica B, calls/s per block (default {DEFAULT.tp_callers}; 0: skip)",
    )
    parser.add_argument(
        "--tp-seconds", type=float, default=2.0, help="measured seconds of each throughput block (default 2)"
    )
    args = parser.parse_args()
    if args.blocks < 1 or args.block_size < 10:
        parser.error("--blocks must be at least 1 and --block-size at least 10")
    if args.callers < 0 or args.tp_seconds <= 0:
        parser.error("--callers must be at least 0 and --tp-seconds above 0")
    raise_fd_limit()
    asyncio.run(run(args))


if __name__ == "__main__":
    main()

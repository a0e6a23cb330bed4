"""What one more client costs a replica: this revision and another one measured at the same time.

``connect_cost.py --against`` measures the two revisions one after the other;
on a shared machine whose load moves by a factor of ten within minutes, its
two figures for a step were taken under different loads, and a connect's CPU
follows the load (1.5 ms at a load of 1, 2.5 at 8 for the same code). Here
both replicas run at once, each on a Valkey of its own with its own client
processes, and every step is taken by both together: what the machine does
meanwhile weighs on both alike, and the ratio of their figures is what the
code changed. The clients are those of ``connect_cost.py`` (unmodified
hypha-rpc clients, one workspace); a step's CPU per connect is measured as
there: from the step's start until ``SETTLE`` s after the last connect of
both, less the idle cost at that level measured over ``--idle`` s right after
(both replicas over the same seconds). No echo is measured (``connect_cost.py``
does). Prints a table and writes ``bench/results/connect_beside.json``.

    .venv/bin/python bench/connect_beside.py --against OTHER_REVISION/src
                                             [--clients 4000] [--step 1000] [--rounds 1]
                                             [--workers 1] [--concurrency 16] [--idle 20]

``--rounds N`` repeats the whole climb N times (fresh replicas each time).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import BENCH, JWT_SECRET, Child, calibrate, pid_cpu, pid_rss, raise_fd_limit, say
from connect_cost import IDLE, SETTLE, load, token_for_bench

HERE = str(Path(__file__).resolve())
COST = str(Path(__file__).resolve().with_name("connect_cost.py"))


class Side:
    """One revision: its Valkey, its replica and the processes holding its clients."""

    def __init__(self, name: str, src: str | None, workers: int) -> None:
        self.name, self.src, self.n_workers = name, src, workers
        self.valkey: Any = None
        self.replica: Any = None
        self.workers: list[Child] = []
        self.connected = 0

    async def start(self, clients: int, work: Path) -> Side:
        from switchboard.testing.replica import ReplicaProcess
        from switchboard.testing.valkey import ValkeyServer

        self.valkey = ValkeyServer().start()
        limit = str(clients * 2 + 100)
        self.replica = ReplicaProcess(
            replica_id=f"beside-{self.name}",
            redis_url=self.valkey.url,
            jwt_secret=JWT_SECRET,
            args=["--max-connections-per-workspace", limit, "--max-connections-per-user", limit],
            env={"SWITCHBOARD_LOG_LEVEL": "WARNING", **({"PYTHONPATH": self.src} if self.src else {})},
        ).start(timeout=60)
        token = token_for_bench()
        self.workers = [
            await Child(
                f"beside-{self.name}-{i}", [COST, "--worker", self.replica.url, token, f"{self.name}{i}"], work
            ).start()
            for i in range(self.n_workers)
        ]
        return self

    @property
    def pid(self) -> int | None:
        return self.replica.proc.pid if self.replica and self.replica.proc else None

    async def open(self, n: int, concurrency: int) -> tuple[int, dict[str, int], float]:
        """``n`` more clients; how many are connected now, the errors, when the last one was in."""
        k = len(self.workers)
        share = [n // k + (1 if i < n % k else 0) for i in range(k)]
        answers = await asyncio.gather(
            *(
                w.request({"open": s, "concurrency": concurrency}, timeout=900)
                for w, s in zip(self.workers, share, strict=True)
            )
        )
        errors: dict[str, int] = {}
        for a in answers:
            for key, v in a["errors"].items():
                errors[key] = errors.get(key, 0) + v
        return sum(a["open"] for a in answers), errors, time.perf_counter()

    async def stop(self) -> None:
        if self.replica is not None:
            self.replica.kill()  # before the clients leave: their departures measure nothing here
        for w in self.workers:
            await w.stop()
        if self.valkey is not None:
            self.valkey.stop()


async def idle_rates(sides: list[Side], seconds: float) -> list[float]:
    """Each replica's CPU seconds per second over the same ``seconds``."""
    c0, t0 = [pid_cpu(s.pid) or 0.0 for s in sides], time.perf_counter()
    await asyncio.sleep(seconds)
    dt = time.perf_counter() - t0
    return [((pid_cpu(s.pid) or 0.0) - c) / dt for s, c in zip(sides, c0, strict=True)]


async def climb(args: argparse.Namespace, against: str) -> dict[str, Any]:
    raise_fd_limit()
    work = Path(tempfile.mkdtemp(prefix="bench-beside-"))
    sides = [Side("against", against, args.workers), Side("this", None, args.workers)]
    steps: list[dict[str, Any]] = []
    try:
        for side in sides:
            await side.start(args.clients, work)
        base_rss = [pid_rss(s.pid) or 0 for s in sides]
        rates = await idle_rates(sides, args.idle)
        connected = 0
        while connected < args.clients:
            n = min(args.step, args.clients - connected)
            cpu0, t0 = [pid_cpu(s.pid) or 0.0 for s in sides], time.perf_counter()
            done = await asyncio.gather(*(s.open(n, args.concurrency) for s in sides))
            await asyncio.sleep(SETTLE)
            cpu1, t1 = [pid_cpu(s.pid) or 0.0 for s in sides], time.perf_counter()
            after = await idle_rates(sides, args.idle)
            step: dict[str, Any] = {"before": connected, "load": load()}
            for i, (side, (opened, errors, last)) in enumerate(zip(sides, done, strict=True)):
                made = opened - side.connected
                idle = (rates[i] + after[i]) / 2 * (t1 - t0)
                step[side.name] = {
                    "made": made,
                    "errors": errors,
                    "handshakes_per_s": made / (last - t0) if made else None,
                    "cpu_ms_per_connect": ((cpu1[i] - cpu0[i]) - idle) * 1e3 / made if made else None,
                    "cpu_ms_per_connect_raw": (cpu1[i] - cpu0[i]) * 1e3 / made if made else None,
                    "idle_cpu_per_s": after[i],
                    "rss_bytes": pid_rss(side.pid),
                }
                side.connected = opened
            a, b = step["against"]["cpu_ms_per_connect"], step["this"]["cpu_ms_per_connect"]
            step["ratio"] = b / a if a and b else None
            ra, rb = step["against"]["cpu_ms_per_connect_raw"], step["this"]["cpu_ms_per_connect_raw"]
            step["raw_ratio"] = rb / ra if ra and rb else None
            steps.append(step)
            say(
                f"{connected:>6}-{connected + n:<6} against {a or float('nan'):5.2f} ms (raw "
                f"{step['against']['cpu_ms_per_connect_raw'] or float('nan'):5.2f}, "
                f"{step['against']['handshakes_per_s'] or 0:5.1f}/s)  this {b or float('nan'):5.2f} ms (raw "
                f"{step['this']['cpu_ms_per_connect_raw'] or float('nan'):5.2f}, "
                f"{step['this']['handshakes_per_s'] or 0:5.1f}/s)  ratio {step['ratio'] or float('nan'):.2f}  "
                f"errors {sum(step['against']['errors'].values())}/{sum(step['this']['errors'].values())}  "
                f"load {step['load']:.1f}"
            )
            connected += n
            rates = after
            if not step["against"]["made"] or not step["this"]["made"]:
                break
        rss = {
            s.name: ((steps[-1][s.name]["rss_bytes"] or 0) - base) / 1024 / max(1, s.connected)
            for s, base in zip(sides, base_rss, strict=True)
        }
        say(f"RSS per idle connection: against {rss['against']:.1f} KiB, this {rss['this']:.1f} KiB")
        return {"steps": steps, "rss_kib_per_connection": rss}
    finally:
        for side in sides:
            await side.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, help="the other revision's src/ directory")
    parser.add_argument("--clients", type=int, default=4000, help="clients per replica (default 4000)")
    parser.add_argument("--step", type=int, default=1000, help="clients per step (default 1000)")
    parser.add_argument("--rounds", type=int, default=1, help="climbs, each with fresh replicas (default 1)")
    parser.add_argument("--workers", type=int, default=1, help="client processes per replica (default 1)")
    parser.add_argument("--concurrency", type=int, default=16, help="handshakes in flight per worker")
    parser.add_argument(
        "--idle",
        type=float,
        default=IDLE,
        help=f"seconds over which the idle cost is measured after each step (default {IDLE:g}; the keepalive's "
        "rounds are 20 s: a longer measure is steadier)",
    )
    parser.add_argument("--out", default=str(BENCH / "results" / "connect_beside.json"))
    args = parser.parse_args()
    out: dict[str, Any] = {"calibration_ms": calibrate(), "step": args.step, "rounds": []}
    for r in range(args.rounds):
        say(f"round {r + 1} of {args.rounds}")
        out["rounds"].append(asyncio.run(climb(args, str(Path(args.against).resolve()))))
    for key, what in (("ratio", "net of the idle cost"), ("raw_ratio", "raw")):
        ratios = [s[key] for rnd in out["rounds"] for s in rnd["steps"] if s[key]]
        if ratios:
            out[f"{key}_median"] = statistics.median(ratios)
            say(f"CPU per connect ({what}), this / against: median {out[f'{key}_median']:.2f} over {len(ratios)} steps")
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    say(f"written to {args.out}")


if __name__ == "__main__":
    sys.exit(main())

"""What one more client costs a replica, against the number already connected.

Unmodified hypha-rpc clients (``connect_to_server``, each in one workspace
with one token: the client registers its built-in service, fetches the
manager service twice and subscribes to ``client_disconnected``, as every
hypha-rpc client does) connect to one replica in steps of ``--step`` and then
stay idle. Per step: handshakes/s (from the first dial to the last client
ready), the replica's CPU per connect, and its RSS once the step has settled.
The CPU of a step is the replica's CPU from the step's start until
``SETTLE`` seconds after its last connect (hypha-rpc asks for a fresh
reconnection token two seconds after connecting), less what the replica
spends anyway with that many idle clients (their keepalives), which is
measured right after, over ``--idle`` seconds (one keepalive round, 20 s), and charged at the mean of the
rates before and after the step. RSS per idle connection is the slope of the
settled RSS against the number connected, per step and over the whole run.

The clients live in ``--workers`` child processes (``_connect_clients.py``), so that
their own CPU is not the replica's; steps go on until ``--clients`` are
connected or ``--budget`` seconds have passed. By default the replica runs on
a Valkey (``switchboard.testing.valkey``), as a replica of a hub does;
``--memory`` runs it on the embedded backends.

On a Valkey a second replica runs beside it, and a provider on the measured
replica and a caller on the second one (in a workspace of their own) measure
the cross-replica echo's p50 and p99 (``--echo-calls`` calls one after the
other) before the first step and after the last, with every idle client
connected. Each figure is reported with the machine's load average.

    .venv/bin/python bench/connect_cost.py [--clients 10000] [--step 1000] [--budget 600]
                                           [--workers 2] [--concurrency 16] [--memory]
                                           [--echo-calls 300] [--profile FILE] [--idle 20]
                                           [--against OTHER_REVISION/src]

``--against`` measures the replica code of another revision's ``src/`` (e.g.
from ``git worktree add`` or ``git archive``) at the same time, each revision
on a Valkey of its own with its own client processes: every step is taken by
both together, the idle cost over the same seconds, the echoes in alternating
blocks. It reports this one's RSS per idle connection, CPU per connect and
echo latency as ratios to the other's. Measured one after the other, the two
figures of a step come from different minutes of a shared machine, and a
connect's CPU follows how fast the machine is at the time: this revision
against itself, one after the other (10,000 clients in steps of 2,000),
gave 1.01, 0.66, 0.88, 1.05 and 1.31 per step; at the same time, 1.01, 1.03,
0.98, 0.99 and 0.99. ``--profile FILE``: this revision's replica
runs under cProfile, written (SIGUSR2) before the clients leave.

Prints a table and writes ``bench/results/connect_cost.json``.

History: the manager's RPC had handled every connect's four calls, about half of a connect's CPU (the
manager's door answers them now); an admission's Redis round trips went from 10 to 5 (one pipeline and one
script, ``backends/redis/stores/entrance.py``); RSS per idle connection from 29.7 to 17.9 KiB.
``--against`` measured the two revisions one after the other until ``connect_beside.py``'s way of
running them at once replaced it (and that program).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import BENCH, JWT_SECRET, Child, calibrate, pct, pid_cpu, pid_rss, raise_fd_limit, say
from _connect_clients import Echo, load, token_for_bench

CLIENTS = str(BENCH / "_connect_clients.py")

SETTLE = 3.0  # seconds after a step's last connect that still count as its work (the token refresh at 2 s)
# Seconds over which the idle cost at a level is measured: one round of the keepalive (a hypha-rpc
# client pings every 20 s). Over 2 s the measure caught whatever share of a round's pings fell in it
# (0.5 to 12.5 % of a core at 10,000 clients, run to run), and charged over a step of 20 s that
# moved a connect's net cost by as much as a millisecond.
IDLE = 20.0


# --------------------------------------------------------------------------- the driver


class Side:
    """One revision under measure: its Valkey, its replica (and a sibling with the echo), and the
    processes holding its clients."""

    def __init__(self, name: str, src: str | None, args: argparse.Namespace) -> None:
        self.name, self.src, self.args = name, src, args
        self.valkey: Any = None
        self.replica: Any = None
        self.sibling: Any = None
        self.echo: Echo | None = None
        self.workers: list[Child] = []
        self.connected = 0
        self.steps: list[dict[str, Any]] = []
        self.out: dict[str, Any] = {"steps": self.steps}

    @property
    def profiled(self) -> bool:
        return bool(self.args.profile) and self.src is None

    async def start(self, work: Path) -> Side:
        from switchboard.testing.replica import ReplicaProcess
        from switchboard.testing.valkey import ValkeyServer

        args = self.args
        env = {"SWITCHBOARD_LOG_LEVEL": "WARNING", **({"PYTHONPATH": self.src} if self.src else {})}
        self.valkey = None if args.memory else ValkeyServer().start()
        limit = str(args.clients * 2 + 100)
        self.replica = (profiled_replica() if self.profiled else ReplicaProcess)(
            replica_id=f"connect-cost-{self.name}",
            redis_url=self.valkey.url if self.valkey else None,
            jwt_secret=JWT_SECRET,
            args=["--max-connections-per-workspace", limit, "--max-connections-per-user", limit],
            env=env,
        )
        if self.profiled:
            self.replica.profile = args.profile
        self.replica.start(timeout=60)
        if self.valkey is not None and args.echo_calls:
            self.sibling = ReplicaProcess(
                replica_id=f"connect-cost-{self.name}-b", redis_url=self.valkey.url, jwt_secret=JWT_SECRET, env=env
            ).start(timeout=60)
            self.echo = await Echo(self.replica.url, self.sibling.url).start()
        token = token_for_bench()
        self.workers = [
            await Child(f"connect-{self.name}-{i}", [CLIENTS, self.replica.url, token, f"{self.name}{i}"], work).start()
            for i in range(args.workers)
        ]
        return self

    @property
    def pid(self) -> int | None:
        return self.replica.proc.pid if self.replica and self.replica.proc else None

    async def open(self, n: int) -> tuple[int, dict[str, int], float]:
        """``n`` more clients; how many are connected now, the errors, when the last one was in."""
        k = len(self.workers)
        share = [n // k + (1 if i < n % k else 0) for i in range(k)]
        answers = await asyncio.gather(
            *(
                w.request({"open": s, "concurrency": self.args.concurrency}, timeout=900)
                for w, s in zip(self.workers, share, strict=True)
            )
        )
        errors: dict[str, int] = {}
        for a in answers:
            for key, v in a["errors"].items():
                errors[key] = errors.get(key, 0) + v
        return sum(a["open"] for a in answers), errors, time.perf_counter()

    async def stop(self) -> None:
        if self.profiled and self.pid is not None:
            # before the clients leave: their departures are not what is measured
            await asyncio.to_thread(dump_profile, self.pid, Path(self.args.profile))
        if self.echo is not None:
            await self.echo.stop()
        # the replicas go first: thousands of clients leaving one by one cost the replica the
        # square of their number (each departure is announced to every client left) and the
        # bench minutes, measuring nothing
        for replica in (self.sibling, self.replica):
            if replica is not None:
                replica.kill()
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


async def echoes(sides: list[Side], calls: int, key: str, blocks: int = 3) -> None:
    """Each side's echo p50 and p99 over ``calls`` calls, taken in ``blocks`` that alternate between
    the sides, so that both see the same minutes of the machine."""
    live = [s for s in sides if s.echo is not None]
    if not live:
        return
    samples: dict[str, list[float]] = {s.name: [] for s in live}
    for side in live:
        assert side.echo is not None
        await side.echo.warm()
    per_block = max(1, calls // blocks)
    for b in range(blocks):
        for side in live if b % 2 == 0 else live[::-1]:
            assert side.echo is not None
            samples[side.name] += await side.echo.block(per_block)
    for side in live:
        side.out[key] = {
            "calls": len(samples[side.name]),
            "p50_ms": pct(samples[side.name], 50),
            "p99_ms": pct(samples[side.name], 99),
            "load": load(),
            "idle": side.connected,
        }
        e = side.out[key]
        say(
            f"{side.name}: echo A<-B with {side.connected} idle: p50 {e['p50_ms']:.2f} ms  "
            f"p99 {e['p99_ms']:.2f} ms  (load {e['load']:.1f})"
        )


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """One climb: of this revision alone, or of it and ``--against`` at once."""
    raise_fd_limit()
    work = Path(tempfile.mkdtemp(prefix="bench-connect-"))  # the workers' logs
    sides = [Side("this", None, args)]
    if args.against:
        sides.insert(0, Side("against", args.against, args))
    out: dict[str, Any] = {
        "backend": "memory" if args.memory else "valkey",
        "calibration_ms": calibrate(),
        "step": args.step,
        "sides": {s.name: s.out for s in sides},
    }
    try:
        for side in sides:
            await side.start(work)
        await echoes(sides, args.echo_calls, "echo_idle_0")
        for side in sides:
            side.out["empty"] = {"rss_bytes": pid_rss(side.pid)}
        rates = await idle_rates(sides, args.idle)
        started = time.perf_counter()
        while sides[0].connected < args.clients and time.perf_counter() - started < args.budget:
            made = await step(sides, args, rates)
            rates = [s.steps[-1]["idle_cpu_per_s"] for s in sides]
            if not all(made):
                break
        await echoes(sides, args.echo_calls, "echo_idle_n")
        for side in sides:
            summarize(side)
    finally:
        for side in sides:
            await side.stop()
    if args.against:
        out["ratios_this_to_against"] = ratios(out["sides"]["this"], out["sides"]["against"])
    return out


async def step(sides: list[Side], args: argparse.Namespace, rates: list[float]) -> list[int]:
    """Every side connects ``--step`` more clients at once; each one's figures for the step."""
    before = sides[0].connected
    n = min(args.step, args.clients - before)
    cpu0, t0 = [pid_cpu(s.pid) or 0.0 for s in sides], time.perf_counter()
    done = await asyncio.gather(*(s.open(n) for s in sides))
    await asyncio.sleep(SETTLE)
    cpu1, t1 = [pid_cpu(s.pid) or 0.0 for s in sides], time.perf_counter()
    load_now = load()
    after = await idle_rates(sides, args.idle)
    made_all = []
    for i, (side, (opened, errors, last)) in enumerate(zip(sides, done, strict=True)):
        made = opened - side.connected
        idle = (rates[i] + after[i]) / 2 * (t1 - t0)
        rss = pid_rss(side.pid)
        previous_rss = side.steps[-1]["rss_bytes"] if side.steps else side.out["empty"]["rss_bytes"]
        record = {
            "before": side.connected,
            "after": opened,
            "made": made,
            "errors": errors,
            "handshakes_per_s": made / (last - t0) if made else None,
            "cpu_ms_per_connect": ((cpu1[i] - cpu0[i]) - idle) * 1e3 / made if made else None,
            "cpu_ms_per_connect_raw": (cpu1[i] - cpu0[i]) * 1e3 / made if made else None,
            "idle_cpu_per_s": after[i],
            "load": load_now,
            "rss_bytes": rss,
            "rss_kib_per_connection": ((rss or 0) - (previous_rss or 0)) / 1024 / made if made else None,
        }
        side.steps.append(record)
        side.connected = opened
        made_all.append(made)
        say(
            f"{side.name:>7} {before:>6}-{opened:<6} {record['handshakes_per_s'] or 0:6.1f}/s  "
            f"cpu {record['cpu_ms_per_connect'] or float('nan'):6.2f} ms/connect "
            f"(raw {record['cpu_ms_per_connect_raw'] or float('nan'):6.2f})  idle {after[i] * 100:5.1f}%  "
            f"rss {(rss or 0) / 2**20:7.1f} MiB  {record['rss_kib_per_connection'] or 0:5.1f} KiB/conn  "
            f"errors {sum(errors.values())}  load {load_now:.1f}"
        )
    return made_all


def summarize(side: Side) -> None:
    """RSS per idle connection over the whole climb, and how CPU per connect grew from first step to last."""
    steps, out = side.steps, side.out
    base_rss = out["empty"]["rss_bytes"]
    if steps and steps[-1]["after"] > 0 and base_rss:
        out["rss_kib_per_connection"] = ((steps[-1]["rss_bytes"] or 0) - base_rss) / 1024 / steps[-1]["after"]
        say(f"{side.name}: RSS per idle connection overall: {out['rss_kib_per_connection']:.1f} KiB")
    if len(steps) >= 2 and steps[0]["cpu_ms_per_connect"] and steps[-1]["cpu_ms_per_connect"]:
        out["cpu_growth_last_vs_first"] = steps[-1]["cpu_ms_per_connect"] / steps[0]["cpu_ms_per_connect"]
        say(f"{side.name}: CPU per connect, last step / first: {out['cpu_growth_last_vs_first']:.2f}")


def profiled_replica() -> type:
    from switchboard.testing.replica import ReplicaProcess

    class Profiled(ReplicaProcess):
        """The replica under cProfile (``--profile FILE``), written on SIGUSR2 (:func:`dump_profile`)."""

        profile = ""

        def command(self) -> list[str]:
            cmd = super().command()
            return [cmd[0], __file__, "--profiled-replica", self.profile, *cmd[3:]]

    return Profiled


def dump_profile(pid: int, path: Path, timeout: float = 60.0) -> None:
    """Have the profiled replica write its profile (SIGUSR2) and wait, bounded, until it has."""
    path.unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)  # the dump is written in one go; let it finish
    say(f"profile {'written to ' + str(path) if path.exists() else 'NOT written'}")


def profiled_serve(path: str, argv: list[str]) -> None:
    """``switchboard <argv>`` under cProfile, written to ``path`` on SIGUSR2 (a replica drained
    of thousands of clients may not exit within the bench's patience: the profile is asked for
    while they are still connected)."""
    import cProfile

    from switchboard.cli import main as cli

    profiler = cProfile.Profile()

    def dump(signum: int, frame: object) -> None:
        profiler.disable()
        profiler.dump_stats(path)

    signal.signal(signal.SIGUSR2, dump)
    profiler.enable()
    cli(argv)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--profiled-replica":
        profiled_serve(sys.argv[2], sys.argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=10_000, help="connect up to this many (default 10000)")
    parser.add_argument("--step", type=int, default=1000, help="clients per step (default 1000)")
    parser.add_argument("--budget", type=float, default=600.0, help="no new step after this many seconds (default 600)")
    parser.add_argument("--workers", type=int, default=2, help="client processes per revision (default 2)")
    parser.add_argument("--concurrency", type=int, default=16, help="handshakes in flight per worker")
    parser.add_argument("--memory", action="store_true", help="the embedded backends instead of a Valkey")
    parser.add_argument(
        "--echo-calls",
        type=int,
        default=300,
        help="cross-replica echoes measured before the first step and after the last (Valkey only; 0: none)",
    )
    parser.add_argument("--profile", default="", help="run this revision's replica under cProfile, written here")
    parser.add_argument(
        "--idle",
        type=float,
        default=IDLE,
        help=f"seconds over which the idle cost is measured after each step (default {IDLE:g}: one keepalive round)",
    )
    parser.add_argument(
        "--against",
        default="",
        help="measure the replica code of this directory (another revision's src/) at the same time; report ratios",
    )
    parser.add_argument("--out", default=str(BENCH / "results" / "connect_cost.json"))
    args = parser.parse_args()
    if args.against:
        args.against = str(Path(args.against).resolve())
    result = asyncio.run(run(args))
    for key, value in result.get("ratios_this_to_against", {}).items():
        say(f"{key}, this / against: {value:.2f}")
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    say(f"written to {args.out}")


def ratios(this: dict[str, Any], before: dict[str, Any]) -> dict[str, float]:
    """RSS per idle connection overall, and CPU per connect at each step both reached."""
    out: dict[str, float] = {}
    if this.get("rss_kib_per_connection") and before.get("rss_kib_per_connection"):
        out["rss_kib_per_connection"] = this["rss_kib_per_connection"] / before["rss_kib_per_connection"]
    for when in ("echo_idle_0", "echo_idle_n"):
        for q in ("p50_ms", "p99_ms"):
            if this.get(when, {}).get(q) and before.get(when, {}).get(q):
                out[f"{when} {q}"] = this[when][q] / before[when][q]
    for mine, theirs in zip(this["steps"], before["steps"], strict=False):
        if mine["after"] == theirs["after"] and mine["cpu_ms_per_connect"] and theirs["cpu_ms_per_connect"]:
            out[f"cpu_ms_per_connect at {mine['before']}"] = mine["cpu_ms_per_connect"] / theirs["cpu_ms_per_connect"]
    return out


if __name__ == "__main__":
    main()

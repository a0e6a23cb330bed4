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

The clients live in ``--workers`` child processes of this script, so that
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

``--against`` first measures the replica code of another revision's ``src/``
(e.g. from ``git worktree add`` or ``git archive``) the same way, and reports
this one's RSS per idle connection, CPU per connect and echo latency as ratios
to it. ``--profile FILE``: the replica runs under cProfile, written (SIGUSR2)
before the clients leave.

Prints a table and writes ``bench/results/connect_cost.json``.

History: the manager's RPC had handled every connect's four calls, about half of a connect's CPU (the
manager's door answers them now); an admission's Redis round trips went from 10 to 5 (one pipeline and one
script, ``backends/redis/stores/entrance.py``); RSS per idle connection from 29.7 to 17.9 KiB.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    BENCH,
    JWT_SECRET,
    Child,
    calibrate,
    commands,
    pct,
    pid_cpu,
    pid_rss,
    raise_fd_limit,
    say,
)

WORKSPACE = "bench-connect"
ECHO_WORKSPACE = "bench-echo"  # the echo's provider and caller: not among the idle clients' events
SETTLE = 3.0  # seconds after a step's last connect that still count as its work (the token refresh at 2 s)
# Seconds over which the idle cost at a level is measured: one round of the keepalive (a hypha-rpc
# client pings every 20 s). Over 2 s the measure caught whatever share of a round's pings fell in it
# (0.5 to 12.5 % of a core at 10,000 clients, run to run), and charged over a step of 20 s that
# moved a connect's net cost by as much as a millisecond.
IDLE = 20.0


# --------------------------------------------------------------------------- the client worker


async def worker() -> None:
    """Holds hypha-rpc clients; commands on stdin: ``{"open": n, "concurrency": c}``, ``{"close": true}``."""
    from hypha_rpc import connect_to_server

    logging.getLogger().setLevel(logging.CRITICAL)
    # the answers keep stdout to themselves: whatever else prints there goes to the log
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    def reply(msg: dict[str, Any]) -> None:
        answers.write(json.dumps(msg) + "\n")
        answers.flush()

    url, token, prefix = sys.argv[2], sys.argv[3], sys.argv[4]
    clients: list[Any] = []
    serial = 0
    async for cmd in commands():
        if cmd.get("close"):
            for client in clients:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.disconnect(), 1)
            reply({"closed": len(clients)})
            clients.clear()
            continue
        sem = asyncio.Semaphore(int(cmd.get("concurrency", 16)))
        errors: dict[str, int] = {}
        t0 = time.perf_counter()

        async def one(cid: str, sem: asyncio.Semaphore = sem, errors: dict[str, int] = errors) -> None:
            async with sem:
                try:
                    config = {"server_url": url, "client_id": cid, "token": token, "workspace": WORKSPACE}
                    clients.append(await asyncio.wait_for(connect_to_server(config), 60))
                except Exception as exc:
                    key = f"{type(exc).__name__}: {str(exc)[:100]}"
                    errors[key] = errors.get(key, 0) + 1

        names = [f"{prefix}-{serial + i}" for i in range(int(cmd["open"]))]
        serial += len(names)
        await asyncio.gather(*(one(name) for name in names))
        reply({"open": len(clients), "errors": errors, "seconds": time.perf_counter() - t0})


# --------------------------------------------------------------------------- the driver


def token_for_bench(workspace: str = WORKSPACE) -> str:
    from switchboard.clock import SystemClock
    from switchboard.hub.identity.auth import TokenIssuer
    from switchboard.hub.identity.users import Permission, User

    issuer = TokenIssuer(JWT_SECRET, SystemClock())
    user = User(id="bench-connect", roles=("user",))
    return issuer.issue(user, workspace=workspace, permission=Permission.READ_WRITE, expires_in=3 * 3600)


def load() -> float:
    """The machine's load average over the last minute (``uptime``'s first figure)."""
    return os.getloadavg()[0]


class Echo:
    """A provider on the measured replica and a caller on a second replica of the same Valkey,
    in a workspace of their own: cross-replica echo latency, without and with the idle clients."""

    def __init__(self, provider_url: str, caller_url: str) -> None:
        self.urls = provider_url, caller_url
        self.clients: list[Any] = []
        self.service: Any = None

    async def start(self) -> Echo:
        from hypha_rpc import connect_to_server

        token = token_for_bench(ECHO_WORKSPACE)
        provider = await connect_to_server(
            {"server_url": self.urls[0], "client_id": "echo-provider", "token": token, "workspace": ECHO_WORKSPACE}
        )
        self.clients.append(provider)
        await provider.register_service({"id": "echo", "config": {"visibility": "protected"}, "echo": lambda x: x})
        caller = await connect_to_server(
            {"server_url": self.urls[1], "client_id": "echo-caller", "token": token, "workspace": ECHO_WORKSPACE}
        )
        self.clients.append(caller)
        self.service = await caller.get_service(f"{ECHO_WORKSPACE}/echo-provider:echo")
        return self

    async def measure(self, calls: int) -> dict[str, float]:
        """``calls`` echoes one after the other (after 100 unmeasured, and the direct link between
        the replicas in place): p50 and p99 in ms."""
        for i in range(100):
            await self.service.echo(i)
        await asyncio.sleep(0.5)
        samples = []
        for i in range(calls):
            t0 = time.perf_counter()
            await self.service.echo(i)
            samples.append((time.perf_counter() - t0) * 1e3)
        return {
            "calls": calls,
            "p50_ms": pct(samples, 50),
            "p99_ms": pct(samples, 99),
            "load": load(),
        }

    async def stop(self) -> None:
        for client in self.clients:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.disconnect(), 5)


async def idle_rate(pid: int | None, seconds: float = IDLE) -> float:
    """The replica's CPU seconds per second over ``seconds``."""
    c0, t0 = pid_cpu(pid) or 0.0, time.perf_counter()
    await asyncio.sleep(seconds)
    return ((pid_cpu(pid) or 0.0) - c0) / (time.perf_counter() - t0)


def profiled_replica() -> type:
    from switchboard.testing.replica import ReplicaProcess

    class Profiled(ReplicaProcess):
        """The replica under cProfile (``--profile FILE``), written on SIGUSR2 (:func:`dump_profile`)."""

        profile = ""

        def command(self) -> list[str]:
            cmd = super().command()
            return [cmd[0], __file__, "--profiled-replica", self.profile, *cmd[3:]]

    return Profiled


async def run(args: argparse.Namespace, src: str | None = None) -> dict[str, Any]:
    """One measurement, of the replica code under ``src`` (another revision's ``src``) or of this one."""
    from switchboard.testing.replica import ReplicaProcess
    from switchboard.testing.valkey import ValkeyServer

    raise_fd_limit()
    Profiled = profiled_replica()
    valkey = None if args.memory else ValkeyServer().start()
    limit = str(args.clients * 2 + 100)
    replica = (Profiled if args.profile else ReplicaProcess)(
        replica_id="connect-cost",
        redis_url=valkey.url if valkey else None,
        jwt_secret=JWT_SECRET,
        args=["--max-connections-per-workspace", limit, "--max-connections-per-user", limit],
        env={"SWITCHBOARD_LOG_LEVEL": "WARNING", **({"PYTHONPATH": src} if src else {})},
    )
    if args.profile:
        replica.profile = args.profile  # type: ignore[attr-defined]
    replica.start(timeout=60)
    pid = replica.proc.pid if replica.proc else None
    sibling = echo = None
    if valkey is not None and args.echo_calls:
        sibling = ReplicaProcess(
            replica_id="connect-cost-b",
            redis_url=valkey.url,
            jwt_secret=JWT_SECRET,
            env={"SWITCHBOARD_LOG_LEVEL": "WARNING", **({"PYTHONPATH": src} if src else {})},
        ).start(timeout=60)
    token = token_for_bench()
    work = Path(tempfile.mkdtemp(prefix="bench-connect-"))  # the workers' logs
    workers = [
        await Child(f"connect-worker-{i}", [__file__, "--worker", replica.url, token, f"w{i}"], work).start()
        for i in range(args.workers)
    ]
    steps: list[dict[str, Any]] = []
    out: dict[str, Any] = {
        "backend": "memory" if args.memory else "valkey",
        "calibration_ms": calibrate(),
        "step": args.step,
        "steps": steps,
    }
    try:
        if sibling is not None:
            echo = await Echo(replica.url, sibling.url).start()
            out["echo_idle_0"] = await echo.measure(args.echo_calls)
            e = out["echo_idle_0"]
            say(f"echo A<-B with 0 idle: p50 {e['p50_ms']:.2f} ms  p99 {e['p99_ms']:.2f} ms  (load {e['load']:.1f})")
        connected = 0
        started = time.perf_counter()
        base_rss = pid_rss(pid)
        rate_before = await idle_rate(pid, args.idle)
        out["empty"] = {"rss_bytes": base_rss, "idle_cpu_per_s": rate_before}
        while connected < args.clients and time.perf_counter() - started < args.budget:
            n = min(args.step, args.clients - connected)
            share = [n // len(workers) + (1 if i < n % len(workers) else 0) for i in range(len(workers))]
            cpu0, t0 = pid_cpu(pid) or 0.0, time.perf_counter()
            answers = await asyncio.gather(
                *(
                    w.request({"open": k, "concurrency": args.concurrency}, timeout=600)
                    for w, k in zip(workers, share, strict=True)
                )
            )
            dial = time.perf_counter() - t0
            await asyncio.sleep(SETTLE)
            cpu1, t1 = pid_cpu(pid) or 0.0, time.perf_counter()
            opened = sum(a["open"] for a in answers)
            made = opened - connected
            errors: dict[str, int] = {}
            for a in answers:
                for k, v in a["errors"].items():
                    errors[k] = errors.get(k, 0) + v
            rss = pid_rss(pid)
            load_now = load()
            rate_after = await idle_rate(pid, args.idle)
            idle_share = (rate_before + rate_after) / 2 * (t1 - t0)
            step = {
                "before": connected,
                "after": opened,
                "made": made,
                "errors": errors,
                "handshakes_per_s": made / dial if dial else None,
                "cpu_ms_per_connect": ((cpu1 - cpu0) - idle_share) * 1e3 / made if made else None,
                "cpu_ms_per_connect_raw": (cpu1 - cpu0) * 1e3 / made if made else None,
                "idle_cpu_per_s": rate_after,
                "load": load_now,
                "rss_bytes": rss,
                "rss_kib_per_connection": ((rss or 0) - (steps[-1]["rss_bytes"] if steps else base_rss or 0))
                / 1024
                / made
                if made
                else None,
            }
            steps.append(step)
            say(
                f"{connected:>6}-{opened:<6} {step['handshakes_per_s']:6.1f}/s  "
                f"cpu {step['cpu_ms_per_connect']:6.2f} ms/connect (raw {step['cpu_ms_per_connect_raw']:6.2f})  "
                f"idle {rate_after * 100:5.1f}%  rss {(rss or 0) / 2**20:7.1f} MiB  "
                f"{step['rss_kib_per_connection']:5.1f} KiB/conn  errors {sum(errors.values())}  load {load_now:.1f}"
            )
            connected, rate_before = opened, rate_after
            if not made:
                break
        if steps and steps[-1]["after"] > 0 and base_rss:
            out["rss_kib_per_connection"] = ((steps[-1]["rss_bytes"] or 0) - base_rss) / 1024 / steps[-1]["after"]
        if echo is not None and steps:
            out["echo_idle_n"] = {"idle": steps[-1]["after"], **await echo.measure(args.echo_calls)}
            e = out["echo_idle_n"]
            say(
                f"echo A<-B with {e['idle']} idle on A: p50 {e['p50_ms']:.2f} ms  p99 {e['p99_ms']:.2f} ms  "
                f"(load {e['load']:.1f})"
            )
        if len(steps) >= 2:
            first, last = steps[0], steps[-1]
            out["cpu_growth_last_vs_first"] = (
                last["cpu_ms_per_connect"] / first["cpu_ms_per_connect"] if first["cpu_ms_per_connect"] else None
            )
    finally:
        if args.profile and pid is not None:
            # before the clients leave: their departures are not what is measured
            await asyncio.to_thread(dump_profile, pid, Path(args.profile))
        if echo is not None:
            await echo.stop()
        # the replicas go first: thousands of clients leaving one by one cost the replica the
        # square of their number (each departure is announced to every client left) and the
        # bench minutes, measuring nothing
        if sibling is not None:
            sibling.kill()
        replica.kill()
        for w in workers:
            await w.stop()
        if valkey is not None:
            valkey.stop()
    return out


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
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        asyncio.run(worker())
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=10_000, help="connect up to this many (default 10000)")
    parser.add_argument("--step", type=int, default=1000, help="clients per step (default 1000)")
    parser.add_argument("--budget", type=float, default=600.0, help="no new step after this many seconds (default 600)")
    parser.add_argument("--workers", type=int, default=2, help="client processes (default 2)")
    parser.add_argument("--concurrency", type=int, default=16, help="handshakes in flight per worker")
    parser.add_argument("--memory", action="store_true", help="the embedded backends instead of a Valkey")
    parser.add_argument(
        "--echo-calls",
        type=int,
        default=300,
        help="cross-replica echoes measured before the first step and after the last (Valkey only; 0: none)",
    )
    parser.add_argument("--profile", default="", help="run the replica under cProfile, written to this file")
    parser.add_argument(
        "--idle",
        type=float,
        default=IDLE,
        help=f"seconds over which the idle cost is measured after each step (default {IDLE:g}: one keepalive round)",
    )
    parser.add_argument(
        "--against",
        default="",
        help="first measure the replica code of this directory (another revision's src/), then report ratios",
    )
    parser.add_argument("--out", default=str(BENCH / "results" / "connect_cost.json"))
    args = parser.parse_args()
    before = None
    if args.against:
        say(f"against {args.against}:")
        before = asyncio.run(run(args, str(Path(args.against).resolve())))
        say("this revision:")
    result = asyncio.run(run(args))
    say(f"RSS per idle connection overall: {result.get('rss_kib_per_connection') or float('nan'):.1f} KiB")
    say(f"CPU per connect, last step / first: {result.get('cpu_growth_last_vs_first') or float('nan'):.2f}")
    if before is not None:
        result = {"this": result, "against": before, "ratios_this_to_against": ratios(result, before)}
        for key, value in result["ratios_this_to_against"].items():
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

"""A drain storm: thousands of clients moved from a draining replica to its sibling.

    .venv/bin/python bench/storm.py [--sdk 1000] [--hypha 0] [--grace 5] [--workers 4]
                                    [--against OTHER_REVISION/src] [--holds]

Two replicas (A, B) on one real Valkey. ``--sdk`` Switchboard SDK clients (``switchboard.connect``
with both URLs) and ``--hypha`` unmodified hypha-rpc clients (through the test balancer, which then
sends them to B) connect to A, all in one workspace, each registering one service; on B, a provider
and a caller that calls its echo in a loop (B's existing clients, in a process of their own), and a caller that calls the
moving clients' services throughout and watches ``client_disconnected``. Then A gets SIGTERM.

Reported: seconds until every client is owned by B (back); per client, the time from its own
hand-over (its transit mark, on Redis's clock) to being back, max against ``--grace``; whether
every service is listed and callable afterwards; ``client_disconnected`` announcements seen
(must be 0); calls to moving clients lost; B's CPU for the move; the longest gap in B's
admissions; B's echo p50/p99 before and during the move; A's exit status and time.

The clients run in ``--workers`` child processes (``_storm_clients.py``) so the client side is not
one saturated event loop. ``--against SRC`` also runs the same storm on another revision's
``src`` (e.g. ``git worktree add /tmp/base main``), and reports ratios; ``--rounds N``, N pairs of
storms with the two revisions in turns, each pair's ratios and their medians. Two storms of the
same code, one after the other, gave B's CPU ×0.87 (December 2026, 3,000 SDK clients): a pair is
two minutes of a shared machine apart, so one pair resolves only large changes. ``--holds`` records what
held B's loop (``_holds/sitecustomize.py``: ran or waited for a core, garbage collections). Writes
``bench/results/storm.json``. Loopback only; every phase is bounded (:data:`GIVE_UP`).

History: on main 642c9a8 only 1,057 of 1,000 SDK + 200 hypha-rpc clients were back within 90 s, 922 past
their grace; sending in waves sized by the sibling's admissions (``--drain-window``, 50 after measuring 200 and
all-at-once) brought every client back within its grace.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import logging
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Child, pct, raise_fd_limit  # noqa: E402

from switchboard.client import connect  # noqa: E402
from switchboard.hub.identity.users import user_workspace
from switchboard.testing import ValkeyServer  # noqa: E402
from switchboard.testing.balancer import Balancer  # noqa: E402
from switchboard.testing.crowd import admin_token  # noqa: E402
from switchboard.testing.replica import ReplicaProcess  # noqa: E402

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results" / "storm.json"
CLIENTS = str(BENCH / "_storm_clients.py")
GIVE_UP = 240.0  # seconds: the longest any phase may take
BACK_BOUND = 80.0  # seconds after the drain timeout: clients not back by then are reported as not back
USER = "storm-user"
POLL = 0.05  # seconds between two reads of who owns which client
SWEEP_ATTEMPTS = 5  # tries per service in the sweep afterwards, when the hub's per-client rate limit (1,000 messages/s) turns the sweep away


class Owners:
    """Reads ``sb:owner`` and the transit marks every :data:`POLL` s on a thread: for every client,
    when it was first seen handed over (its mark's own time, on Redis's clock, mapped to ours) and
    when first seen owned by B."""

    def __init__(self, valkey: ValkeyServer, moved: set[str], b: str) -> None:
        self.valkey = valkey
        self.moved = moved
        self.b = b
        self.left: dict[str, float] = {}
        self.back: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Owners:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        with self.valkey.client() as r:
            while not self._stop.is_set():
                with contextlib.suppress(Exception):
                    pipe = r.pipeline(transaction=False)
                    pipe.time()
                    pipe.hgetall("sb:transit:left")
                    pipe.hgetall("sb:owner")
                    before = time.monotonic()
                    (sec, usec), left, owners = pipe.execute()
                    now = time.monotonic()
                    offset = (before + now) / 2 - (sec + usec / 1e6)  # ours minus Redis's
                    for key, at in left.items():
                        self.left.setdefault(key.decode(), float(at) / 1e3 + offset)  # ms on Redis
                    for key, owner in owners.items():
                        k = key.decode()
                        if owner.decode() == self.b and k in self.moved and k not in self.back:
                            self.back[k] = now
                self._stop.wait(POLL)

    def all_back(self) -> bool:
        return len(self.back) >= len(self.moved)


class Echo:
    """B's existing clients: sequential echo calls from a caller to a provider, both on B, in a child
    process of their own (``_storm_clients.py echo``). In the bench's process their calls waited behind
    its own work (reading every owner and transit mark from Redis 20 times a second, the calls to the
    moving clients): holds of up to 0.22 s of its loop with 6,000 clients, not B's."""

    def __init__(self, child: Child) -> None:
        self.child = child
        self.samples: list[tuple[float, float, bool]] = []  # (start, seconds, ok), on the machine's monotonic clock

    async def start(self, url: str, workspace: str, token: str) -> None:
        await self.child.request({"echo": {"url": url, "workspace": workspace, "token": token}}, 60)

    async def stop(self) -> None:
        answer = await self.child.request({"samples": True}, 60)
        self.samples = [(t, d, ok) for t, d, ok in answer["samples"]]

    def between(self, lo: float, hi: float) -> dict[str, Any]:
        s = sorted(d for t, d, ok in self.samples if lo <= t < hi and ok)
        failed = sum(1 for t, _, ok in self.samples if lo <= t < hi and not ok)
        return {
            "calls": len(s),
            "failed": failed,
            "p50_ms": pct(s, 50) * 1e3 if s else None,
            "p99_ms": pct(s, 99) * 1e3 if s else None,
        }


class Mover:
    """Calls the moving clients' services throughout the move (round robin); every failure is a call lost."""

    def __init__(self, caller: Any, targets: list[str], concurrency: int = 4) -> None:
        self.caller = caller
        self.targets = targets
        self.concurrency = concurrency
        self.calls = 0
        self.lost: dict[str, int] = {}
        self.running = True
        self._next = 0

    async def run(self) -> None:
        await asyncio.gather(*(self._loop() for _ in range(self.concurrency)))

    async def _loop(self) -> None:
        while self.running:
            target = self.targets[self._next % len(self.targets)]
            self._next += 1
            try:
                svc = await self.caller.get_service(f"{target}:s")
                await asyncio.wait_for(svc.echo(1), 30)
            except Exception as exc:
                key = f"{type(exc).__name__}: {str(exc).splitlines()[-1][:100] if str(exc) else ''}"
                self.lost[key] = self.lost.get(key, 0) + 1
            self.calls += 1
            await asyncio.sleep(0.02)


def _sdk_transit(events: list[list[Any]], t0: float) -> float:
    """An SDK client's own view: from the drain's notice (its close, 1012) to its next connection."""
    gone = next((t for kind, code, t in events if kind == "disconnected" and t >= t0), None)
    back = next((t for kind, _, t in events if kind == "reconnected" and gone is not None and t >= gone), None)
    return float("inf") if gone is None or back is None else back - gone


def holds(path: Path, lo: float, hi: float) -> dict[str, Any]:
    """B's loop held more than 20 ms between ``lo`` and ``hi`` (bench/_holds): how often, how long in
    all, how much of it B ran and how much it waited for a core; its garbage collections' pauses."""
    lines = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    lines = [x for x in lines if lo <= x["t"] < hi]
    held = [x for x in lines if x["late_ms"] > 20]
    pauses: dict[int, list[float]] = {}
    for x in lines:
        for generation, cpu_ms, _ in x["gc"]:
            pauses.setdefault(generation, []).append(cpu_ms)
    return {
        "over_20ms": len(held),
        "total_ms": round(sum(x["late_ms"] for x in held)),
        "ran_ms": round(sum(x["ran_ms"] for x in held)),
        "waited_for_a_core_ms": round(sum(x["waited_ms"] for x in held)),
        "longest_ms": round(max((x["late_ms"] for x in held), default=0.0), 1),
        "gc_pauses_over_2ms": {
            str(g): {"n": len(p), "max_cpu_ms": round(max(p), 1)} for g, p in sorted(pauses.items())
        },
    }


def cpu(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


async def until(check: Any, what: str, bound: float = GIVE_UP, interval: float = 0.05) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > bound:
            raise RuntimeError(f"{what}: not within {bound} s")
        await asyncio.sleep(interval)
    return time.monotonic() - started


async def run(args: argparse.Namespace, src: str | None = None) -> dict[str, Any]:
    """One storm, on the replica code under ``src`` (another revision's) or this one's."""
    total = args.sdk + args.hypha
    env = {"PYTHONPATH": src} if src else {}
    log_dir = Path(tempfile.mkdtemp(prefix="storm-"))
    holds_out = log_dir / "holds"
    if args.holds:  # bench/_holds/sitecustomize.py in both replicas
        env["PYTHONPATH"] = ":".join(p for p in (src, str(BENCH / "_holds")) if p)
        env["STORM_HOLDS_OUT"] = str(holds_out)
    limits = ["--max-connections-per-workspace", str(total + 100), "--max-connections-per-user", str(total + 100)]
    common = ["--transit-grace", str(args.grace), "--drain-timeout", str(args.drain_timeout), *limits]
    common += args.replica_arg
    workspace = user_workspace(USER)
    token = admin_token(USER)
    children: list[Child] = []
    with ValkeyServer() as valkey:
        a = ReplicaProcess(replica_id="ra", redis_url=valkey.url, env=env, args=common).start()
        b = ReplicaProcess(replica_id="rb", redis_url=valkey.url, env=env, args=common).start()
        balancer = await Balancer([a.port, b.port]).start()
        balancer.take_out(b.port)  # the hypha-rpc clients start on A
        extra: list[Any] = []
        echo_child: Child | None = None
        try:
            sdk_ids = [f"sdk{i}" for i in range(args.sdk)]
            hypha_ids = [f"hy{i}" for i in range(args.hypha)]
            jobs: list[tuple[str, list[str], list[str]]] = []
            for w in range(args.workers):
                part = sdk_ids[w :: args.workers]
                if part:
                    jobs.append(("sdk", [a.url, b.url], part))
            per = max(1, -(-args.hypha // max(1, args.workers)))
            for w in range(0, args.hypha, per):
                jobs.append(("hypha", [balancer.url], hypha_ids[w : w + per]))
            print(f"connecting {args.sdk} SDK and {args.hypha} hypha-rpc clients to A", flush=True)
            t = time.monotonic()
            for i, (kind, _, _) in enumerate(jobs):
                children.append(await Child(f"storm-{kind}-{i}", [CLIENTS, kind], log_dir).start())

            async def open_(child: Child, urls: list[str], ids: list[str]) -> dict[str, Any]:
                spec = {"urls": urls, "ids": ids, "workspace": workspace, "token": token, "concurrency": 16}
                return await child.request({"open": spec}, GIVE_UP)

            opened = await asyncio.gather(*(open_(c, u, ids) for c, (_, u, ids) in zip(children, jobs, strict=True)))
            errors = {k: v for o in opened for k, v in o["errors"].items()}
            if errors:
                raise RuntimeError(f"clients failed to connect: {errors}")
            print(f"  connected in {time.monotonic() - t:.1f} s", flush=True)
            moved = {f"{workspace}/{cid}" for cid in sdk_ids + hypha_ids}

            def owned_by(replica: str) -> int:
                with valkey.client() as r:
                    return sum(
                        1 for k, v in r.hgetall("sb:owner").items() if k.decode() in moved and v == replica.encode()
                    )

            await until(lambda: owned_by("ra") + owned_by("rb") == total, "every client registered", 60, 0.2)
            with valkey.client() as r:  # a client whose first connect to A timed out took B: it does not move
                moved = {k.decode() for k, v in r.hgetall("sb:owner").items() if k.decode() in moved and v == b"ra"}
            total = len(moved)
            echo_child = await Child("storm-echo", [CLIENTS, "echo"], log_dir).start()
            echo = Echo(echo_child)
            await echo.start(b.url, workspace, token)
            caller = await connect([b.url], client_id="b-watcher", workspace=workspace, token=token, method_timeout=30)
            extra.append(caller)
            gone: list[Any] = []
            caller.on("client_disconnected", gone.append)
            await caller.subscribe(["client_disconnected"])
            mover_client = await connect([b.url], client_id="b-mover", workspace=workspace, token=token)
            extra.append(mover_client)
            sample = sorted(moved)[:: max(1, total // 200)]
            mover = Mover(mover_client, sample)
            owners = Owners(valkey, moved, "rb").start()
            loops = [asyncio.ensure_future(mover.run())]
            await asyncio.sleep(3)  # echo's baseline, with every client idle on A
            assert a.proc is not None
            assert b.proc is not None
            b_cpu0 = cpu(b.proc.pid)
            exits: list[float] = []
            t0 = time.monotonic()
            load_at_sigterm = list(psutil.getloadavg())
            print(f"SIGTERM to A with {total} clients (load {load_at_sigterm[0]:.1f})", flush=True)
            a.proc.send_signal(signal.SIGTERM)
            a_exit = asyncio.ensure_future(asyncio.to_thread(a.proc.wait, GIVE_UP + args.drain_timeout))
            a_exit.add_done_callback(lambda _: exits.append(time.monotonic() - t0))
            if args.profile:
                spy = await asyncio.create_subprocess_exec(
                    args.profile,
                    "record",
                    "-p",
                    str(b.proc.pid),
                    "-d",
                    "25",
                    "-r",
                    "50",
                    "-f",
                    "raw",
                    "-o",
                    str(log_dir / "b.spy"),
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                )
            balancer.take_out(a.port)
            balancer.put_back(b.port)
            try:
                bound = BACK_BOUND + args.drain_timeout
                back_s: float | None = await until(owners.all_back, "every client back on B", bound)
            except RuntimeError:
                back_s = None  # reported as such, with how many were back
            b_cpu = cpu(b.proc.pid) - b_cpu0
            t_back = time.monotonic()
            code = await asyncio.wait_for(a_exit, GIVE_UP + args.drain_timeout)
            if args.profile:
                await asyncio.wait_for(spy.wait(), 60)
            await asyncio.sleep(1)
            mover.running = False
            await echo.stop()
            await asyncio.wait(loops, timeout=35)
            # listed and callable, from B
            listed_ids: set[str] = set()
            for _ in range(5):  # bounded: a sibling still catching up may time out a listing
                try:
                    listed = await caller.list_services({"workspace": workspace})
                except Exception as exc:
                    print(f"  listing failed: {str(exc).splitlines()[-1][:200]}", flush=True)
                    await asyncio.sleep(2)
                    continue
                listed_ids = {s["id"].rpartition(":")[0] for s in listed if s["id"].endswith(":s")}
                break
            t = time.monotonic()
            gate = asyncio.Semaphore(32)
            not_callable: list[str] = []
            not_callable_why: collections.Counter[str] = collections.Counter()
            rate_limited = [0]  # the sweep's calls the hub's per-client rate limit turned away (then retried)

            async def call(target: str) -> None:
                async with gate:
                    for attempt in range(SWEEP_ATTEMPTS):  # bounded; only the caller's own rate limit is retried
                        try:
                            svc = await caller.get_service(f"{target}:s")
                            assert await asyncio.wait_for(svc.echo(7), 30) == 7
                            return
                        except Exception as exc:
                            why = str(exc).strip().splitlines() or [type(exc).__name__]
                            if "Rate limit exceeded" in why[-1] and attempt + 1 < SWEEP_ATTEMPTS:
                                rate_limited[0] += 1
                                await asyncio.sleep(1.0)  # the sweep outran the hub's per-client rate limit
                                continue
                            not_callable.append(target)
                            not_callable_why[f"{type(exc).__name__}: {why[-1][:160]}"] += 1
                            return

            await asyncio.gather(*(call(target) for target in sorted(moved)))
            sweep = time.monotonic() - t
            sdk_events: dict[str, list[list[Any]]] = {}
            for child, (kind, _, _) in zip(children, jobs, strict=True):
                if kind == "sdk":
                    sdk_events.update((await child.request({"report": True}, 60))["events"])
            (log_dir / "sdk_events.json").write_text(json.dumps({"t0": t0, "events": sdk_events}))
            attempts = sorted(sum(1 for e in ev if e[0] == "reconnecting" and e[2] >= t0) for ev in sdk_events.values())
            sdk_transit = sorted(_sdk_transit(events, t0) for events in sdk_events.values())
            owners.stop()
            transit = sorted(owners.back[k] - owners.left[k] for k in moved if k in owners.left and k in owners.back)
            arrivals = sorted([t0, *owners.back.values()])
            gap = max((y - x for x, y in zip(arrivals, arrivals[1:], strict=False)), default=0.0)
            handed = sorted(owners.left.get(k, t0) - t0 for k in moved)
            result = {
                "sdk_clients": args.sdk,
                "moved": total,
                "hypha_clients": args.hypha,
                "transit_grace_s": args.grace,
                "drain_timeout_s": args.drain_timeout,
                "load_at_sigterm": load_at_sigterm,
                "seconds_until_all_back": back_s,
                "back_on_b": len(owners.back),
                "hand_over_spread_s": handed[-1] if handed else None,
                "transit_s": {
                    "p50": pct(transit, 50),
                    "p99": pct(transit, 99),
                    "max": transit[-1] if transit else None,
                    "over_grace": sum(1 for x in transit if x > args.grace),
                    "measured": len(transit),
                },
                "sdk_own_transit_s": {"p50": pct(sdk_transit, 50), "max": sdk_transit[-1] if sdk_transit else None},
                "sdk_attempts": {"p50": pct(attempts, 50), "max": attempts[-1] if attempts else None},
                "longest_admission_gap_s": gap,
                "b_cpu_s": b_cpu,
                "b_cpu_ms_per_client": b_cpu / total * 1e3,
                "listed": len(listed_ids & moved),
                "not_callable": len(not_callable),
                "not_callable_why": dict(not_callable_why.most_common(5)),
                "sweep_rate_limited": rate_limited[0],
                "callable_sweep_s": sweep,
                "client_disconnected_seen": len(gone),
                "calls_to_moving_clients": mover.calls,
                "calls_lost": mover.lost,
                "b_echo_before": echo.between(t0 - 3, t0),
                "b_echo_during": echo.between(t0, t_back),
                "b_holds_during": holds(holds_out.with_suffix(".rb"), t0, t_back) if args.holds else None,
                "a_exit_code": code,
                "a_exit_s": exits[0] if exits else None,
            }
            print(json.dumps(result, indent=2), flush=True)
            return result
        finally:
            for c in extra:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(c.disconnect(), 2)
            for child in [*children, *([echo_child] if echo_child else [])]:
                await child.stop()
            await balancer.stop()
            a.kill()
            b.kill()
            for replica in (a, b):
                (log_dir / f"{replica.replica_id}.log").write_text(replica.log_tail(limit=1 << 30))
            print(f"logs in {log_dir}", flush=True)


def once(coro: Any) -> dict[str, Any]:
    """Run one storm in a loop of its own, left as it is: a client task that swallows its cancel
    (a reconnecting SDK client in the bench's process) must not hold up the next run."""
    loop = asyncio.new_event_loop()
    result: dict[str, Any] = loop.run_until_complete(coro)
    return result


RATIOS = ("seconds_until_all_back", "b_cpu_s", "longest_admission_gap_s")


def against(args: argparse.Namespace, src: str) -> dict[str, Any]:
    """``--rounds`` pairs of storms, this revision's and ``src``'s, in turns (against first in
    the first pair, this first in the second, ...): each pair's ratios, and their medians."""
    rounds = []
    for r in range(args.rounds):
        pair: dict[str, Any] = {}
        for side in ("against", "this") if r % 2 == 0 else ("this", "against"):
            print(f"round {r + 1} of {args.rounds}, {side}:", flush=True)
            pair[side] = once(run(args, src if side == "against" else None))
        this, base = pair["this"], pair["against"]
        pair["ratios"] = {k: (this[k] / base[k] if this[k] is not None and base[k] else None) for k in RATIOS}
        rounds.append(pair)
    medians = {}
    for k in RATIOS:
        values = [p["ratios"][k] for p in rounds if p["ratios"][k] is not None]
        medians[k] = statistics.median(values) if values else None
    return {"rounds": rounds, "ratios_this_to_against": medians}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sdk", type=int, default=1000, help="SDK clients on A")
    parser.add_argument("--hypha", type=int, default=0, help="unmodified hypha-rpc clients on A (through the balancer)")
    parser.add_argument("--grace", type=float, default=5.0, help="--transit-grace of the replicas")
    parser.add_argument(
        "--drain-timeout", type=float, default=10.0, help="--drain-timeout of the replicas (the hand-over's budget)"
    )
    parser.add_argument(
        "--workers", type=int, default=4, help="child processes for the SDK clients (and the hypha ones)"
    )
    parser.add_argument("--replica-arg", action="append", default=[], help="one more argument for both replicas")
    parser.add_argument("--profile", metavar="PY_SPY", help="record B with this py-spy for 25 s from the SIGTERM")
    parser.add_argument(
        "--holds", action="store_true", help="record what holds B's loop (bench/_holds) and summarize it"
    )
    parser.add_argument("--against", metavar="SRC", help="run the storm on this src/ (another revision's) too")
    parser.add_argument(
        "--rounds", type=int, default=1, help="with --against: pairs of storms, the two revisions in turns (default 1)"
    )
    parser.add_argument(
        "--client-cpus",
        metavar="LIST",
        help="run the moving clients' processes on these cores only (e.g. 0): the rest for the hub's side",
    )
    args = parser.parse_args()
    if args.client_cpus:
        os.environ["STORM_CLIENT_CPUS"] = args.client_cpus  # read by _storm_clients.py
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("switchboard.client").setLevel(logging.CRITICAL)  # the bench's own callers, during the move
    raise_fd_limit(4 * (args.sdk + args.hypha) + 1000)
    results: dict[str, Any] = {}
    if args.against:
        results = against(args, str(Path(args.against).resolve()))
    else:
        results["this"] = once(run(args))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results.get("ratios_this_to_against", {}), indent=2))


if __name__ == "__main__":
    main()

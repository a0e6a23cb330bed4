#!/usr/bin/env python
"""One Valkey against a 3-master Valkey Cluster, in the same run, links off.

    python bench/redis_cluster.py [--quick] [--trials N] [--faults-only] [--victim channel|store]

Two real replica processes (``--no-links``: every cross-replica message crosses
Redis) on a single Valkey, then on a 3-master + 3-replica Valkey Cluster, driven
by unmodified hypha-rpc clients on loopback:

1. RPC-heavy: callers on replica B, providers on replica A, 16 calls in flight
   for a fixed time: calls/s, p50/p99 latency;
2. broadcast-heavy: in 4 workspaces an emitter on A emits events ``to: "*"``
   as fast as it can, subscribers on A and B: events delivered/s, p50/p99 from
   emit to delivery;
3. (cluster only) a master SIGKILLed, N trials: seconds from the kill, and from
   the promotion of its replica, to the first cross-replica call that works again
   (the master of the provider's channel, or with ``--victim store`` that of the
   registry's ``{sb}`` slot: presence, lease, registry, re-assertion);
4. (cluster only) a slot moved, N trials: seconds from the move to the first call
   through the moved channel that works.

Every speed is also given as cluster / single in the same run (the machine is
shared and noisy). ``--faults-only`` runs 3 and 4 alone. Raw figures go to
bench/results/redis_cluster.json (``redis_cluster_faults_<victim>.json`` for ``--faults-only``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from hypha_rpc import connect_to_server
from redis.crc import key_slot

from switchboard.testing import ValkeyServer
from switchboard.testing.replica import ReplicaProcess
from switchboard.testing.valkey_cluster import ValkeyCluster

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import pct  # noqa: E402  (the one percentile of bench/)

RESULTS = Path(__file__).resolve().parent / "results"


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Hub:
    """Two replicas (links off) on one Redis URL, and the hypha-rpc clients made on them."""

    def __init__(self, url: str) -> None:
        self.a = ReplicaProcess(replica_id="ra", redis_url=url, args=["--no-links", "--log-level", "WARNING"])
        self.b = ReplicaProcess(replica_id="rb", redis_url=url, args=["--no-links", "--log-level", "WARNING"])
        self.clients: list[Any] = []

    def start(self) -> Hub:
        self.a.start()
        self.b.start()
        return self

    async def connect(self, replica: ReplicaProcess, **config: Any) -> Any:
        client = await connect_to_server({"server_url": replica.url, "method_timeout": 30, **config})
        self.clients.append(client)
        return client

    async def stop(self) -> None:
        for client in reversed(self.clients):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.disconnect(), 3)
        self.a.kill()
        self.b.kill()


async def rpc_heavy(hub: Hub, seconds: float, providers: int = 4, in_flight: int = 16) -> dict[str, Any]:
    first = await hub.connect(hub.a, client_id="p0")
    token = await first.generate_token()
    provs = [first] + [await hub.connect(hub.a, client_id=f"p{n}", token=token) for n in range(1, providers)]
    for prov in provs:
        await prov.register_service({"id": "echo", "echo": lambda x: x})
    caller = await hub.connect(hub.b, client_id="caller", token=token)
    svcs = [await caller.get_service(f"p{n}:echo") for n in range(providers)]
    for svc in svcs:
        await svc.echo(b"warm")
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds

    async def loop(n: int) -> None:
        nonlocal errors
        svc = svcs[n % len(svcs)]
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            try:
                await svc.echo(b"x" * 32)
                latencies.append(time.perf_counter() - t0)
            except Exception:
                errors += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(loop(n) for n in range(in_flight)))
    took = time.perf_counter() - t0
    return {
        "calls_per_s": len(latencies) / took,
        "p50_ms": (pct(latencies, 50) or 0) * 1000,
        "p99_ms": (pct(latencies, 99) or 0) * 1000,
        "errors": errors,
    }


async def broadcast_heavy(hub: Hub, seconds: float, workspaces: int = 4, window: int = 64) -> dict[str, Any]:
    """Each emitter keeps at most ``window`` events undelivered (a closed loop: the rate the hub
    sustains, not a backlog growing without bound)."""
    delays: list[float] = []
    received = [0] * workspaces
    progress = [asyncio.Event() for _ in range(workspaces)]
    emitters = []

    def on_tick(n: int, data: dict[str, Any]) -> None:
        delays.append(time.perf_counter() - data["data"]["t"])
        received[n] += 1
        progress[n].set()

    for n in range(workspaces):
        emitter = await hub.connect(hub.a, client_id=f"em{n}")
        token = await emitter.generate_token()
        for where, replica in (("a", hub.a), ("b", hub.b)):
            sub = await hub.connect(replica, client_id=f"sub{n}{where}", token=token)
            sub.on("tick", lambda data, n=n: on_tick(n, data))
            await sub.subscribe(["tick"])
        emitters.append(emitter)
    sent = [0] * workspaces
    deadline = time.perf_counter() + seconds

    async def emit(n: int, emitter: Any) -> None:
        while time.perf_counter() < deadline:
            while 2 * sent[n] - received[n] > window and time.perf_counter() < deadline:
                progress[n].clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(progress[n].wait(), 1)
            await emitter.emit({"type": "tick", "to": "*", "data": {"t": time.perf_counter()}})
            sent[n] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(emit(n, e) for n, e in enumerate(emitters)))
    took = time.perf_counter() - t0
    expected = 2 * sum(sent)
    for _ in range(100):  # up to 5 s for the last events to land
        if len(delays) >= expected:
            break
        await asyncio.sleep(0.05)
    return {
        "events_per_s": len(delays) / took,
        "p50_ms": (pct(delays, 50) or 0) * 1000,
        "p99_ms": (pct(delays, 99) or 0) * 1000,
        "delivered": len(delays),
        "expected": expected,
    }


class Calls:
    """A call from B to the provider on A every 20 ms, with the time of each success."""

    def __init__(self, svc: Any) -> None:
        self.svc = svc
        self.ok: list[float] = []
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        for _ in range(100_000):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.svc.echo(1), 5)
                self.ok.append(time.perf_counter())
            await asyncio.sleep(0.02)

    async def first_ok_after(self, t: float, bound: float = 30) -> float | None:
        deadline = time.perf_counter() + bound
        while time.perf_counter() < deadline:
            after = next((s for s in self.ok if s > t), None)
            if after is not None:
                return after
            await asyncio.sleep(0.01)
        return None

    def longest_gap(self, start: float, end: float) -> float:
        times = [t for t in self.ok if start <= t <= end]
        return max((b - a for a, b in zip(times, times[1:], strict=False)), default=0.0)

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


def standby_of(cluster: ValkeyCluster, slot: int) -> int | None:
    """The port of the replica of ``slot``'s master, if the cluster lists one."""
    with cluster.client() as node:
        for row in node.execute_command("CLUSTER", "SLOTS"):
            if int(row[0]) <= slot <= int(row[1]) and len(row) > 3:
                return int(row[3][1])
    return None


def is_master(cluster: ValkeyCluster, port: int) -> bool:
    with contextlib.suppress(Exception), cluster.client(port) as node:
        return bool(node.execute_command("ROLE")[0] in (b"master", "master"))
    return False


async def cluster_faults(hub: Hub, cluster: ValkeyCluster, trials: int, victim_of: str = "channel") -> dict[str, Any]:
    prov = await hub.connect(hub.a, client_id="fprov")
    await prov.register_service({"id": "echo", "echo": lambda x: x})
    ws, token = prov.config["workspace"], await prov.generate_token()
    caller = await hub.connect(hub.b, client_id="fcaller", token=token)
    calls = Calls(await caller.get_service("fprov:echo"))
    channel = f"sb:client:{ws}/fprov".encode()
    out: dict[str, Any] = {
        "failover_from_kill_s": [],
        "failover_from_promotion_s": [],
        "longest_gap_s": [],  # between successful calls around the kill: did they stop at all?
        "slot_move_s": [],
    }
    try:
        for trial in range(trials):
            await calls.first_ok_after(time.perf_counter() - 1)
            slot = key_slot(channel if victim_of == "channel" else b"sb")
            victim = cluster.master_of(slot)
            standby = None
            for _ in range(200):  # up to 10 s for the victim's replica to be listed (a fresh or revived node)
                if (standby := standby_of(cluster, slot)) is not None:
                    break
                await asyncio.sleep(0.05)
            shared = cluster.master_of(key_slot(channel)) == victim  # the provider's channel dies with it
            out.setdefault("channel_on_victim", []).append(shared)
            killed = time.perf_counter()
            cluster.kill_master(victim)
            promoted = None  # the moment the standby itself answers ROLE master (before gossip tells the rest)
            for _ in range(3000):  # up to 30 s for the promotion and the new slot map
                if promoted is None and standby is not None and is_master(cluster, standby):
                    promoted = time.perf_counter()
                owners = cluster.slot_owners()
                if promoted is not None and victim not in owners and sum(owners.values()) == 16384:
                    break
                await asyncio.sleep(0.01)
            promoted = promoted or time.perf_counter()  # no standby seen promoted: the new slot map's moment
            ok = await calls.first_ok_after(promoted)
            if ok is not None:
                out["failover_from_kill_s"].append(ok - killed)
                out["failover_from_promotion_s"].append(ok - promoted)
                out["longest_gap_s"].append(calls.longest_gap(killed - 1, ok))
            back = f"{ok - killed:.2f}s ({ok - promoted:.3f}s after the promotion)" if ok else "never"
            gap = f", longest gap between calls {out['longest_gap_s'][-1]:.2f}s" if ok else ""
            on = " (the channel's master too)" if shared and victim_of == "store" else ""
            say(f"  failover {trial}{on}: promotion {promoted - killed:.2f}s after the kill, calls back {back}{gap}")
            await asyncio.to_thread(cluster.revive, victim)
            await asyncio.to_thread(cluster.wait_ok)
        for trial in range(trials):
            await calls.first_ok_after(time.perf_counter() - 1)
            slot = key_slot(channel)
            target = next(p for p in cluster.masters_ports() if p != cluster.master_of(slot))
            await asyncio.to_thread(cluster.move_slot, slot, target)
            moved = time.perf_counter()
            ok = await calls.first_ok_after(moved)
            if ok is not None:
                out["slot_move_s"].append(ok - moved)
            say(f"  slot move {trial}: calls back {f'{ok - moved:.3f}s' if ok else 'never'}")
    finally:
        await calls.stop()
    return out


async def measure(url: str, seconds: float) -> dict[str, Any]:
    hub = Hub(url).start()
    try:
        return {"rpc": await rpc_heavy(hub, seconds), "broadcast": await broadcast_heavy(hub, seconds)}
    finally:
        await hub.stop()


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def median_of(rounds: list[dict[str, Any]], workload: str, key: str) -> float:
    return float(statistics.median(r[workload][key] for r in rounds))


def summarise(f: dict[str, Any]) -> dict[str, Any]:
    for key in ("failover_from_kill_s", "failover_from_promotion_s", "longest_gap_s", "slot_move_s"):
        values = f[key]
        f[key[:-2] + "_summary"] = {
            "n": len(values),
            "min": min(values) if values else None,
            "median": statistics.median(values) if values else None,
            "max": max(values) if values else None,
        }
    return f


async def faults_only(trials: int, victim: str) -> None:
    with ValkeyCluster() as cluster:
        hub = Hub(cluster.url).start()
        try:
            f = summarise(await cluster_faults(hub, cluster, trials, victim))
        finally:
            await hub.stop()
    f.update(victim=victim, trials=trials, node_timeout_ms=cluster.node_timeout_ms)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"redis_cluster_faults_{victim}.json").write_text(json.dumps(f, indent=2))
    print(json.dumps({k: v for k, v in f.items() if not isinstance(v, list)}, indent=2))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 s per workload, 1 round, 2 fault trials")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per backend, interleaved (default 3)")
    parser.add_argument("--trials", type=int, default=None, help="fault trials (default 5)")
    parser.add_argument("--faults-only", action="store_true", help="only the cluster faults (no throughput rounds)")
    parser.add_argument(
        "--victim",
        choices=("channel", "store"),
        default="channel",
        help="the master SIGKILLed: the provider channel's, or the registry's {sb} slot's",
    )
    args = parser.parse_args()
    if args.faults_only:
        await faults_only(args.trials or 8, args.victim)
        return
    seconds = 3.0 if args.quick else 6.0
    rounds = args.rounds or (1 if args.quick else 3)
    trials = args.trials or (2 if args.quick else 5)
    results: dict[str, Any] = {"seconds": seconds, "rounds": rounds, "trials": trials}
    runs: dict[str, list[dict[str, Any]]] = {"single": [], "cluster": []}
    with ValkeyServer() as single, ValkeyCluster() as cluster:
        urls = {"single": single.url, "cluster": cluster.url}
        for n in range(rounds):  # interleaved, the order alternating: drift of the shared machine hits both
            for mode in ("single", "cluster") if n % 2 == 0 else ("cluster", "single"):
                say(f"round {n}: {mode} ...")
                runs[mode].append(await measure(urls[mode], seconds))
        say("cluster faults ...")
        hub = Hub(cluster.url).start()
        try:
            results["faults"] = await cluster_faults(hub, cluster, trials, args.victim)
        finally:
            await hub.stop()
    results["runs"] = runs
    figures = {
        mode: {
            workload: {key: median_of(runs[mode], workload, key) for key in keys}
            for workload, keys in (
                ("rpc", ("calls_per_s", "p50_ms", "p99_ms")),
                ("broadcast", ("events_per_s", "p50_ms", "p99_ms")),
            )
        }
        for mode in runs
    }
    results["median"] = figures
    s, c = figures["single"], figures["cluster"]
    results["ratios"] = {
        "rpc_calls_per_s": ratio(c["rpc"]["calls_per_s"], s["rpc"]["calls_per_s"]),
        "rpc_p50": ratio(c["rpc"]["p50_ms"], s["rpc"]["p50_ms"]),
        "rpc_p99": ratio(c["rpc"]["p99_ms"], s["rpc"]["p99_ms"]),
        "broadcast_events_per_s": ratio(c["broadcast"]["events_per_s"], s["broadcast"]["events_per_s"]),
        "broadcast_p50": ratio(c["broadcast"]["p50_ms"], s["broadcast"]["p50_ms"]),
        "broadcast_p99": ratio(c["broadcast"]["p99_ms"], s["broadcast"]["p99_ms"]),
    }
    f = summarise(results["faults"])
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "redis_cluster.json").write_text(json.dumps(results, indent=2))
    print(json.dumps({k: results[k] for k in ("median", "ratios")}, indent=2))
    print(json.dumps({k: v for k, v in f.items() if k.endswith("summary")}, indent=2))


if __name__ == "__main__":
    asyncio.run(main())

"""A crowd on one replica: CPU per connect as the replica fills, and the time until a crowd that
left all at once is gone from Redis (read, not assumed).

    .venv/bin/python bench/crowd.py [--clients 2000] [--step 500] [--latency 0] [--pool N] [--grace 0]
                                    [--against OTHER_REVISION/src]

One real replica on a real Valkey (optionally behind the fault proxy, ``--latency`` seconds each
way), raw WebSocket clients that do the hypha handshake and announce their ``built-in`` service
(what every hypha-rpc client does on connect), all in one workspace.

1. **Baseline departure**: ``--step`` clients connect, then all leave at once (half a TCP abort,
   half a close frame); the seconds until Redis holds nothing of them (registrations, owner and
   holder entries, transit marks, connection counts) are the baseline of step 3.
2. **Connects**: ``--clients`` connect in steps of ``--step``; for each step, the replica's CPU per
   connect and its ratio to the first step's (cost that grows with the clients already there
   shows as a ratio above 1), handshakes per second, and the replica's RSS per client.
3. **Mass departure**: they all leave at once. Reported: seconds until Redis is clean, per 1,000
   clients and as a ratio to the baseline's (above 1: a big crowd costs more per client than a
   small one), the replica's CPU, its "No connection available" and other warnings, and the
   largest gap between two writes of its presence record meanwhile and whether it kept the lease.

``--grace`` is ``--transit-grace`` (default 0: a dropped client is gone at once; with a grace, the
dropped half is announced gone when it ends, and that is in the time too). ``--pool`` is
``--redis-max-connections``. Writes ``bench/results/crowd.json``. Loopback only; every phase is
bounded in time (:data:`GIVE_UP`).

History: 10,000 clients leaving once took 18-24 s and 9,900 "No connection available" warnings; the
subscriber index, one UNSUBSCRIBE per loop turn and a tuned garbage collector
(``server/process/collector.py``) brought it to 2.6 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from redis.exceptions import RedisError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import raise_fd_limit  # noqa: E402

from switchboard.hub.identity.users import user_workspace
from switchboard.testing import ThreadedFaultProxy, ValkeyServer  # noqa: E402
from switchboard.testing.crowd import RawClient, admin_token, open_raw  # noqa: E402
from switchboard.testing.replica import ReplicaProcess  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "crowd.json"
CONNECTING = 50  # handshakes at a time
GIVE_UP = 180.0  # seconds: the longest any phase may take
REPLICA = "crowd"
USER = "crowd-user"


def redis_holds(server: ValkeyServer, workspace: str) -> dict[str, int]:
    """What Redis still holds of the crowd (every client of the bench is the crowd's)."""
    with server.client() as r:
        left = {
            "registrations": r.hlen(f"sb:svc:{workspace}"),
            "owners": r.hlen("sb:owner"),
            "holders": r.hlen("sb:holder"),
            "owned": r.scard(f"sb:replica:{REPLICA}:clients"),
            "in transit": r.zcard("sb:transit") + r.hlen("sb:transit:left"),
            "user count": int(r.hget(f"sb:conns:u:{USER}", REPLICA) or 0),
            "workspace count": int(r.hget(f"sb:conns:w:{workspace}", REPLICA) or 0),
        }
    return {k: v for k, v in left.items() if v}


def liveness(server: ValkeyServer) -> tuple[float | None, str | None]:
    """When the replica last wrote its presence record, and who holds the leader lease."""
    with server.client() as r:
        seen, holder = r.hget(f"sb:presence:{REPLICA}", "seen"), r.get("sb:leader")
    return (float(seen) if seen else None), (holder.decode().partition("#")[0] if holder else None)


async def until(check: Any, what: str) -> float:
    """Seconds until ``check()`` (blocking, run in a thread) is true; bounded by :data:`GIVE_UP`.
    A check Redis did not answer (it is busy: that is what is measured) counts as not yet."""
    started = time.monotonic()
    while True:
        try:
            if await asyncio.to_thread(check):
                return time.monotonic() - started
        except RedisError as exc:
            print(f"  ({what}: Redis did not answer the bench: {exc})", flush=True)
        if time.monotonic() - started > GIVE_UP:
            raise RuntimeError(f"{what}: not within {GIVE_UP} s")
        await asyncio.sleep(0.02)


def cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


class Crowd:
    def __init__(self, valkey: ValkeyServer, replica: ReplicaProcess) -> None:
        self.valkey = valkey
        self.replica = replica
        self.process = psutil.Process(replica.proc.pid)  # type: ignore[union-attr]
        self.workspace = user_workspace(USER)
        self.token = admin_token(USER)
        self.gate = asyncio.Semaphore(CONNECTING)

    async def connect(self, ids: list[str], already: int) -> list[RawClient]:
        async def one(cid: str) -> RawClient:
            async with self.gate:
                return await open_raw(self.replica.url, cid, self.token, timeout=60)

        clients = list(await asyncio.wait_for(asyncio.gather(*(one(cid) for cid in ids)), GIVE_UP))
        wanted = already + len(ids)
        await until(lambda: redis_holds(self.valkey, self.workspace).get("registrations", 0) >= wanted, "registered")
        return clients

    async def depart(self, clients: list[RawClient]) -> dict[str, Any]:
        """All of ``clients`` leave at once; until Redis holds nothing of them."""
        log_before = len(self.replica.log_tail(limit=1_000_000_000))
        cpu0, started = cpu(self.process), time.monotonic()
        for i, client in enumerate(clients):
            client.leave(goodbye=i % 2 == 0)
        seen: list[float] = []
        holders: set[str | None] = set()

        def clean() -> bool:
            at, holder = liveness(self.valkey)
            holders.add(holder)
            if at is not None and (not seen or seen[-1] != at):
                seen.append(at)
            return not redis_holds(self.valkey, self.workspace)

        await until(clean, "Redis back to baseline")
        took = time.monotonic() - started
        used = cpu(self.process) - cpu0
        log = self.replica.log_tail(limit=1_000_000_000)[log_before:]
        gaps = [b - a for a, b in zip(seen, seen[1:], strict=False)]
        return {
            "clients": len(clients),
            "seconds_until_redis_clean": took,
            "seconds_per_1000_clients": took / len(clients) * 1000,
            "replica_cpu_s": used,
            "no_connection_available": log.count("No connection available"),
            "warnings": log.count(" WARNING "),
            "presence_writes_seen": len(seen),
            "largest_presence_gap_s": max(gaps, default=None),
            "lease_holders_seen": sorted(h or "-" for h in holders),
        }


async def run(args: argparse.Namespace, src: str | None = None) -> dict[str, Any]:
    """One measurement, of the replica code under ``src`` (another revision's ``src``) or of this one."""
    with ValkeyServer() as valkey:
        proxy = ThreadedFaultProxy("127.0.0.1", valkey.port).start() if args.latency else None
        pool = [] if args.pool is None else ["--redis-max-connections", str(args.pool)]  # older: no such flag
        replica = ReplicaProcess(
            replica_id=REPLICA,
            redis_url=proxy.url_for_redis() if proxy else valkey.url,
            env={"PYTHONPATH": src} if src else None,
            args=[
                "--transit-grace",
                str(args.grace),
                *pool,
                "--max-connections-per-user",
                str(args.clients + args.step + 10),
                "--max-connections-per-workspace",
                str(args.clients + args.step + 10),
                "--no-links",
            ],
        ).start()
        clients: list[RawClient] = []
        try:
            if proxy:
                proxy.delay(args.latency)
            crowd = Crowd(valkey, replica)
            print(f"baseline: {args.step} clients connect and leave", flush=True)
            clients = await crowd.connect([f"b{i}" for i in range(args.step)], 0)
            baseline = await crowd.depart(clients)
            clients = []
            rss0 = crowd.process.memory_info().rss
            steps = []
            for start in range(0, args.clients, args.step):
                ids = [f"c{i}" for i in range(start, min(start + args.step, args.clients))]
                cpu0, wall0 = cpu(crowd.process), time.monotonic()
                clients += await crowd.connect(ids, start)
                used, wall = cpu(crowd.process) - cpu0, time.monotonic() - wall0
                steps.append(
                    {
                        "already_connected": start,
                        "connected": len(ids),
                        "cpu_ms_per_connect": used / len(ids) * 1e3,
                        "handshakes_per_s": len(ids) / wall,
                    }
                )
                print(f"  {start:>6} already: {steps[-1]['cpu_ms_per_connect']:.2f} ms CPU per connect", flush=True)
            for step in steps:
                step["ratio_to_first_step"] = step["cpu_ms_per_connect"] / steps[0]["cpu_ms_per_connect"]
            rss = crowd.process.memory_info().rss
            print(f"all {len(clients)} leave at once", flush=True)
            departure = await crowd.depart(clients)
            clients = []
            departure["ratio_per_client_to_baseline"] = (
                departure["seconds_per_1000_clients"] / baseline["seconds_per_1000_clients"]
            )
            return {
                "clients": args.clients,
                "step": args.step,
                "latency_s_each_way": args.latency,
                "pool": args.pool,
                "transit_grace_s": args.grace,
                "connect": steps,
                "rss_kib_per_client": (rss - rss0) / 1024 / args.clients,
                "baseline_departure": baseline,
                "departure": departure,
            }
        finally:
            for client in clients:
                client.leave(goodbye=False)
            replica.kill()
            if proxy:
                proxy.stop()


def ratios(this: dict[str, Any], before: dict[str, Any]) -> dict[str, float | None]:
    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    now, then = this["departure"], before["departure"]
    return {
        "departure_seconds_until_redis_clean": ratio(
            now["seconds_until_redis_clean"], then["seconds_until_redis_clean"]
        ),
        "departure_replica_cpu": ratio(now["replica_cpu_s"], then["replica_cpu_s"]),
        "last_step_cpu_per_connect": ratio(
            this["connect"][-1]["cpu_ms_per_connect"], before["connect"][-1]["cpu_ms_per_connect"]
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--step", type=int, default=500, help="clients per connect step, and the baseline crowd")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds each way between replica and Valkey")
    parser.add_argument("--pool", type=int, default=None, help="--redis-max-connections of the replica")
    parser.add_argument(
        "--against",
        metavar="SRC",
        help="first measure the replica code of this directory (another revision's src/, e.g. from git archive), "
        "then this one's, and report this one's figures as ratios to it",
    )
    parser.add_argument("--grace", type=float, default=0.0, help="--transit-grace of the replica")
    args = parser.parse_args()
    if not 0 < args.step <= args.clients <= 10_000:
        sys.exit("--step and --clients: 0 < step <= clients <= 10,000")
    raise_fd_limit(2 * args.clients + 1000)
    result = asyncio.run(run(args))
    if args.against:
        print(f"against {args.against}:", flush=True)
        before = asyncio.run(run(args, str(Path(args.against).resolve())))
        result = {"this": result, "against": before, "ratios_this_to_against": ratios(result, before)}
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

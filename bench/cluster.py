#!/usr/bin/env python
"""Multi-replica benchmark: two real replicas sharing one real Valkey, driven by
unmodified ``hypha_rpc.connect_to_server`` clients, all on loopback.

    python bench/cluster.py [--quick]

Measures (see the printed report; raw figures go to bench/results/cluster.json):

1. sequential echo latency p50/p99, caller and provider on replica A (same)
   versus caller on B, provider on A (cross), in interleaved blocks;
2. throughput of 32 concurrent callers for a fixed time, same versus cross,
   with the CPU each process spent per call;
3. cross-replica (and same-replica) latency with 10, 1,000 and 5,000 idle
   clients connected to each replica, and the replicas' RSS at each level;
4. time for calls to work again after ``CLIENT KILL TYPE pubsub`` on Valkey;
5. time for calls (and a fresh ``get_service``) to work again after Valkey
   restarts empty; 4 and 5 are repeated with the idle clients connected.

The machine is shared and noisy: every speed is also given as a ratio against
a baseline measured in the same run (same-replica for cross-replica, the
10-client level for the idle levels), and a fixed CPU workload is timed at the
start and the end to show how much the machine itself drifted.

The service provider and the idle clients run in child processes (the workers
of bench/compare.py, bench/_workers.py), so that neither the provider's work nor
the idle connections' bookkeeping (GC over 10,000 sockets) lands in the process
that times the calls. Statistics, child processes and the latency and throughput
loops are bench/_common.py's and bench/_workloads.py's, shared with compare.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import re
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    BENCH,
    WORKERS,
    Child,
    calibrate,
    pid_cpu,
    pid_rss,
    poll_until_works,
    raise_fd_limit,
    ratio,
    say,
)
from _workloads import concurrent, seq_latency  # noqa: E402

RESULTS = BENCH / "results" / "cluster.json"
PAYLOAD = "x" * 32  # "small payload": one short string each way
SERVICE = "provider:bench"  # the echo service of bench/_workers.py's provider, client id "provider"
CALL_TIMEOUT = 10.0  # bound for any single call outside the convergence pollers
POLL_CALL_TIMEOUT = 0.5  # per-call timeout while waiting for convergence
CONVERGE_BOUND = 30.0  # give up waiting for convergence after this long
SETTLE_BOUND = 30.0  # wait at most this long for the cluster to look healthy again
LATENCY_BOUND = 300.0  # no latency series (both variants, warm-up included) runs longer than this

log = logging.getLogger("bench.cluster")


@dataclass(frozen=True)
class Params:
    latency_calls: int = 5000  # per variant, after warm-up
    latency_warmup: int = 200
    latency_block: int = 200  # same/cross alternate in blocks of this many calls
    throughput_seconds: float = 10.0
    throughput_warmup: float = 1.0
    throughput_callers: int = 32
    caller_connections: int = 4  # the callers are spread over this many clients
    idle_levels: tuple[int, ...] = (10, 1000, 5000)  # idle clients per replica
    idle_latency_calls: int = 6000
    idle_open_concurrency: int = 64  # handshakes in flight at once (both replicas together)
    kill_repeats: int = 5
    restart_repeats: int = 3
    loaded_kill_repeats: int = 3  # with the largest idle level connected
    loaded_restart_repeats: int = 2
    quiet_seconds: float = 3.0  # before each idle-level measurement (after faults, handshakes)
    settle_seconds: float = 1.0  # quiet time between fault repeats


DEFAULT = Params()
QUICK = Params(
    latency_calls=500,
    latency_warmup=100,
    latency_block=100,
    throughput_seconds=3.0,
    throughput_warmup=0.5,
    idle_latency_calls=500,
    kill_repeats=3,
    restart_repeats=2,
    loaded_kill_repeats=1,
    loaded_restart_repeats=1,
    settle_seconds=0.5,
    quiet_seconds=1.0,
)


# --------------------------------------------------------------------------- stats


def spread(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "min_s": min(values),
        "median_s": statistics.median(values),
        "max_s": max(values),
    }


# --------------------------------------------------------------------------- the cluster


def parse_metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r"^([a-z_]+)(?:\{[^}]*\})?\s+([-+0-9.eE]+|NaN)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


# Flags for every replica. The hub's per-client limits (500 frames/s, burst 2000,
# by default) would throttle a benchmark that sends thousands of calls per second
# through one provider, so they are raised; only flags this build knows are passed.
REPLICA_FLAGS = {
    "--log-level": "WARNING",
    "--max-messages-per-second": "1000000",
    "--message-burst": "1000000",
    "--max-pending-calls": "100000",
}


def replica_args() -> list[str]:
    import subprocess

    help_text = subprocess.run(
        [sys.executable, "-m", "switchboard", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).stdout
    args: list[str] = []
    for flag, value in REPLICA_FLAGS.items():
        if re.search(rf"(^|\s){re.escape(flag)}[\s,=]", help_text):
            args += [flag, value]
    return args


def source_state() -> dict[str, Any]:
    """Which code was measured: other people edit the tree while benchmarks run."""
    import subprocess

    root = BENCH.parent

    def git(*a: str) -> str:
        try:
            return subprocess.run(
                ["git", *a], cwd=root, capture_output=True, text=True, timeout=10, check=False
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    dirty = [ln for ln in git("status", "--porcelain", "--", "src").splitlines() if ln]
    return {"commit": git("rev-parse", "--short", "HEAD"), "dirty_src_files": len(dirty)}


class Cluster:
    def __init__(self, params: Params, work: Path) -> None:
        from switchboard.testing import ValkeyServer

        self.p = params
        self.work = work
        self.valkey = ValkeyServer()
        self.replicas: dict[str, Any] = {}
        self.provider = Child("provider", [], work)
        self.idle = Child("idle", [WORKERS, "idle"], work)
        self.clients: list[Any] = []
        self.workspace = ""
        self.token = ""
        self.http = httpx.AsyncClient(timeout=5.0)
        self.replica_args: list[str] = []

    # -- lifecycle

    async def start(self) -> None:
        from switchboard.testing.replica import ReplicaProcess

        await asyncio.to_thread(self.valkey.start)
        self.replica_args = await asyncio.to_thread(replica_args)
        for rid in ("ra", "rb"):
            self.replicas[rid] = ReplicaProcess(replica_id=rid, redis_url=self.valkey.url, args=self.replica_args)
        await asyncio.gather(*(asyncio.to_thread(r.start) for r in self.replicas.values()))
        self.provider.argv = [WORKERS, "provider", self.a.url, "provider"]
        await self.provider.start()
        hello = await self.provider.request(None, 60)
        self.workspace, self.token = hello["workspace"], hello["token"]
        await self.idle.start()

    @property
    def a(self) -> Any:
        return self.replicas["ra"]

    @property
    def b(self) -> Any:
        return self.replicas["rb"]

    async def connect(self, replica: Any, name: str) -> Any:
        from hypha_rpc import connect_to_server

        client = await asyncio.wait_for(
            connect_to_server(
                {
                    "server_url": replica.url,
                    "client_id": f"{name}-{uuid.uuid4().hex[:6]}",
                    "token": self.token,
                    "method_timeout": CALL_TIMEOUT,
                }
            ),
            30,
        )
        self.clients.append(client)
        return client

    async def echo_service(self, client: Any) -> Any:
        return await asyncio.wait_for(client.get_service(f"{self.workspace}/{SERVICE}"), CALL_TIMEOUT)

    async def close(self) -> None:
        for client in reversed(self.clients):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.disconnect(), 3)
        await self.provider.stop()
        for r in self.replicas.values():
            with contextlib.suppress(Exception):
                r.kill()  # before the idle worker goes: 10,000 detaches would take a while
        await self.idle.stop()
        with contextlib.suppress(Exception):
            self.valkey.stop()
        await self.http.aclose()

    # -- observation

    def pids(self) -> dict[str, int]:
        out = {rid: r.proc.pid for rid, r in self.replicas.items() if r.proc is not None}
        if self.valkey.pid:
            out["valkey"] = self.valkey.pid
        if self.provider.pid:
            out["provider"] = self.provider.pid
        if self.idle.pid:
            out["idle_clients"] = self.idle.pid
        out["bench"] = os.getpid()
        return out

    def cpu_seconds(self) -> dict[str, float]:
        cpu = {name: pid_cpu(pid) for name, pid in self.pids().items()}
        return {name: v for name, v in cpu.items() if v is not None}

    def rss(self) -> dict[str, int]:
        rss = {name: pid_rss(pid) for name, pid in self.pids().items()}
        return {name: v for name, v in rss.items() if v is not None}

    async def metrics(self) -> dict[str, dict[str, float]]:
        out = {}
        for rid, r in self.replicas.items():
            try:
                out[rid] = parse_metrics((await self.http.get(f"{r.url}/metrics")).text)
            except httpx.HTTPError:
                out[rid] = {}
        return out

    def leader(self) -> str | None:
        """Which replica holds the leader lease (it runs the cluster's singleton loops)."""
        try:
            with self.valkey.client() as r:
                raw = r.get("sb:leader")
        except Exception:
            return None
        return raw.decode(errors="replace").partition("#")[0] if raw else None

    async def settled(self) -> dict[str, Any]:
        """Wait (bounded) until both replicas are ready with every subscription confirmed."""
        t0 = time.perf_counter()
        last: Any = None
        for _ in range(int(SETTLE_BOUND / 0.1) + 1):
            if time.perf_counter() - t0 > SETTLE_BOUND:
                break
            ok = True
            for rid, r in self.replicas.items():
                try:
                    ready = (await self.http.get(f"{r.url}/health/readiness")).status_code == 200
                    m = parse_metrics((await self.http.get(f"{r.url}/metrics")).text)
                except httpx.HTTPError as exc:
                    ok, last = False, f"{rid}: {exc!r}"
                    break
                desired = m.get("switchboard_subscriptions_desired")
                confirmed = m.get("switchboard_subscriptions_confirmed")
                if not ready or desired != confirmed:
                    ok, last = False, f"{rid}: ready={ready} desired={desired} confirmed={confirmed}"
                    break
            if ok:
                return {"ok": True, "seconds": time.perf_counter() - t0}
            await asyncio.sleep(0.1)
        return {"ok": False, "seconds": time.perf_counter() - t0, "last": last}


# --------------------------------------------------------------------------- measurements


async def echo_latency(svcs: dict[str, Any], n: int, warmup: int, block: int) -> dict[str, Any]:
    """Sequential echo latency through each service proxy, alternating blocks (``seq_latency``)."""
    return await seq_latency(
        {k: (lambda svc=svc: svc.echo(PAYLOAD)) for k, svc in svcs.items()},
        PAYLOAD,
        n,
        warmup,
        block,
        LATENCY_BOUND,
        timeout=CALL_TIMEOUT,
    )


async def poll_call(call: Any, t0: float) -> dict[str, Any]:
    """Retry ``call()`` with short timeouts until it succeeds; seconds since ``t0``."""
    return await poll_until_works(call, t0, CONVERGE_BOUND, POLL_CALL_TIMEOUT)


def counters(m: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    keys = (
        "switchboard_redis_reconnects",
        "switchboard_subscription_repairs",
        "switchboard_publishes_to_nobody",
        "switchboard_undeliverable_messages",
        "switchboard_reasserted_registrations",
        "switchboard_subscriptions_desired",
    )
    return {rid: {k.removeprefix("switchboard_"): v.get(k, 0) for k in keys} for rid, v in m.items()}


def counter_delta(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> dict[str, Any]:
    return {
        rid: {k: after[rid][k] - before.get(rid, {}).get(k, 0) for k in after[rid] if k != "subscriptions_desired"}
        for rid in after
    }


async def pubsub_kill_runs(cluster: Cluster, svc: Any, repeats: int) -> dict[str, Any]:
    runs = []
    for _ in range(repeats):
        pre = await cluster.settled()
        await asyncio.sleep(cluster.p.settle_seconds)
        before = counters(await cluster.metrics())
        t0 = time.perf_counter()
        killed = await asyncio.to_thread(cluster.valkey.kill_clients, "pubsub")
        r = await poll_call(lambda: svc.echo(PAYLOAD), t0)
        full = await cluster.settled()  # all subscriptions back, not just the two the call needs
        full_s = time.perf_counter() - t0
        after = counters(await cluster.metrics())
        runs.append(
            {
                **r,
                "killed": killed,
                "settled_before": pre["ok"],
                "all_confirmed_s": full_s if full["ok"] else None,
                "all_confirmed": full,
                "counters": counter_delta(before, after),
            }
        )
    ok = [r["seconds"] for r in runs if r["ok"]]
    return {"runs": runs, "call_works_again": spread(ok), "failed_runs": len(runs) - len(ok)}


async def redis_restart_runs(cluster: Cluster, caller: Any, svc: Any, repeats: int) -> dict[str, Any]:
    runs = []

    async def fresh_lookup() -> None:
        fresh = await caller.get_service(f"{cluster.workspace}/{SERVICE}")
        if await fresh.echo(PAYLOAD) != PAYLOAD:
            raise RuntimeError("wrong result")

    for _ in range(repeats):
        pre = await cluster.settled()
        await asyncio.sleep(cluster.p.settle_seconds)
        t0 = time.perf_counter()
        await asyncio.to_thread(cluster.valkey.restart)
        up = time.perf_counter() - t0
        call, lookup = await asyncio.gather(
            poll_call(lambda: svc.echo(PAYLOAD), t0),
            poll_call(fresh_lookup, t0),
        )
        full = await cluster.settled()
        after = counters(await cluster.metrics())
        runs.append(
            {
                "redis_down_and_up_s": up,
                "existing_proxy": call,
                "fresh_get_service": lookup,
                "settled_before": pre["ok"],
                "all_confirmed": full,
                "counters_after": after,
            }
        )
    return {
        "runs": runs,
        "redis_back_s": spread([r["redis_down_and_up_s"] for r in runs]),
        "existing_proxy_works_again": spread(
            [r["existing_proxy"]["seconds"] for r in runs if r["existing_proxy"]["ok"]]
        ),
        "fresh_get_service_works_again": spread(
            [r["fresh_get_service"]["seconds"] for r in runs if r["fresh_get_service"]["ok"]]
        ),
        "failed_runs": sum(1 for r in runs if not (r["existing_proxy"]["ok"] and r["fresh_get_service"]["ok"])),
    }


# --------------------------------------------------------------------------- the run


async def run(params: Params, mode: str) -> dict[str, Any]:
    import tempfile

    from switchboard.testing.replica import ReplicaProcess  # noqa: F401  (fail early if missing)

    t_start = time.perf_counter()
    top = max(params.idle_levels)
    fds = raise_fd_limit(2 * top + 2000)
    usable_top = top
    if fds["soft"] < 2 * top + 1000:  # the idle worker holds both replicas' clients
        usable_top = max(10, (fds["soft"] - 1000) // 2)
    levels = tuple(sorted({min(level, usable_top) for level in params.idle_levels}))
    res: dict[str, Any] = {
        "meta": {
            "mode": mode,
            "params": asdict(params),
            "idle_levels_used": levels,
            "fd_limit": fds,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "machine": platform.machine(),
            "started_unix": time.time(),
            "calibration_ms_start": calibrate(),
        }
    }
    work = Path(tempfile.mkdtemp(prefix="sb-bench-cluster-"))
    cluster = Cluster(params, work)
    try:
        say("starting Valkey, replicas A and B, provider (on A)")
        await cluster.start()
        res["meta"]["versions"] = _versions()
        res["meta"]["source"] = source_state()
        res["meta"]["replica_args"] = cluster.replica_args
        same = await cluster.connect(cluster.a, "lat-same")
        cross = await cluster.connect(cluster.b, "lat-cross")
        svc_same, svc_cross = await cluster.echo_service(same), await cluster.echo_service(cross)

        # 1. latency
        say(f"1. latency: {params.latency_calls} sequential calls each, same vs cross")
        lat = await echo_latency(
            {"same": svc_same, "cross": svc_cross}, params.latency_calls, params.latency_warmup, params.latency_block
        )
        lat["ratio_cross_same_p50"] = ratio(lat["cross"].get("p50_ms"), lat["same"].get("p50_ms"))
        lat["ratio_cross_same_p99"] = ratio(lat["cross"].get("p99_ms"), lat["same"].get("p99_ms"))
        lat["ratio_cross_same_p99_block_median"] = ratio(
            lat["cross"].get("p99_block_median_ms"), lat["same"].get("p99_block_median_ms")
        )
        res["latency"] = lat

        # 2. throughput
        say(f"2. throughput: {params.throughput_callers} callers for {params.throughput_seconds:g}s, same vs cross")
        tp: dict[str, Any] = {}
        for name, replica in (("same", cluster.a), ("cross", cluster.b)):
            svcs = []
            for i in range(params.caller_connections):
                svcs.append(await cluster.echo_service(await cluster.connect(replica, f"tp-{name}-{i}")))
            tp[name] = await concurrent(
                svcs,
                params.throughput_callers,
                params.throughput_seconds,
                params.throughput_warmup,
                dict(cluster.pids()),
                payload=PAYLOAD,
                timeout=CALL_TIMEOUT,
            )
        tp["ratio_cross_same"] = ratio(tp["cross"]["calls_per_s"], tp["same"]["calls_per_s"])
        res["throughput"] = tp

        # 4. and 5. at the baseline client count
        say(f"4. pub/sub connections killed x{params.kill_repeats}")
        res["pubsub_kill"] = await pubsub_kill_runs(cluster, svc_cross, params.kill_repeats)
        say(f"5. Valkey restarted x{params.restart_repeats}")
        res["redis_restart"] = await redis_restart_runs(cluster, cross, svc_cross, params.restart_repeats)

        # 3. idle clients
        levels_out: list[dict[str, Any]] = []
        prev_open = now_open = 0
        for level in levels:
            say(f"3. {level} idle clients per replica")
            await cluster.settled()
            opened = await cluster.idle.request(
                {
                    "open": {
                        cluster.a.url.replace("http", "ws", 1) + "/ws": level,
                        cluster.b.url.replace("http", "ws", 1) + "/ws": level,
                    },
                    "concurrency": params.idle_open_concurrency,
                },
                timeout=600,
            )
            prev_open, now_open = now_open, sum(opened["open"].values())
            settle = await cluster.settled()
            await asyncio.sleep(params.quiet_seconds)
            rss = cluster.rss()
            m = await cluster.metrics()
            cpu0, t_idle = cluster.cpu_seconds(), time.perf_counter()
            await asyncio.sleep(2.0)  # what the idle connections cost by themselves (pings, timers)
            cpu1, t_idle = cluster.cpu_seconds(), time.perf_counter() - t_idle
            idle_cpu = {k: 100 * (cpu1[k] - cpu0[k]) / t_idle for k in cpu1 if k in cpu0}
            cal_before = await asyncio.to_thread(calibrate)
            lat_level = await echo_latency(
                {"same": svc_same, "cross": svc_cross},
                params.idle_latency_calls,
                params.latency_warmup // 2,
                params.latency_block,
            )
            cal_after = await asyncio.to_thread(calibrate)
            lat_level["ratio_cross_same_p50"] = ratio(lat_level["cross"].get("p50_ms"), lat_level["same"].get("p50_ms"))
            levels_out.append(
                {
                    "idle_per_replica": level,
                    "opened": opened,
                    "open_rate_per_s": (sum(opened["open"].values()) - prev_open) / max(opened["seconds"], 1e-9),
                    "settled": settle,
                    "rss_bytes": rss,
                    "subscriptions": {
                        rid: {
                            "desired": v.get("switchboard_subscriptions_desired"),
                            "confirmed": v.get("switchboard_subscriptions_confirmed"),
                            "clients": v.get("switchboard_connected_clients"),
                        }
                        for rid, v in m.items()
                    },
                    "latency": lat_level,
                    "idle_cpu_pct": idle_cpu,
                    "leader": await asyncio.to_thread(cluster.leader),
                    "calibration_ms": (cal_before + cal_after) / 2,
                }
            )
        base = levels_out[0]
        for lv in levels_out:
            lv["calibration_vs_base"] = ratio(lv["calibration_ms"], base["calibration_ms"])
            for kind in ("cross", "same"):
                for p in ("p50", "p99", "p99_block_median"):
                    lv["latency"][f"ratio_{kind}_{p}_vs_base"] = ratio(
                        lv["latency"][kind].get(f"{p}_ms"), base["latency"][kind].get(f"{p}_ms")
                    )
        per_conn = {}
        if len(levels_out) > 1:
            lo, hi = levels_out[0], levels_out[-1]
            dn = hi["idle_per_replica"] - lo["idle_per_replica"]
            for rid in ("ra", "rb"):
                per_conn[rid] = (hi["rss_bytes"][rid] - lo["rss_bytes"][rid]) / dn
            per_conn["valkey_per_client"] = (hi["rss_bytes"]["valkey"] - lo["rss_bytes"]["valkey"]) / (2 * dn)
            per_conn["idle_worker_per_client"] = (hi["rss_bytes"]["idle_clients"] - lo["rss_bytes"]["idle_clients"]) / (
                2 * dn
            )
        res["idle"] = {"levels": levels_out, "rss_per_idle_connection_bytes": per_conn}

        # 4. and 5. again, with every idle client connected
        top_used = levels[-1]
        if params.loaded_kill_repeats:
            say(f"4b. pub/sub killed with {top_used} idle clients per replica x{params.loaded_kill_repeats}")
            res["pubsub_kill_loaded"] = await pubsub_kill_runs(cluster, svc_cross, params.loaded_kill_repeats)
            res["pubsub_kill_loaded"]["idle_per_replica"] = top_used
        if params.loaded_restart_repeats:
            say(f"5b. Valkey restarted with {top_used} idle clients per replica x{params.loaded_restart_repeats}")
            res["redis_restart_loaded"] = await redis_restart_runs(
                cluster, cross, svc_cross, params.loaded_restart_repeats
            )
            res["redis_restart_loaded"]["idle_per_replica"] = top_used
        res["replica_log_tails"] = {rid: r.log_tail(3000) for rid, r in cluster.replicas.items()}
    finally:
        say("cleaning up")
        await cluster.close()
    res["meta"]["calibration_ms_end"] = calibrate()
    res["meta"]["calibration_drift"] = ratio(res["meta"]["calibration_ms_end"], res["meta"]["calibration_ms_start"])
    res["meta"]["total_seconds"] = time.perf_counter() - t_start
    return res


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {}
    for pkg in ("switchboard", "hypha_rpc", "redis", "websockets", "uvicorn"):
        with contextlib.suppress(Exception):
            out[pkg] = version(pkg)
    return out


# --------------------------------------------------------------------------- report


def _f(x: float | None, fmt: str = ".2f") -> str:
    return "n/a" if x is None or x != x else format(x, fmt)


def _x(x: float | None) -> str:
    return "n/a" if x is None else f"x{x:.2f}"


def _spread(s: dict[str, Any]) -> str:
    if not s.get("n"):
        return "no successful run"
    return f"min {s['min_s']:.2f}s  median {s['median_s']:.2f}s  max {s['max_s']:.2f}s  (n={s['n']})"


def _errs(d: dict[str, Any]) -> str:
    return "" if not d else "  errors: " + ", ".join(f"{k}={v}" for k, v in d.items())


def _cell(lat: dict[str, Any], kind: str, p: str) -> str:
    """One latency figure of an idle level and its ratio against the first level."""
    return f"{_f(lat[kind].get(f'{p}_ms'), '.3f'):>6} {_x(lat[f'ratio_{kind}_{p}_vs_base']):>6}"


def _fault_sections(res: dict[str, Any], sections: tuple[tuple[str, str], ...]) -> Iterator[tuple[dict[str, Any], str]]:
    """(figures, heading) of each fault-injection section that ran, the idle level in the heading."""
    for key, title in sections:
        if key in res:
            d = res[key]
            extra = f" ({d['idle_per_replica']} idle/replica)" if "idle_per_replica" in d else ""
            yield d, f"{title}{extra}"


def report(res: dict[str, Any]) -> str:
    meta = res["meta"]
    lines = [
        f"Switchboard cluster benchmark ({meta['mode']}): 2 replicas + Valkey on loopback, "
        f"{meta['cpus']} CPUs, hypha-rpc {meta.get('versions', {}).get('hypha_rpc', '?')}",
        f"machine speed: calibration {meta['calibration_ms_start']:.0f} ms at start, "
        f"{_f(meta.get('calibration_ms_end'), '.0f')} ms at end ({_x(meta.get('calibration_drift'))})",
        f"source: commit {meta.get('source', {}).get('commit', '?')}, "
        f"{meta.get('source', {}).get('dirty_src_files', '?')} uncommitted file(s) under src/; "
        f"replica flags: {' '.join(meta.get('replica_args', []))}",
        "",
    ]
    if "latency" in res:
        lat = res["latency"]
        lines.append(
            f"1. Echo latency, sequential, {PAYLOAD.__len__()}-byte string "
            f"(n={lat['same'].get('n')} / {lat['cross'].get('n')})"
        )
        for k in ("same", "cross"):
            d = lat[k]
            lines.append(
                f"   {k:<6} p50 {_f(d.get('p50_ms'), '.3f')} ms  p99 {_f(d.get('p99_ms'), '.3f')} ms  "
                f"(median of {d.get('blocks')} block p99s {_f(d.get('p99_block_median_ms'), '.3f')} ms)  "
                f"mean {_f(d.get('mean_ms'), '.3f')} ms{_errs(d['errors'])}"
            )
        lines.append(
            f"   cross/same: p50 {_x(lat['ratio_cross_same_p50'])}  p99 {_x(lat['ratio_cross_same_p99'])}  "
            f"block-median p99 {_x(lat['ratio_cross_same_p99_block_median'])}"
        )
    if "throughput" in res:
        tp = res["throughput"]
        lines.append("")
        lines.append(
            f"2. Throughput, {meta['params']['throughput_callers']} concurrent callers over "
            f"{meta['params']['caller_connections']} connections, {meta['params']['throughput_seconds']:g}s"
        )
        for k in ("same", "cross"):
            d = tp[k]
            cpu = d["cpu_us_per_call"]
            cpus = "  ".join(f"{n} {v:.0f}" for n, v in cpu.items() if n != "idle_clients")
            lines.append(
                f"   {k:<6} {d['calls_per_s']:8.0f} calls/s  (p50 {_f(d['latency_under_load'].get('p50_ms'))} ms, "
                f"p99 {_f(d['latency_under_load'].get('p99_ms'))} ms){_errs(d['errors'])}"
            )
            lines.append(f"          CPU us/call: {cpus}")
        lines.append(f"   cross/same: {_x(tp['ratio_cross_same'])}")
        hub = {k: sum(tp[k]["cpu_us_per_call"].get(r, 0) for r in ("ra", "rb", "valkey")) for k in ("same", "cross")}
        lines.append(
            f"   hub CPU per call (replicas + Valkey): same {hub['same']:.0f} us, cross {hub['cross']:.0f} us "
            f"({_x(ratio(hub['cross'], hub['same']))}); the 2 CPUs are shared by all processes, so"
        )
        lines.append("   calls/s is bounded by the total CPU per call of hub + clients, not by the hub alone")
    if "idle" in res:
        lines.append("")
        lines.append("3. Idle clients per replica (raw WebSocket, hypha handshake, then silent)")
        lines.append("   latency in ms, ratio vs the first level; p99* = median of per-block p99s (robust to bursts)")
        lines.append("   idle/rep | cross p50      p99            p99*          | same p50       p99*")
        for lv in res["idle"]["levels"]:
            L = lv["latency"]
            c, s = L["cross"], L["same"]

            lines.append(
                f"   {lv['idle_per_replica']:>7}  | {_cell(L, 'cross', 'p50')}  {_cell(L, 'cross', 'p99')}  "
                f"{_cell(L, 'cross', 'p99_block_median')} | {_cell(L, 'same', 'p50')}  {_cell(L, 'same', 'p99_block_median')}"
                f"{_errs({**c['errors'], **s['errors'], **lv['opened']['errors']})}"
            )
        lines.append(
            "   idle/rep | cross/same p50 | machine speed (calibration vs first level) | idle CPU% A    B  clients | leader"
        )
        for lv in res["idle"]["levels"]:
            cpu = lv["idle_cpu_pct"]
            lines.append(
                f"   {lv['idle_per_replica']:>7}  |     {_x(lv['latency']['ratio_cross_same_p50']):>6}     | "
                f"{lv['calibration_ms']:5.1f} ms {_x(lv['calibration_vs_base']):>6} (higher = slower machine)      | "
                f"{cpu.get('ra', 0):5.1f} {cpu.get('rb', 0):5.1f} {cpu.get('idle_clients', 0):5.1f}    | {lv.get('leader')}"
            )
        lines.append("   idle/rep | RSS A    RSS B    Valkey  | channels A  B      | handshakes")
        for lv in res["idle"]["levels"]:
            rss, sub = lv["rss_bytes"], lv["subscriptions"]
            lines.append(
                f"   {lv['idle_per_replica']:>7}  | {rss.get('ra', 0) / 2**20:4.0f} MB  {rss.get('rb', 0) / 2**20:4.0f} MB  "
                f"{rss.get('valkey', 0) / 2**20:4.0f} MB  | {_f(sub.get('ra', {}).get('desired'), '.0f'):>6} "
                f"{_f(sub.get('rb', {}).get('desired'), '.0f'):>6}    | {lv['open_rate_per_s']:.0f}/s over "
                f"{lv['opened']['seconds']:.1f}s; all confirmed: {lv['settled']['ok']}"
            )
        pc = res["idle"]["rss_per_idle_connection_bytes"]
        if pc:
            lines.append(
                f"   RSS per idle connection: A {pc['ra'] / 1024:.1f} KiB, B {pc['rb'] / 1024:.1f} KiB; "
                f"Valkey {pc['valkey_per_client'] / 1024:.1f} KiB per client; "
                f"client side {pc['idle_worker_per_client'] / 1024:.1f} KiB"
            )
    for d, heading in _fault_sections(
        res,
        (
            ("pubsub_kill", "4. CLIENT KILL TYPE pubsub -> cross-replica call works again"),
            ("pubsub_kill_loaded", "4b. same, with idle clients connected"),
        ),
    ):
        lines += ["", heading]
        lines.append(f"   {_spread(d['call_works_again'])}; failed runs {d['failed_runs']}")
        alls = [r["all_confirmed_s"] for r in d["runs"] if r["all_confirmed_s"] is not None]
        if alls:
            lines.append(
                f"   all subscriptions confirmed again: median {statistics.median(alls):.2f}s, max {max(alls):.2f}s"
            )
        errs: Counter[str] = Counter()
        for r in d["runs"]:
            errs.update(r["errors"])
        if errs:
            lines.append(f"   failed poll attempts: {dict(errs)}")
    if "pubsub_kill" in res:
        lines.append("   (a subscription lost WITHOUT a reconnect is not injectable from outside the")
        lines.append("    process: not measured; the reconciler, every 5 s, is what would repair it)")
    for d, heading in _fault_sections(
        res,
        (
            ("redis_restart", "5. Valkey restart (empty) -> calls work again"),
            ("redis_restart_loaded", "5b. same, with idle clients connected"),
        ),
    ):
        lines += ["", f"{heading}, times from the start of the restart"]
        lines.append(f"   Valkey down and back up:       {_spread(d['redis_back_s'])}")
        lines.append(f"   existing service proxy works:  {_spread(d['existing_proxy_works_again'])}")
        lines.append(f"   fresh get_service + call works: {_spread(d['fresh_get_service_works_again'])}")
        lines.append(f"   failed runs {d['failed_runs']}")
        errs = Counter()
        for r in d["runs"]:
            errs.update(r["existing_proxy"]["errors"])
            errs.update(r["fresh_get_service"]["errors"])
        if errs:
            lines.append(f"   failed poll attempts: {dict(errs.most_common(4))}")
    lines.append("")
    lines.append(
        f"total {meta.get('total_seconds', 0):.0f}s; raw results in {RESULTS.relative_to(Path.cwd()) if RESULTS.is_relative_to(Path.cwd()) else RESULTS}"
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller counts and shorter windows (about 50 s)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    import hypha_rpc  # noqa: F401  (it sets its loggers' levels on import: import it first)

    for name in ("RPC", "websocket-client", "hypha-rpc"):
        logging.getLogger(name).setLevel(logging.CRITICAL)  # expected noise while faults are injected
    mode = "quick" if args.quick else "default"
    res = asyncio.run(run(QUICK if args.quick else DEFAULT, mode))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(res, indent=2, default=str))
    print(report(res))


if __name__ == "__main__":
    main()

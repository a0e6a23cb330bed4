"""One round of the comparison: a fresh Valkey and two replicas of one server kind
("switchboard", "hypha" or the raw "floor" relay), then every workload against them.

The client workload is the same code for both hubs (``RpcSide``: unmodified
``hypha_rpc.connect_to_server`` clients; only the URL differs). The floor is driven
by ``FloorSide`` with the same message sizes, processes and hops (see ``_floor.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _hypha
from _common import (
    FLOOR,
    JWT_SECRET,
    WORKERS,
    Child,
    FailoverProxy,
    ServerProc,
    err_key,
    free_port,
    pct,
    pid_cpu,
    pid_rss,
    poll_until_works,
    ratio,
    say,
    summarize_ms,
    wait_quiet,
)

SMALL = b"x" * 32
CALL_TIMEOUT = 30.0  # any single call; 4 MiB through a loaded hub stays well below it
# Admission limits are policy, not cost: raised on both hubs (Hypha: bench/_hypha.py) so that
# neither caps the load generator. Environment variables, so a build without them ignores them.
SWITCHBOARD_ENV = {
    "SWITCHBOARD_MAX_CONNECTIONS_PER_USER": "100000",
    "SWITCHBOARD_MAX_CONNECTIONS_PER_WORKSPACE": "100000",
    "SWITCHBOARD_MAX_MESSAGES_PER_SECOND": "1000000",
    "SWITCHBOARD_MESSAGE_BURST": "1000000",
}
KIND_LABEL = {"switchboard": "Switchboard", "hypha": "Hypha", "floor": "floor"}


@dataclass(frozen=True)
class Params:
    rounds: int = 3
    small_n: int = 1500  # sequential calls per variant (same, cross), after warm-up
    small_warmup: int = 100
    block: int = 250  # same/cross alternate in blocks of this many calls
    sizes: tuple[tuple[int, int], ...] = ((64 << 10, 150), (4 << 20, 8))  # (bytes, calls per variant)
    tp_seconds: float = 5.0
    tp_warmup: float = 1.0
    tp_callers: int = 32
    tp_connections: int = 4  # the 32 callers share this many client connections, all on replica B
    cb_n: int = 300
    idle_levels: tuple[int, ...] = (10, 1000, 5000)  # idle clients per replica
    idle_latency_n: int = 300
    idle_concurrency: int = 64  # handshakes in flight at once (both replicas together)
    quiet_bound: float = 20.0  # wait at most this long for the servers to calm down
    drop_bound: float = 60.0  # ... after every idle client dropped at once
    recover_bound: float = 45.0
    terminate_bound: float = 30.0
    workload_bound: float = 180.0  # no latency series runs longer than this
    notes: dict[str, str] = field(default_factory=dict)


DEFAULT = Params()
QUICK = Params(
    rounds=1,
    small_n=300,
    small_warmup=50,
    block=100,
    sizes=((64 << 10, 40), (4 << 20, 3)),
    tp_seconds=2.0,
    tp_warmup=0.5,
    cb_n=100,
    idle_levels=(10, 200, 500),
    idle_latency_n=100,
    quiet_bound=10.0,
    drop_bound=30.0,
    recover_bound=30.0,
    terminate_bound=20.0,
    workload_bound=90.0,
)


# --------------------------------------------------------------------------- measurements


@dataclass
class Endpoint:
    """What a caller can do: echo a payload, or make the callback round trip with one."""

    echo: Callable[[bytes], Awaitable[Any]]
    cb: Callable[[bytes], Awaitable[Any]]


async def timed(
    call: Callable[[], Awaitable[Any]],
    expect: Any,
    n: int,
    samples: list[float],
    errors: Counter[str],
    t_end: float,
    timeout: float = CALL_TIMEOUT,
) -> None:
    """``n`` sequential calls (none started after ``t_end``); latencies appended to ``samples``."""
    for _ in range(n):
        if time.perf_counter() > t_end:
            errors["time bound reached"] += 1
            return
        t = time.perf_counter()
        try:
            result = await asyncio.wait_for(call(), timeout)
        except Exception as exc:
            errors[err_key(exc)] += 1
            continue
        dt = time.perf_counter() - t
        if result != expect:
            errors["wrong result"] += 1
        else:
            samples.append(dt)


async def seq_latency(
    variants: dict[str, Callable[[], Awaitable[Any]]],
    expect: Any,
    n: int,
    warmup: int,
    block: int,
    bound: float,
    timeout: float = CALL_TIMEOUT,
) -> dict[str, Any]:
    """Sequential calls of each variant, alternating in blocks so that drift hits all alike.

    The machine is shared: a burst of foreign load inflates the pooled p99 of whichever
    variant it hits. The median of per-block p99s (blocks of 50 calls or more) shrugs that off.
    """
    samples: dict[str, list[float]] = {k: [] for k in variants}
    errors: dict[str, Counter[str]] = {k: Counter() for k in variants}
    block_p99: dict[str, list[float]] = {k: [] for k in variants}
    t0 = time.perf_counter()
    t_end = t0 + bound
    for name, call in variants.items():
        await timed(call, expect, warmup, [], errors[name], t_end, timeout)
    attempted = dict.fromkeys(variants, 0)
    for _ in range(max(1, -(-n // block))):
        for name, call in variants.items():
            todo = min(block, n - attempted[name])
            if todo > 0:
                attempted[name] += todo
                got: list[float] = []
                await timed(call, expect, todo, got, errors[name], t_end, timeout)
                samples[name] += got
                if len(got) >= 50:
                    block_p99[name].append(pct(sorted(got), 99))
    out: dict[str, Any] = {
        k: {
            **summarize_ms(v),
            "errors": dict(errors[k]),
            "blocks": len(block_p99[k]),
            "p99_block_median_ms": statistics.median(block_p99[k]) * 1e3 if block_p99[k] else None,
        }
        for k, v in samples.items()
    }
    out["wall_s"] = time.perf_counter() - t0
    return out


async def concurrent(
    endpoints: list[Any],
    callers: int,
    seconds: float,
    warmup: float,
    pids: dict[str, int | None],
    payload: Any = SMALL,
    timeout: float = CALL_TIMEOUT,
) -> dict[str, Any]:
    """``callers`` tasks spread over ``endpoints`` (an ``Endpoint`` or anything else with an async
    ``echo``), each calling echo in a loop, for ``seconds``; the CPU each of ``pids`` spent."""
    state = {"count": False, "stop": False}
    done: list[float] = []
    errors: Counter[str] = Counter()

    async def caller(ep: Any) -> None:
        for _ in range(10_000_000):  # bounded in count as well as in time
            if state["stop"]:
                return
            t = time.perf_counter()
            started_in_window = state["count"]
            try:
                r = await asyncio.wait_for(ep.echo(payload), timeout)
                if r != payload:
                    raise ValueError("wrong result")
            except Exception as exc:
                if started_in_window or state["count"]:  # a call that hangs past the window counts too
                    errors[err_key(exc)] += 1
                await asyncio.sleep(0.01)
                continue
            if state["count"]:
                done.append(time.perf_counter() - t)

    tasks = [asyncio.create_task(caller(endpoints[i % len(endpoints)])) for i in range(callers)]
    try:
        await asyncio.sleep(warmup)
        cpu0 = {k: pid_cpu(p) for k, p in pids.items()}
        t0 = time.perf_counter()
        state["count"] = True
        await asyncio.sleep(seconds)
        state["count"] = False
        elapsed = time.perf_counter() - t0
        cpu1 = {k: pid_cpu(p) for k, p in pids.items()}
        state["stop"] = True
        await asyncio.wait(tasks, timeout=timeout + 2)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    calls = len(done)
    cpu = {k: cpu1[k] - cpu0[k] for k in pids if cpu0.get(k) is not None and cpu1.get(k) is not None}
    return {
        "calls": calls,
        "seconds": elapsed,
        "calls_per_s": calls / elapsed,
        "errors": dict(errors),
        "latency_under_load": summarize_ms(done),
        "cpu_util_pct": {k: 100 * v / elapsed for k, v in cpu.items()},
        "cpu_us_per_call": {k: 1e6 * v / calls for k, v in cpu.items()} if calls else {},
    }


# --------------------------------------------------------------------------- sides


class RpcSide:
    """hypha-rpc clients against either hub: the provider (and a second one behind a
    failover proxy, for workload 7) in child processes, callers in this process."""

    def __init__(self, servers: list[ServerProc], work: Path) -> None:
        self.servers = servers
        self.work = work
        self.provider = Child("provider", [WORKERS, "provider", servers[0].url, "provider"], work)
        self.provider_fo: Child | None = None
        self.proxy = FailoverProxy([s.port for s in servers])
        self.clients: list[Any] = []
        self.workspace = ""
        self.token = ""

    async def setup(self) -> None:
        await self.provider.start()
        hello = await self.provider.request(None, 60)
        self.workspace, self.token = hello["workspace"], hello["token"]
        await self.proxy.start()
        self.provider_fo = Child(
            "provider-fo", [WORKERS, "provider", self.proxy.url, "provider-fo", self.token, self.workspace], self.work
        )
        await self.provider_fo.start()
        await self.provider_fo.request(None, 60)

    async def connect(self, index: int, name: str) -> Any:
        from hypha_rpc import connect_to_server

        client = await asyncio.wait_for(
            connect_to_server(
                {
                    "server_url": self.servers[index].url,
                    "client_id": f"{name}-{uuid.uuid4().hex[:8]}",
                    "token": self.token,
                    "workspace": self.workspace,
                    "method_timeout": CALL_TIMEOUT,
                }
            ),
            60,
        )
        self.clients.append(client)
        return client

    async def endpoint(self, index: int, name: str, service: str = "provider:bench") -> Endpoint:
        client = await self.connect(index, name)
        svc = await asyncio.wait_for(client.get_service(f"{self.workspace}/{service}"), CALL_TIMEOUT)

        def identity(x: Any) -> Any:
            return x

        return Endpoint(echo=svc.echo, cb=lambda x: svc.cb(identity, x))

    async def failover_probe(self) -> tuple[Callable[[], Awaitable[Any]], Callable[[], Awaitable[Any]]]:
        """(existing proxy's call, fresh lookup + call) for the provider behind the failover proxy,
        from a caller on replica B."""
        client = await self.connect(1, "fo-caller")
        name = f"{self.workspace}/provider-fo:bench"
        svc = await asyncio.wait_for(client.get_service(name), CALL_TIMEOUT)
        if await asyncio.wait_for(svc.echo(SMALL), CALL_TIMEOUT) != SMALL:
            raise RuntimeError("failover provider answers wrongly before the kill")

        async def existing() -> None:
            if await svc.echo(SMALL) != SMALL:
                raise ValueError("wrong result")

        async def fresh() -> None:
            s = await client.get_service(name)
            if await s.echo(SMALL) != SMALL:
                raise ValueError("wrong result")

        return existing, fresh

    def pids(self) -> dict[str, int | None]:
        out = {"bench_client": os.getpid(), "provider": self.provider.pid}
        if self.provider_fo is not None:
            out["provider_fo"] = self.provider_fo.pid
        return out

    async def close(self) -> None:
        for client in reversed(self.clients):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.disconnect(), 3)
        await self.provider.stop()
        if self.provider_fo is not None:
            await self.provider_fo.stop()
        await self.proxy.close()


class FloorSide:
    def __init__(self, servers: list[ServerProc], work: Path) -> None:
        self.servers = servers
        self.provider = Child("floor-provider", [FLOOR, "provider", servers[0].ws_url], work)
        self.clients: list[Any] = []

    async def setup(self) -> None:
        await self.provider.start()
        await self.provider.request(None, 60)

    async def endpoint(self, index: int, name: str) -> Endpoint:
        from _floor import FloorClient

        client = await FloorClient().connect(self.servers[index].ws_url)
        self.clients.append(client)
        return Endpoint(echo=client.echo, cb=client.cb)

    def pids(self) -> dict[str, int | None]:
        return {"bench_client": os.getpid(), "provider": self.provider.pid}

    async def close(self) -> None:
        for c in self.clients:
            await c.close()
        await self.provider.stop()


# --------------------------------------------------------------------------- one round


def make_servers(kind: str, redis_url: str) -> list[ServerProc]:
    ports = [free_port(), free_port()]
    out = []
    for i, name in enumerate(("a", "b")):
        if kind == "switchboard":
            from switchboard.testing.replica import ReplicaProcess

            cmd = ReplicaProcess(
                replica_id=f"sb-{name}",
                redis_url=redis_url,
                jwt_secret=JWT_SECRET,
                port=ports[i],
                public_url=f"http://127.0.0.1:{ports[0]}",
                args=["--log-level", os.environ.get("BENCH_LOG_LEVEL", "WARNING")],
            ).command()
            env = dict(SWITCHBOARD_ENV)
            if os.environ.get("BENCH_SWITCHBOARD_SRC"):  # --switchboard-ref: that revision's src/
                env["PYTHONPATH"] = os.environ["BENCH_SWITCHBOARD_SRC"]
            out.append(ServerProc(f"switchboard-{name}", cmd, ports[i], env=env))
        elif kind == "hypha":
            out.append(_hypha.replica(f"hypha-{name}", ports[i], redis_url, ports[0]))
        else:
            cmd = [sys.executable, FLOOR, "relay", str(ports[i]), redis_url]
            out.append(ServerProc(f"floor-{name}", cmd, ports[i], ready_path="/health", ws_path="/"))
    return out


async def run_round(kind: str, p: Params, work: Path) -> dict[str, Any]:
    from switchboard.testing import ValkeyServer

    await asyncio.to_thread(work.mkdir, parents=True, exist_ok=True)
    res: dict[str, Any] = {"kind": kind}
    valkey = ValkeyServer()
    await asyncio.to_thread(valkey.start)
    servers = make_servers(kind, valkey.url)
    side: RpcSide | FloorSide | None = None
    idle = Child("idle", [WORKERS, "idle"], work)
    t_round = time.perf_counter()
    try:
        for s in servers:  # one after the other: Hypha's first start initialises shared state
            await asyncio.to_thread(s.start)
            await asyncio.to_thread(s.wait_ready)
        res["start_to_ready_s"] = [s.start_seconds for s in servers]
        res["commands"] = [s.cmd for s in servers]
        side = FloorSide(servers, work) if kind == "floor" else RpcSide(servers, work)
        await side.setup()
        await idle.start()
        await workloads(kind, side, servers, valkey, idle, p, res)
    except Exception as exc:
        res["failed"] = f"{type(exc).__name__}: {exc}"
        say(f"   round failed: {res['failed'][:300]}")
    finally:
        res["log_tails"] = {s.name: s.log_tail(2500) for s in servers}
        res["log_errors"] = {s.name: s.log_errors() for s in servers}
        if side is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(side.close(), 30)
        for s in servers:
            await asyncio.to_thread(s.kill)  # before the idle worker goes: thousands of detaches
        await idle.stop()
        await asyncio.to_thread(valkey.stop)
    res["round_seconds"] = time.perf_counter() - t_round
    return res


async def cpu_of(pids: dict[str, int | None], coro: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    """Run a measurement and add the CPU seconds each process spent during it."""
    c0 = {k: pid_cpu(p) for k, p in pids.items()}
    r = await coro
    c1 = {k: pid_cpu(p) for k, p in pids.items()}
    r["cpu_s"] = {k: c1[k] - c0[k] for k in pids if c0.get(k) is not None and c1.get(k) is not None}
    calls = sum(r[v].get("n", 0) for v in ("same", "cross") if isinstance(r.get(v), dict))
    hub = [r["cpu_s"].get(k) for k in ("replica_a", "replica_b", "valkey")]
    r["server_cpu_ms_per_call"] = 1e3 * sum(hub) / calls if calls and None not in hub else None  # type: ignore[arg-type]
    clients = [v for k, v in r["cpu_s"].items() if k not in ("replica_a", "replica_b", "valkey")]
    r["client_cpu_ms_per_call"] = 1e3 * sum(clients) / calls if calls else None
    return r


async def workloads(
    kind: str,
    side: RpcSide | FloorSide,
    servers: list[ServerProc],
    valkey: Any,
    idle: Child,
    p: Params,
    out: dict[str, Any],
) -> None:
    """Fills ``out`` as it goes, so that a failure late in the round keeps what was measured."""
    a, b = servers
    server_pids = {"replica_a": a.pid, "replica_b": b.pid, "valkey": valkey.pid}
    pids = {**server_pids, **side.pids()}
    same = await side.endpoint(0, "same")
    cross = await side.endpoint(1, "cross")

    # 1. small echo, sequential
    say(f"   1. echo {len(SMALL)} B x{p.small_n}, same vs cross")
    out["echo_small"] = await cpu_of(
        pids,
        seq_latency(
            {"same": lambda: same.echo(SMALL), "cross": lambda: cross.echo(SMALL)},
            SMALL,
            p.small_n,
            p.small_warmup,
            p.block,
            p.workload_bound,
        ),
    )

    # 2. large payloads
    out["echo_sizes"] = {}
    for size, n in p.sizes:
        say(f"   2. echo {size >> 10} KiB x{n}, same vs cross")
        payload = os.urandom(size)
        r = await cpu_of(
            pids,
            seq_latency(
                {"same": lambda pl=payload: same.echo(pl), "cross": lambda pl=payload: cross.echo(pl)},
                payload,
                n,
                max(1, n // 10),
                max(1, n // 2),
                p.workload_bound,
            ),
        )
        for k in ("same", "cross"):
            p50 = r[k].get("p50_ms")
            r[k]["MBps_p50"] = size / (p50 / 1e3) / 1e6 if p50 else None
        out["echo_sizes"][str(size)] = r

    # 3. concurrent callers, cross-replica
    say(f"   3. {p.tp_callers} concurrent callers over {p.tp_connections} connections on B, {p.tp_seconds:g}s")
    eps = [await side.endpoint(1, f"tp{i}") for i in range(p.tp_connections)]
    out["concurrent_cross"] = await concurrent(eps, p.tp_callers, p.tp_seconds, p.tp_warmup, pids)

    # 4. callback round trip
    say(f"   4. callback round trip x{p.cb_n}, same vs cross")
    out["callback"] = await cpu_of(
        pids,
        seq_latency(
            {"same": lambda: same.cb(SMALL), "cross": lambda: cross.cb(SMALL)},
            SMALL,
            p.cb_n,
            max(5, p.cb_n // 10),
            max(1, p.cb_n // 3),
            p.workload_bound,
        ),
    )

    # 5. idle clients
    out["idle"] = await idle_levels(side, servers, valkey, idle, same, cross, p)

    # 7. recovery (the hubs only)
    if isinstance(side, RpcSide):
        out["recovery"] = rec = {}
        await recovery(side, servers, p, rec)


async def idle_levels(
    side: Any, servers: list[ServerProc], valkey: Any, idle: Child, same: Endpoint, cross: Endpoint, p: Params
) -> dict[str, Any]:
    a, b = servers
    levels: list[dict[str, Any]] = []
    for level in p.idle_levels:
        say(f"   5. {level} idle clients per replica")
        opened = await idle.request(
            {"open": {a.ws_url: level, b.ws_url: level}, "concurrency": p.idle_concurrency}, timeout=600
        )
        quiet = await wait_quiet([a.pid, b.pid, valkey.pid], p.quiet_bound)
        rss = {"replica_a": a.rss(), "replica_b": b.rss(), "valkey": pid_rss(valkey.pid)}
        lat = await seq_latency(
            {"same": lambda: same.echo(SMALL), "cross": lambda: cross.echo(SMALL)},
            SMALL,
            p.idle_latency_n,
            20,
            max(1, p.idle_latency_n // 3),
            p.workload_bound,
        )
        levels.append(
            {"idle_per_replica": level, "opened": opened, "quiet_wait_s": quiet, "rss_bytes": rss, "latency": lat}
        )
    per_conn: dict[str, Any] = {}
    lo, hi = levels[0], levels[-1]
    dn = hi["idle_per_replica"] - lo["idle_per_replica"]
    if dn > 0:
        for k in ("replica_a", "replica_b"):
            if hi["rss_bytes"][k] and lo["rss_bytes"][k]:
                per_conn[k] = (hi["rss_bytes"][k] - lo["rss_bytes"][k]) / dn
        if hi["rss_bytes"]["valkey"] and lo["rss_bytes"]["valkey"]:
            per_conn["valkey_per_client"] = (hi["rss_bytes"]["valkey"] - lo["rss_bytes"]["valkey"]) / (2 * dn)
        reps = [per_conn[k] for k in ("replica_a", "replica_b") if k in per_conn]
        per_conn["replica_mean"] = sum(reps) / len(reps) if reps else None
    closed = await idle.request({"close": True}, timeout=120)
    quiet = await wait_quiet([a.pid, b.pid, valkey.pid], p.drop_bound)
    return {"levels": levels, "rss_per_connection_bytes": per_conn, "closed": closed, "quiet_after_close_s": quiet}


async def recovery(side: RpcSide, servers: list[ServerProc], p: Params, out: dict[str, Any]) -> None:
    """SIGKILL replica A: how long until the failover provider, which reconnects through the
    proxy to B, is callable again from a caller on B. Then SIGTERM B: how long until it exits."""
    a, b = servers
    say("   7. SIGKILL replica A -> provider callable again via B; then SIGTERM B -> exit")
    errors: Counter[str] = Counter()
    for attempt in range(3):  # a hub still busy with the idle clients' departure may refuse a client
        try:
            existing, fresh = await side.failover_probe()
            break
        except Exception as exc:
            errors[err_key(exc)] += 1
            if attempt == 2:
                out["errors"] = dict(errors)
                raise
            await asyncio.sleep(5)
    if errors:
        out["errors"] = dict(errors)  # reported as a problem: a client was refused
    t0 = time.perf_counter()
    await asyncio.to_thread(a.kill)
    ex, fr = await asyncio.gather(
        poll_until_works(existing, t0, p.recover_bound), poll_until_works(fresh, t0, p.recover_bound)
    )
    out["sigkill_existing_proxy"] = ex
    out["sigkill_fresh_lookup"] = fr
    out["proxy_routed_ports"] = side.proxy.routed
    out["sigkill_to_callable_s"] = ex["seconds"]
    await asyncio.sleep(0.5)
    term = await asyncio.to_thread(b.terminate_timed, p.terminate_bound)
    out["sigterm"] = term
    out["sigterm_to_exit_s"] = term["seconds"]


def cross_same(r: dict[str, Any]) -> float | None:
    return ratio(r.get("cross", {}).get("p50_ms"), r.get("same", {}).get("p50_ms"))

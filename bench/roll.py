"""Rolling restart of a 3-replica hub under load: failed calls, latency, unreachability.

Valkey and three replicas on fixed loopback ports. Provider clients (the SDK,
``switchboard.connect`` with all three URLs, each list rotated so that every
replica hosts some of them; all clients in one workspace, so each caller hears
the providers' ``client_disconnected``, on which hypha-rpc fails the calls
it has pending to that provider) each register a public service with an
idempotent function ``ping`` and a non-idempotent one ``bump``. A caller (the
SDK, all URLs) calls ``ping`` of every provider at ``--rate`` calls/s in total
and ``bump`` at a low rate, recording each call's latency and error. Then each
replica in turn gets SIGTERM (or SIGKILL), its exit is awaited, it is started
again on the same port (a new incarnation with a new replica id, like a new
pod behind the same Service) and awaited ready, then a short pause. With
``--rolls N`` the whole sequence runs N times in a row (failures are counted
per roll). With ``--hypha-caller`` an unmodified hypha-rpc client calls every
provider too, at the same rate, through a round-robin TCP balancer in front
of the replicas (``switchboard.testing.balancer``: one URL, as a hypha-rpc
client has; a replica is taken out of it just before its signal and put back
once ready, as a terminating pod leaves its Service). hypha-rpc backs off its
reconnection by 1 s, doubling, after each connection in a row that lived less
than 5 s (its flap control), so the pause must keep each of the plain caller's
connections older than that: the balancer hands it to the replica restarted
most recently, which is signalled two steps later.

Unreachability of a provider is what the caller saw: the longest gap between
two successful ``ping`` completions of that provider while the roll ran (the
load's own spacing, providers / rate, is included and printed as baseline).
The SDK's own view (Disconnected -> Reconnected) is printed next to it.

With ``--signal kill`` the replicas run a fast reaper
(``--orphan-reap-interval 1 --orphan-reap-min-failures 2``), and one extra
"stranded" client per replica, connected to that replica only, is abandoned
when its replica is killed: its registrations can only go away through the
reaper. At the end: every provider is callable by a fresh client, and within
a bounded wait no ``sb:owner`` entry names a replica incarnation that is gone.

    .venv/bin/python bench/roll.py [--signal term|kill|both] [--rate 50] [--clients-per-replica 2]
                                   [--rolls 20] [--hypha-caller] [-- replica args...]

Writes ``bench/results/roll.json``. ``tests/cluster/test_rolling.py`` loads
this file by path (``importlib.util.spec_from_file_location``) and runs the
same :func:`run_roll` with a smaller load, so there is one implementation.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import re
import signal as signals
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from switchboard.client import Disconnected, GivingUp, Reconnected, connect, idempotent
from switchboard.testing import ValkeyServer
from switchboard.testing.balancer import Balancer
from switchboard.testing.ports import free_port
from switchboard.testing.replica import ReplicaProcess

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import pct  # noqa: E402  (the one percentile of bench/)

RESULTS = Path(__file__).resolve().parent / "results" / "roll.json"
FAST_REAPER = ["--orphan-reap-interval", "1", "--orphan-reap-min-failures", "2"]
SERVICE = "roll"


@dataclass
class RollConfig:
    signal: str = "term"  # "term" or "kill"
    rate: float = 50.0  # idempotent calls per second, all providers together
    clients_per_replica: int = 2
    replicas: int = 3
    non_idempotent_rate: float = 5.0
    pause: float = 2.0  # between one replica being ready and the next one's signal
    # at least this long from one signal to the next, however fast a replica restarts: a plain
    # caller's connection lives two steps and must outlive hypha-rpc's 5 s flap window
    step: float = 0.0
    warmup: float = 2.0  # load before the first signal
    settle: float = 3.0  # load after the last replica is ready
    call_timeout: float = 15.0  # a call that has not answered by then counts as failed (> the 10 s drain timeout)
    exit_timeout: float = 20.0  # SIGTERM: wait this long for the exit, then SIGKILL
    ready_timeout: float = 30.0
    cleanup_timeout: float = 40.0  # kill: bound on the wait for the reaper
    callable_timeout: float = 20.0  # bound on the wait for every provider to answer at the end
    stranded: bool = True  # kill: one abandoned client per replica, left to the reaper
    keep_logs: int = 0  # > 0: that many characters of each replica's log in the result
    rolls: int = 1  # passes over the replicas, one after the other
    hypha_caller: bool = False  # also an unmodified hypha-rpc caller, through a balancer
    replica_args: tuple[str, ...] = ()  # extra `switchboard serve` flags for every replica


@dataclass
class Call:
    kind: str  # "idempotent" or "non_idempotent"
    provider: str
    start: float
    end: float
    error: str | None = None
    caller: str = "sdk"  # "sdk" or "hypha"


@dataclass
class Conn:
    """One client's SDK events (monotonic times)."""

    disconnects: list[tuple[float, str, int]] = field(default_factory=list)  # (t, url, code)
    reconnects: list[tuple[float, str, int, float]] = field(default_factory=list)  # (t, url, attempts, outage)
    gave_up: str | None = None

    def on_event(self, event: Any) -> None:
        now = time.monotonic()
        if isinstance(event, Disconnected):
            self.disconnects.append((now, event.url, event.code))
        elif isinstance(event, Reconnected):
            self.reconnects.append((now, event.url, event.attempts, event.outage_seconds))
        elif isinstance(event, GivingUp):
            self.gave_up = str(event.error)

    def offline(self) -> list[float]:
        """Seconds from each drop to the next readiness (services re-registered)."""
        out = []
        for t, *_ in self.disconnects:
            back = [r[0] for r in self.reconnects if r[0] >= t]
            out.append((min(back) if back else float("inf")) - t)
        return out


# --------------------------------------------------------------------------- the replicas


class Replicas:
    """Fixed ports; each restart is a new incarnation (replica id ``r<i>-<generation>``)."""

    def __init__(self, redis_url: str, count: int, args: list[str]) -> None:
        self.redis_url = redis_url
        self.args = args
        self.ports = [free_port() for _ in range(count)]
        self.generation = [0] * count
        self.current: list[ReplicaProcess] = []
        self.past: list[ReplicaProcess] = []

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    def index_of(self, url: str) -> int:
        """Which replica an SDK URL (``ws://127.0.0.1:<port>/ws``) points at."""
        return self.ports.index(int(url.split(":")[2].split("/")[0]))

    def live_ids(self) -> set[str]:
        return {r.replica_id for r in self.current if r.is_running()}

    def _make(self, i: int) -> ReplicaProcess:
        return ReplicaProcess(
            replica_id=f"r{i}-{self.generation[i]}", redis_url=self.redis_url, port=self.ports[i], args=self.args
        )

    def start_all(self, timeout: float) -> None:
        self.current = [self._make(i) for i in range(len(self.ports))]
        for replica in self.current:
            replica.start(timeout=timeout)

    def stop(self, i: int, sig: str, exit_timeout: float) -> dict[str, Any]:
        """Signal replica ``i`` and wait for its exit (blocking)."""
        replica = self.current[i]
        assert replica.proc is not None
        started = time.monotonic()
        if sig == "kill":
            code = replica.kill()
        else:
            replica.proc.send_signal(signals.SIGTERM)
            try:
                code = replica.proc.wait(exit_timeout)
            except Exception:
                replica.proc.kill()
                code = replica.proc.wait(5)
        self.past.append(replica)
        return {
            "replica": replica.replica_id,
            "exit_code": code,
            "signalled_at": started,
            "exit_s": time.monotonic() - started,
        }

    def start_again(self, i: int, timeout: float) -> dict[str, Any]:
        """A new incarnation on the same port; returns when it is ready (blocking)."""
        self.generation[i] += 1
        replica = self._make(i)
        started = time.monotonic()
        replica.start(timeout=timeout)
        self.current[i] = replica
        return {"new_replica": replica.replica_id, "ready_at": time.monotonic(), "ready_s": time.monotonic() - started}

    def kill_all(self) -> None:
        for replica in self.current + self.past:
            with contextlib.suppress(Exception):
                replica.kill()


# --------------------------------------------------------------------------- the clients


def provider_service(client_id: str) -> dict[str, Any]:
    bumps = [0]

    @idempotent
    def ping(n: int) -> list[Any]:
        return [client_id, n]

    def bump() -> int:  # not idempotent: a retry would count twice
        bumps[0] += 1
        return bumps[0]

    return {"id": SERVICE, "config": {"visibility": "public"}, "ping": ping, "bump": bump}


def rotated(urls: list[str], k: int) -> list[str]:
    k %= len(urls)
    return urls[k:] + urls[:k]


class Load:
    """Paced calls from each caller to every provider, each call its own task.

    ``services`` maps a caller ("sdk", "hypha") to its provider services; the
    SDK caller also makes the non-idempotent calls.
    """

    def __init__(self, services: dict[str, dict[str, Any]], cfg: RollConfig) -> None:
        self.services = services
        self.order = sorted(services["sdk"])
        self.cfg = cfg
        self.calls: list[Call] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.stop = asyncio.Event()

    async def run(self) -> None:
        loops = [self._paced("idempotent", self.cfg.rate, caller) for caller in self.services]
        if self.cfg.non_idempotent_rate > 0:
            loops.append(self._paced("non_idempotent", self.cfg.non_idempotent_rate, "sdk"))
        await asyncio.gather(*loops)

    async def _paced(self, kind: str, rate: float, caller: str) -> None:
        loop = asyncio.get_running_loop()
        interval = 1.0 / rate
        due = loop.time()
        i = 0
        while not self.stop.is_set():
            provider = self.order[i % len(self.order)]
            i += 1
            task = asyncio.create_task(self._one(kind, provider, i, caller))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            due += interval
            delay = due - loop.time()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), delay)
            elif delay < -1.0:
                due = loop.time()  # after a stall of the loop, do not burst to catch up

    async def _one(self, kind: str, provider: str, n: int, caller: str) -> None:
        svc = self.services[caller][provider]
        start = time.monotonic()
        error = None
        try:
            if kind == "idempotent":
                got = await asyncio.wait_for(svc.ping(n), self.cfg.call_timeout)
                if list(got) != [provider, n]:
                    error = f"wrong answer {got!r}"
            else:
                await asyncio.wait_for(svc.bump(), self.cfg.call_timeout)
        except Exception as exc:
            error = f"{type(exc).__name__}: {str(exc)[:300]}"
        self.calls.append(Call(kind, provider, start, time.monotonic(), error, caller))

    async def finish(self) -> None:
        self.stop.set()
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=self.cfg.call_timeout + 5)


# --------------------------------------------------------------------------- figures


def longest_gap(ends: list[float], lo: float, hi: float) -> float:
    """Longest stretch of [lo, hi] without a success (ends: success completion times)."""
    points = [lo] + sorted(t for t in ends if lo < t < hi) + [hi]
    return max(b - a for a, b in zip(points, points[1:], strict=False))


def _failures(calls: list[Call]) -> dict[str, Any]:
    failed = [c for c in calls if c.error]
    errors: dict[str, int] = {}
    for c in failed:
        assert c.error is not None
        key = c.error.split(":", 1)[0] + ": " + c.error.split(":", 1)[-1][:120].strip()
        errors[key] = errors.get(key, 0) + 1
    return {"calls": len(calls), "failed": len(failed), "errors": errors}


def _latency(calls: list[Call]) -> dict[str, float | None]:
    ok = [(c.end - c.start) for c in calls if not c.error]
    return {
        name: (None if v is None else round(v * 1e3, 2))
        for name, v in (("p50", pct(ok, 50)), ("p99", pct(ok, 99)), ("max", max(ok, default=None)))
    }


def figures(
    calls: list[Call],
    providers: list[str],
    roll: tuple[float, float],
    cfg: RollConfig,
    passes: list[float] | None = None,
) -> dict[str, Any]:
    """``passes``: the start time of each pass over the replicas (a call counts in the pass it started in)."""
    lo, hi = roll
    during = [c for c in calls if lo <= c.start <= hi]
    out: dict[str, Any] = {"calls_made": len(calls), "calls_during_roll": len(during)}
    for kind in ("idempotent", "non_idempotent"):
        out[kind] = _failures([c for c in calls if c.kind == kind])
    callers = sorted({c.caller for c in calls})
    out["by_caller"] = {
        who: {
            **_failures([c for c in calls if c.caller == who and c.kind == "idempotent"]),
            "latency_ms": _latency([c for c in during if c.caller == who and c.kind == "idempotent"]),
        }
        for who in callers
    }
    out["latency_ms"] = _latency([c for c in during if c.kind == "idempotent"])
    if passes:
        bounds = [*passes[1:], float("inf")]
        out["failed_per_roll"] = [
            sum(1 for c in calls if c.error and c.kind == "idempotent" and start <= c.start < end)
            for start, end in zip(passes, bounds, strict=True)
        ]
        out["failed_per_roll"][0] += sum(1 for c in calls if c.error and c.kind == "idempotent" and c.start < passes[0])
    gaps = {}
    for provider in providers:
        ends = [
            c.end
            for c in calls
            if c.provider == provider and c.kind == "idempotent" and not c.error and c.caller == "sdk"
        ]
        gaps[provider] = round(longest_gap(ends, lo, hi), 3)
    out["unreachable_s"] = gaps
    out["unreachable_max_s"] = max(gaps.values())
    out["baseline_gap_s"] = round(len(providers) / cfg.rate, 3)
    return out


# --------------------------------------------------------------------------- the scenario


def _owners(redis: Any) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in redis.hgetall("sb:owner").items()}


async def _reaped(urls: list[str]) -> float:
    total = 0.0
    async with httpx.AsyncClient(timeout=2) as http:
        for url in urls:
            with contextlib.suppress(httpx.HTTPError):
                for line in (await http.get(f"{url}/metrics")).text.splitlines():
                    if line.startswith("switchboard_reaped_clients_total"):
                        total += float(line.split()[-1])
    return total


async def _bounded(check: Any, timeout: float, interval: float = 0.2) -> tuple[bool, float]:
    """Poll ``check`` (async, returns bool) until true or ``timeout``; (ok, seconds waited)."""
    started = time.monotonic()
    while True:
        with contextlib.suppress(Exception):
            if await check():
                return True, time.monotonic() - started
        if time.monotonic() - started >= timeout:
            return False, time.monotonic() - started
        await asyncio.sleep(interval)


TRANSIT_LOG = re.compile(r"back after ([0-9.]+) s in transit")


def transit_times(replicas: Replicas) -> list[float]:
    """How long each client was in transit, as the replica it came back to logged it (sorted)."""
    return sorted(
        float(m.group(1))
        for r in replicas.past + replicas.current
        for m in TRANSIT_LOG.finditer(r.log_tail(50_000_000))
    )


def distribution(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), **{f"p{q}": pct(values, q) for q in (50, 90, 99)}, "max": max(values, default=None)}


async def run_roll(cfg: RollConfig, *, valkey: ValkeyServer | None = None, log: Any = print) -> dict[str, Any]:
    """Run one roll and return its figures (see the module docstring)."""
    own_valkey = valkey is None
    if valkey is None:
        valkey = ValkeyServer().start()
    redis = valkey.client()
    args = (FAST_REAPER if cfg.signal == "kill" else []) + list(cfg.replica_args)
    replicas = Replicas(valkey.url, cfg.replicas, args)
    clients: list[Any] = []
    conns: dict[str, Conn] = {}
    balancer: Balancer | None = None
    try:
        await asyncio.to_thread(replicas.start_all, cfg.ready_timeout)
        urls = replicas.urls

        joined: dict[str, Any] = {}  # every client joins the first provider's workspace

        async def sdk(client_id: str, url_list: list[str], **kw: Any) -> Any:
            conns[client_id] = Conn()
            client = await connect(
                url_list,
                client_id=client_id,
                on_event=conns[client_id].on_event,
                method_timeout=cfg.call_timeout,
                **joined,
                **kw,
            )
            clients.append(client)
            return client

        providers: dict[str, Any] = {}
        for k in range(cfg.replicas * cfg.clients_per_replica):
            pid = f"prov-{k}"
            providers[pid] = await sdk(pid, rotated(urls, k))
            await providers[pid].register_service(provider_service(pid))
            if not joined:
                joined.update(workspace=providers[pid].workspace, token=await providers[pid].generate_token())
        placement = {pid: replicas.index_of(c.url) for pid, c in providers.items()}
        stranded: dict[int, Any] = {}
        if cfg.signal == "kill" and cfg.stranded:
            for i in range(cfg.replicas):
                stranded[i] = await sdk(f"stranded-{i}", [urls[i]])
                await stranded[i].register_service(provider_service(f"stranded-{i}"))
        caller = await sdk("roll-caller", urls)
        departures: list[Any] = []  # client_disconnected / service_removed the caller was told of
        for kind in ("client_disconnected", "service_removed"):
            caller.on(kind, lambda event, kind=kind: departures.append((kind, event)))
        await caller.subscribe(["client_disconnected", "service_removed"])
        ids = {pid: f"{p.config['workspace']}/{pid}:{SERVICE}" for pid, p in providers.items()}
        services = {"sdk": {pid: await caller.get_service(sid) for pid, sid in ids.items()}}
        if cfg.hypha_caller:
            from hypha_rpc import connect_to_server

            # the newest replica: the plain caller's connection then lives two steps, and with a
            # pause of 2 s more than hypha-rpc's 5 s flap window (a shorter-lived one backs off)
            balancer = await Balancer(replicas.ports, prefer_newest=True).start()
            plain = await connect_to_server(
                {"server_url": balancer.url, "client_id": "roll-hypha", "method_timeout": cfg.call_timeout, **joined}
            )
            clients.append(plain)
            services["hypha"] = {pid: await plain.get_service(sid) for pid, sid in ids.items()}
        log(
            f"[{cfg.signal}] {len(providers)} providers on replicas {sorted(placement.values())}, "
            f"caller on r{replicas.index_of(caller.url)}, {cfg.rate:g} idempotent "
            f"{'calls/s from the SDK and from hypha-rpc' if cfg.hypha_caller else 'calls/s'} + "
            f"{cfg.non_idempotent_rate:g} non-idempotent calls/s, {cfg.rolls} roll(s)"
        )

        load = Load(services, cfg)
        running = asyncio.create_task(load.run())
        await asyncio.sleep(cfg.warmup)
        steps = []
        passes: list[float] = []
        roll_start = time.monotonic()
        for n in range(cfg.rolls):
            passes.append(time.monotonic())
            for i in range(cfg.replicas):
                if balancer is not None:
                    balancer.take_out(replicas.ports[i])
                step = await asyncio.to_thread(replicas.stop, i, cfg.signal, cfg.exit_timeout)
                if i in stranded and n == 0:  # never comes back: only the reaper can remove its registrations
                    await stranded[i].disconnect()
                step.update(await asyncio.to_thread(replicas.start_again, i, cfg.ready_timeout))
                if balancer is not None:
                    balancer.put_back(replicas.ports[i])
                step["roll"] = n
                steps.append(step)
                failed = sum(1 for c in load.calls if c.error and c.kind == "idempotent" and c.start >= passes[-1])
                log(
                    f"  {step['replica']}: exit {step['exit_code']} after {step['exit_s']:.2f} s, "
                    f"{step['new_replica']} ready after {step['ready_s']:.2f} s"
                    + (f" (roll {n + 1}: {failed} failed so far)" if cfg.rolls > 1 else "")
                )
                if i < cfg.replicas - 1 or n < cfg.rolls - 1:
                    await asyncio.sleep(max(cfg.pause, cfg.step - (time.monotonic() - step["signalled_at"])))
        roll_end = time.monotonic()
        await asyncio.sleep(cfg.settle)
        await load.finish()
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        result = figures(load.calls, sorted(providers), (roll_start, roll_end + cfg.settle), cfg, passes)
        result.update(config=asdict(cfg), roll_seconds=round(roll_end - roll_start, 2), steps=steps)
        result["departures_seen"] = [
            (kind, str(event)[:200]) for kind, event in departures if any(pid in str(event) for pid in providers)
        ]

        offline = {
            cid: [round(x, 3) for x in conn.offline()] for cid, conn in conns.items() if not cid.startswith("stranded")
        }
        result["sdk_offline_s"] = offline
        result["sdk_offline_max_s"] = max((max(v) for v in offline.values() if v), default=0.0)
        result["drop_codes"] = sorted(
            {code for cid, c in conns.items() if not cid.startswith("stranded") for _, _, code in c.disconnects}
        )
        result["gave_up"] = {cid: c.gave_up for cid, c in conns.items() if c.gave_up and not cid.startswith("stranded")}

        # every provider back and callable, seen by a fresh client
        checker = await sdk("roll-checker", urls)
        fresh = {
            pid: await checker.get_service(f"{p.config['workspace']}/{pid}:{SERVICE}") for pid, p in providers.items()
        }
        answered: set[str] = set()

        async def all_callable() -> bool:
            for pid, svc in fresh.items():
                if pid not in answered:
                    with contextlib.suppress(Exception):
                        if list(await asyncio.wait_for(svc.ping(-1), 3)) == [pid, -1]:
                            answered.add(pid)
            return len(answered) == len(fresh)

        ok, waited = await _bounded(all_callable, cfg.callable_timeout)
        result["all_callable"] = ok
        result["not_callable"] = sorted(set(fresh) - answered)
        result["callable_wait_s"] = round(waited, 2)

        # registrations: every owner is a live incarnation, every provider is registered
        provider_keys = {f"{p.config['workspace']}/{pid}" for pid, p in providers.items()}

        async def owners_clean() -> bool:
            owners = await asyncio.to_thread(_owners, redis)
            return set(owners.values()) <= replicas.live_ids() and provider_keys <= set(owners)

        since_last = time.monotonic() - roll_end
        ok, waited = await _bounded(owners_clean, cfg.cleanup_timeout if cfg.signal == "kill" else 5.0)
        owners = await asyncio.to_thread(_owners, redis)
        live = replicas.live_ids()
        result["owners_clean"] = ok
        result["owners_clean_after_roll_s"] = round(since_last + waited, 2)
        result["stale_owners"] = {k: v for k, v in owners.items() if v not in live}
        result["unregistered_providers"] = sorted(provider_keys - set(owners))
        result["stranded_left"] = sorted(k for k in owners if k.split("/")[-1].startswith("stranded"))
        result["reaped_clients"] = await _reaped(urls)
        result["placement"] = {pid: f"r{i}" for pid, i in placement.items()}
        result["transit_s"] = transit_times(replicas)
        if cfg.keep_logs:  # for diagnosis: logs, and every call and SDK event relative to the roll's start
            result["replica_logs"] = {r.replica_id: r.log_tail(cfg.keep_logs) for r in replicas.past + replicas.current}
            result["raw_calls"] = [
                (c.kind, c.provider, round(c.start - roll_start, 3), round(c.end - roll_start, 3), c.error)
                for c in load.calls
            ]
            result["raw_events"] = {
                cid: {
                    "down": [(round(t - roll_start, 3), u, code) for t, u, code in c.disconnects],
                    "up": [(round(t - roll_start, 3), u) for t, u, *_ in c.reconnects],
                }
                for cid, c in conns.items()
            }
            result["roll_start"] = roll_start
        return result
    finally:
        for client in reversed(clients):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.disconnect(), 5)
        if balancer is not None:
            await balancer.stop()
        await asyncio.to_thread(replicas.kill_all)
        with contextlib.suppress(Exception):
            redis.close()
        if own_valkey:
            valkey.stop()


def report(name: str, r: dict[str, Any]) -> str:
    idem, non = r["idempotent"], r["non_idempotent"]
    lat = r["latency_ms"]
    rolls = r["config"]["rolls"]
    lines = [
        f"{name}: {rolls} roll(s), {len(r['steps'])} replica restarts in {r['roll_seconds']:.1f} s",
        f"  calls made           {r['calls_made']} ({r['calls_during_roll']} during the roll)",
        f"  failed idempotent    {idem['failed']} of {idem['calls']}",
        f"  failed non-idemp.    {non['failed']} of {non['calls']}",
        f"  latency during roll  p50 {lat['p50']} ms, p99 {lat['p99']} ms, max {lat['max']} ms",
        f"  unreachable (max)    {r['unreachable_max_s']:.3f} s per client "
        f"(caller-observed; load spacing {r['baseline_gap_s']:.3f} s included)",
        f"  SDK offline (max)    {r['sdk_offline_max_s']:.3f} s, drop codes {r['drop_codes']}",
        "  exit after signal    "
        + (
            ", ".join(f"{s['replica']} {s['exit_s']:.2f} s (code {s['exit_code']})" for s in r["steps"])
            if rolls == 1
            else f"max {max(s['exit_s'] for s in r['steps']):.2f} s, codes "
            f"{sorted({s['exit_code'] for s in r['steps']})}"
        ),
        f"  all callable at end  {r['all_callable']} (waited {r['callable_wait_s']} s)",
        f"  owners clean         {r['owners_clean']} ({r['owners_clean_after_roll_s']} s after the roll; "
        f"reaped {r['reaped_clients']:g}; stale {r['stale_owners'] or 'none'})",
    ]
    for who, fig in r["by_caller"].items():
        lines.append(
            f"  {who + ' caller':<20} {fig['failed']} of {fig['calls']} idempotent calls failed; "
            f"latency p50 {fig['latency_ms']['p50']} ms, p99 {fig['latency_ms']['p99']} ms, "
            f"max {fig['latency_ms']['max']} ms"
        )
    if "failed_per_roll" in r and rolls > 1:
        per = r["failed_per_roll"]
        lines.append(f"  failed per roll      {per} (mean {sum(per) / len(per):.2f})")
    if "departures_seen" in r:
        lines.append(
            f"  departures announced {len(r['departures_seen'])} (client_disconnected/service_removed "
            f"of a provider, seen by the caller)"
        )
    transit = distribution(r.get("transit_s", []))
    if transit["n"]:
        lines.append(
            f"  hub: in transit      n={transit['n']} p50 {transit['p50']:.3f} s, p90 {transit['p90']:.3f} s, "
            f"p99 {transit['p99']:.3f} s, max {transit['max']:.3f} s"
        )
    offline = distribution(sorted(x for v in r["sdk_offline_s"].values() for x in v))
    if offline["n"]:
        lines.append(
            f"  SDK: drop to ready   n={offline['n']} p50 {offline['p50']:.3f} s, p90 {offline['p90']:.3f} s, "
            f"p99 {offline['p99']:.3f} s, max {offline['max']:.3f} s"
        )
    for kind in ("idempotent", "non_idempotent"):
        for err, n in r[kind]["errors"].items():
            lines.append(f"    {kind} x{n}: {err}")
    if r["gave_up"]:
        lines.append(f"  gave up: {r['gave_up']}")
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--signal", choices=["term", "kill", "both"], default="term")
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--clients-per-replica", type=int, default=2)
    parser.add_argument("--non-idempotent-rate", type=float, default=5.0)
    parser.add_argument("--pause", type=float, default=2.0)
    parser.add_argument("--rolls", type=int, default=1, help="passes over the replicas")
    parser.add_argument("--hypha-caller", action="store_true", help="also an unmodified hypha-rpc caller")
    parser.add_argument("--verbose", action="store_true", help="SDK INFO logs (connection events)")
    parser.add_argument("replica_args", nargs="*", help="after --: extra `switchboard serve` flags")
    args = parser.parse_args()
    if args.verbose:
        logging.getLogger("switchboard.client").setLevel(logging.INFO)
        logging.getLogger("switchboard.client").addHandler(logging.StreamHandler())
    results: dict[str, Any] = {}
    for sig in ["term", "kill"] if args.signal == "both" else [args.signal]:
        cfg = RollConfig(
            signal=sig,
            rate=args.rate,
            clients_per_replica=args.clients_per_replica,
            non_idempotent_rate=args.non_idempotent_rate,
            pause=args.pause,
            rolls=args.rolls,
            hypha_caller=args.hypha_caller,
            replica_args=tuple(args.replica_args),
        )
        results[sig] = await run_roll(cfg)
        print(report("SIGTERM roll" if sig == "term" else "SIGKILL roll", results[sig]), flush=True)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    root = logging.getLogger()
    root.handlers[:] = [logging.NullHandler()]  # hypha-rpc configures the root logger on import
    asyncio.run(main())

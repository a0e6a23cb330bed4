"""SIGKILL the replica under a client; time until the client's service is callable again.

Two scenarios, each for the Switchboard SDK and for the unmodified hypha-rpc
client (``connect_to_server``), in the same run:

* restart:  one replica, SIGKILLed and restarted on the same URL after ``--downtime`` s;
* failover: two replicas sharing a Valkey; the client's replica is SIGKILLed (and
  restarted after ``--downtime`` s, so that the single-URL hypha-rpc client
  gets back at all). The SDK is given both URLs; hypha-rpc takes one.

"Callable again" is seen by a neutral observer polling the service over HTTP
every 20 ms (through the restarted replica, or through the sibling).
Attempts are the client's dials from the kill to recovery.

    python bench/failover.py [--runs 3] [--downtime 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from hypha_rpc import connect_to_server

from switchboard.client import Reconnected, connect
from switchboard.testing import ValkeyServer
from switchboard.testing.replica import ReplicaProcess

POLL = 0.02
GIVE_UP = 60.0
HYPHA_LOG = logging.getLogger("websocket-client")


@dataclass
class Run:
    seconds: float | None  # None: not callable within GIVE_UP
    attempts: int


class HyphaAttempts(logging.Handler):
    """hypha-rpc logs one warning per reconnect attempt: count them."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Reconnecting to"):
            self.count += 1


async def sdk_client(urls: list[str], client_id: str) -> tuple[Any, Callable[[], int]]:
    attempts: list[int] = []
    client = await connect(
        urls,
        client_id=client_id,
        on_event=lambda e: attempts.append(e.attempts) if isinstance(e, Reconnected) else None,
    )
    return client, lambda: attempts[-1] if attempts else 0


async def hypha_client(urls: list[str], client_id: str) -> tuple[Any, Callable[[], int]]:
    for handler in list(HYPHA_LOG.handlers):
        if isinstance(handler, HyphaAttempts):
            HYPHA_LOG.removeHandler(handler)  # the previous run's
    counter = HyphaAttempts()
    HYPHA_LOG.addHandler(counter)
    client = await connect_to_server({"server_url": urls[0], "client_id": client_id})
    return client, lambda: counter.count


async def callable_at(observer: str, path: str, deadline: float) -> float | None:
    async with httpx.AsyncClient(timeout=1.0) as http:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                response = await http.get(f"{observer}/{path}")
                if response.status_code == 200 and response.json() == "alive":
                    return time.monotonic()
            await asyncio.sleep(POLL)
    return None


async def one_run(kind: str, scenario: str, downtime: float, n: int, valkey: ValkeyServer | None) -> Run:
    redis = {"redis_url": valkey.url} if valkey else {}
    a = ReplicaProcess(replica_id=f"{scenario}-a{n}", **redis)
    replicas = [a] + ([ReplicaProcess(replica_id=f"{scenario}-b{n}", **redis)] if valkey else [])
    for replica in replicas:
        await asyncio.to_thread(replica.start)
    client = None
    try:
        urls = [r.url for r in replicas]
        make = sdk_client if kind == "switchboard" else hypha_client
        client, attempts = await make(urls, f"{kind}-{scenario}-{n}")
        await client.register_service({"id": "s", "config": {"visibility": "public"}, "f": lambda: "alive"})
        ws = client.config["workspace"]
        path = f"{ws}/services/{kind}-{scenario}-{n}:s/f"
        observer = replicas[-1].url
        assert await callable_at(observer, path, time.monotonic() + 10), "not callable before the kill"

        killed = time.monotonic()
        await asyncio.to_thread(a.kill)

        async def restart() -> None:
            await asyncio.sleep(max(0.0, killed + downtime - time.monotonic()))
            await asyncio.to_thread(a.start)

        restarting = asyncio.create_task(restart())
        back = await callable_at(observer, path, killed + GIVE_UP)
        await restarting
        return Run(None if back is None else back - killed, attempts())
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.disconnect(), 5)
        for replica in replicas:
            await asyncio.to_thread(replica.kill)


def fmt(runs: list[Run]) -> tuple[str, float | None]:
    times = [r.seconds for r in runs if r.seconds is not None]
    if len(times) < len(runs):
        return f"not within {GIVE_UP:.0f} s in {len(runs) - len(times)} of {len(runs)} runs", None
    median = statistics.median(times)
    spread = f" ({min(times):.2f}-{max(times):.2f})" if len(times) > 1 else ""
    tries = statistics.median(r.attempts for r in runs)
    return f"{median:6.2f} s{spread:<16} attempts {tries:g}", median


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--downtime", type=float, default=5.0)
    args = parser.parse_args()
    results: dict[tuple[str, str], float | None] = {}
    print(f"SIGKILL -> service callable again (median of {args.runs} runs, min-max), downtime {args.downtime:g} s")
    with ValkeyServer() as valkey:
        for scenario, label in (("restart", "same URL restarted"), ("failover", "failover to a sibling")):
            for kind in ("switchboard", "hypha-rpc"):
                runs = [
                    await one_run(kind, scenario, args.downtime, n, valkey if scenario == "failover" else None)
                    for n in range(args.runs)
                ]
                text, results[scenario, kind] = fmt(runs)
                print(f"  {label:<22} {kind:<12} {text}", flush=True)
    for scenario in ("restart", "failover"):
        ours, theirs = results[scenario, "switchboard"], results[scenario, "hypha-rpc"]
        if ours and theirs:
            print(f"  {scenario}: hypha-rpc / switchboard = {theirs / ours:.1f}x")


if __name__ == "__main__":
    root = logging.getLogger()
    root.handlers[:] = [logging.NullHandler()]  # hypha-rpc configures the root logger on import
    HYPHA_LOG.setLevel(logging.WARNING)  # its attempt lines, for counting
    asyncio.run(main())

#!/usr/bin/env python
"""A balanced handle against a direct one: what choosing the instance per call costs.

    .venv/bin/python bench/balanced.py [--blocks N] [--block-size N]

Two replicas sharing one Valkey; one provider of ``echo`` on replica A, one
caller on replica B holding two handles on it: a direct one
(``get_service("provider:bench")``) and a balanced one
(``get_service("bench", {"mode": "balance:round_robin"})``). Sequential 32 B
echo calls, alternating between the handles in blocks (as ``ab.py`` does
with revisions) so that foreign load on a shared machine hits both alike;
p50/p90 of each and the ratio balanced / direct (issue 41 asks at most 1.05).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import pct, say  # noqa: E402

PAYLOAD = b"x" * 32
WARM_UP = 3.0  # seconds: more than one upkeep round (2 s), in which the replicas learn what each reads


async def block(echo: Any, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        if await asyncio.wait_for(echo(PAYLOAD), 10) != PAYLOAD:
            raise RuntimeError("wrong echo result")
        out.append(time.perf_counter() - t)
    return out


async def run(args: argparse.Namespace) -> None:
    from hypha_rpc import connect_to_server

    from switchboard.testing import ValkeyServer
    from switchboard.testing.replica import ReplicaProcess

    with ValkeyServer() as valkey:
        a = ReplicaProcess(replica_id="bench-a", redis_url=valkey.url, args=["--log-level", "WARNING"]).start()
        b = ReplicaProcess(replica_id="bench-b", redis_url=valkey.url, args=["--log-level", "WARNING"]).start()
        clients: list[Any] = []
        try:
            provider = await connect_to_server({"server_url": a.url, "client_id": "provider"})
            clients.append(provider)
            await provider.register_service({"id": "bench", "echo": lambda data: data})
            token = await provider.generate_token()
            caller = await connect_to_server({"server_url": b.url, "client_id": "caller", "token": token})
            clients.append(caller)
            handles = {
                "direct": (await caller.get_service("provider:bench")).echo,
                "balanced": (await caller.get_service("bench", {"mode": "balance:round_robin"})).echo,
            }
            # warm-up: routes learnt, links dialled, and each replica's wire version read from the
            # other's presence record (one upkeep round, 2 s): until then a balanced call crossing
            # replicas goes through Redis, marked, as to a replica that may not read it over a link
            warm_until = time.monotonic() + WARM_UP
            while time.monotonic() < warm_until:
                for echo in handles.values():
                    await block(echo, 100)
            samples: dict[str, list[float]] = {name: [] for name in handles}
            ratios = []
            names = list(handles)
            for i in range(args.blocks):
                got = {}
                for name in names if i % 2 == 0 else names[::-1]:
                    got[name] = await block(handles[name], args.block_size)
                    samples[name] += got[name]
                ratios.append(statistics.median(got["balanced"]) / statistics.median(got["direct"]))
            for name, values in samples.items():
                values.sort()
                say(
                    f"{name:>8}: p50 {pct(values, 50) * 1e3:.3f} ms  p90 {pct(values, 90) * 1e3:.3f} ms  ({len(values)})"
                )
            bal, direct = samples["balanced"], samples["direct"]
            say(
                f"balanced/direct p50 x{pct(bal, 50) / pct(direct, 50):.3f}, p90 x{pct(bal, 90) / pct(direct, 90):.3f}; "
                f"median of {len(ratios)} block ratios x{statistics.median(ratios):.3f}"
                f" (range {min(ratios):.3f}-{max(ratios):.3f})"
            )
        finally:
            for client in clients:
                await client.disconnect()
            a.kill()
            b.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--block-size", type=int, default=200)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()

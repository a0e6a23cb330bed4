"""A replica cut off from Redis, with the control plane busy beside its calls: issue 40's drill, timed.

Two replicas on one Valkey, each through a fault proxy of its own. Providers on
replica A: an unmodified hypha-rpc client and an SDK client. Callers at 20
calls/s each, open loop: a hypha-rpc client and an SDK client on A (calls
between two clients of A), the same on B (over the direct link). Beside them,
on A and on B, every second: ``get_service`` and ``list_services`` from a
connected hypha-rpc client, an HTTP call of the provider's function through
``/{ws}/services/...``; every 3 s a new hypha-rpc connection and a new SDK
connection that call once. Then, in turn:

* ``blackhole``: A's path to Valkey drops bytes and FINs for ``--cut`` s (sockets stay open);
* ``restart``: Valkey is killed, and restarted empty after ``--cut`` s.

For each series it prints the number of requests, failures, median and maximum,
before, during and after the fault, and the failures that came more than 1 s
after Redis answered again. Nothing else may run on the machine for figures
worth comparing (the 2-core machine these were measured on was shared).

    .venv/bin/python bench/redis_cut.py [--cut 10] [--before 5] [--after 5] [--only blackhole|restart]

History (issue 40): before, a cut replica's calls took a 2 s median, lookups 2 s, new clients of the
sibling up to 8 s, and list_services failed for 2 s after Valkey restarted empty.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from typing import Any

import httpx
import shortuuid
from hypha_rpc import connect_to_server

from switchboard.client import connect
from switchboard.testing import ThreadedFaultProxy, ValkeyServer
from switchboard.testing.cut_drill import Drill
from switchboard.testing.replica import ReplicaProcess

PHASES = [("before", "start", "cut"), ("during", "cut", "healed"), ("after", "healed", "end")]


async def traffic(drill: Drill, a: ReplicaProcess, b: ReplicaProcess, made: list[Any]) -> None:
    """The drill's clients, and every series running (see the module docstring)."""

    async def hypha(url: str, client_id: str, token: str | None = None) -> Any:
        client = await connect_to_server(
            {"server_url": url, "client_id": client_id, "token": token, "method_timeout": 30}
        )
        made.append(client)
        return client

    provider = await hypha(a.url, "prov")
    ws = provider.config["workspace"]
    await provider.register_service({"id": "s", "config": {"visibility": "public"}, "f": lambda: "ok"})
    token = await provider.generate_token()
    sdk_provider = await connect(a.url, token=token, client_id="sdkprov")
    made.append(sdk_provider)
    await sdk_provider.register_service({"id": "s", "config": {"visibility": "public"}, "f": lambda: "ok"})
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"})
    made.append(http)

    for name, replica in (("A", a), ("B", b)):
        caller = await hypha(replica.url, f"caller{name}", token)
        sdk = await connect(replica.url, token=token, client_id=f"sdk{name}")
        made.append(sdk)
        svc = await caller.get_service(f"{ws}/prov:s")
        sdk_svc = await sdk.get_service(f"{ws}/sdkprov:s")
        for _ in range(3):
            await svc.f()
            await sdk_svc.f()

        def ok(call: Any) -> Any:
            async def checked() -> None:
                assert await call() == "ok"

            return checked

        async def lookup(caller: Any = caller) -> None:
            await caller.get_service(f"{ws}/prov:s")

        async def listing(caller: Any = caller) -> None:
            await caller.list_services()

        async def http_call(url: str = replica.url) -> None:
            response = await http.get(f"{url}/{ws}/services/prov:s/f", timeout=60)
            assert response.status_code == 200, f"HTTP {response.status_code}: {response.text[:160]}"

        async def new_hypha(url: str = replica.url) -> None:
            fresh = await connect_to_server({"server_url": url, "token": token, "method_timeout": 30})
            try:
                assert await (await fresh.get_service(f"{ws}/prov:s")).f() == "ok"
            finally:
                await fresh.disconnect()

        async def new_sdk(url: str = replica.url) -> None:
            async with await connect(url, token=token, client_id=shortuuid.uuid(), max_wait=0.5) as fresh:
                assert await (await fresh.get_service(f"{ws}/sdkprov:s")).f() == "ok"

        drill.run(f"{name} hypha-rpc call", ok(svc.f), every=0.05)
        drill.run(f"{name} SDK call", ok(sdk_svc.f), every=0.05)
        drill.run(f"{name} get_service", lookup, every=1)
        drill.run(f"{name} list_services", listing, every=1)
        drill.run(f"{name} HTTP call", http_call, every=1)
        drill.run(f"{name} new hypha-rpc", new_hypha, every=3)
        drill.run(f"{name} new SDK", new_sdk, every=3)


async def close_all(made: list[Any]) -> None:
    for thing in reversed(made):
        with contextlib.suppress(Exception):
            await asyncio.wait_for(thing.aclose() if isinstance(thing, httpx.AsyncClient) else thing.disconnect(), 5)


def late_failures(drill: Drill) -> list[str]:
    healed = drill.marks["healed"]
    lines = []
    for series in drill.series.values():
        late = [s for s in series.between(healed + 1.0, drill.now()) if s.error]
        if late:
            lines.append(f"{series.name}: {len(late)} failed >1 s after Redis was back, e.g. {late[0].error}")
    return lines


async def scenario(kind: str, args: argparse.Namespace) -> None:
    with (
        ValkeyServer() as valkey,
        ThreadedFaultProxy("127.0.0.1", valkey.port) as path_a,
        ThreadedFaultProxy("127.0.0.1", valkey.port) as path_b,
    ):
        a = ReplicaProcess(replica_id="ra", redis_url=path_a.url_for_redis()).start()
        b = ReplicaProcess(replica_id="rb", redis_url=path_b.url_for_redis()).start()
        made: list[Any] = []
        try:
            drill = Drill(timeout=30, limit=args.before + args.cut + args.after + 30)
            await traffic(drill, a, b, made)
            await drill.keep_on(args.before)
            drill.mark("cut")
            if kind == "blackhole":
                path_a.blackhole()
            else:
                valkey.kill()
            await drill.keep_on(args.cut)
            if kind == "blackhole":
                path_a.pass_through()
            else:
                await asyncio.to_thread(valkey.restart)
            drill.mark("healed")
            await drill.keep_on(args.after)
            await drill.stop()
            print(f"\n== {kind}: Redis away {args.cut:g} s (ms; A's clients and B's)")
            print(drill.report(PHASES))
            print("\n".join(late_failures(drill)) or "nothing failed more than 1 s after Redis was back")
        finally:
            await close_all(made)
            a.kill()
            b.kill()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cut", type=float, default=10.0, help="seconds Redis is away (default 10)")
    parser.add_argument("--before", type=float, default=5.0)
    parser.add_argument("--after", type=float, default=5.0)
    parser.add_argument("--only", choices=("blackhole", "restart"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    for kind in ("blackhole", "restart"):
        if args.only in (None, kind):
            await scenario(kind, args)


if __name__ == "__main__":
    asyncio.run(main())

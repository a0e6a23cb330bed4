"""Two replica processes on a real 3-master Valkey Cluster behave as one hub (links off: all traffic
between them crosses the cluster's sharded pub/sub)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from typing import Any

import httpx
import pytest
from redis.crc import key_slot

from support.on_cluster import OnCluster, Traffic, channel_of
from switchboard.testing.replica import ReplicaProcess
from switchboard.testing.wait import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


async def provider_and_caller(on_cluster: OnCluster, clients: Any) -> tuple[ReplicaProcess, ReplicaProcess, Any, Any]:
    a = on_cluster.start("ra")
    b = on_cluster.start("rb", url=on_cluster.cluster.seeds_url)  # several seeds, comma-separated
    provider = await clients(a.url, client_id="prov")
    await provider.register_service({"id": "svc", "add": lambda x: x + 1})
    token = await provider.generate_token()
    caller = await clients(b.url, client_id="caller", token=token)
    return a, b, provider, caller


async def test_two_replicas_on_a_cluster_call_across_emit_events_and_drain(on_cluster, clients, valkey_cluster):
    a, b, provider, caller = await provider_and_caller(on_cluster, clients)
    ws = provider.config["workspace"]
    svc = await caller.get_service("prov:svc")
    assert [await svc.add(i) for i in range(20)] == list(range(1, 21))
    assert f"{ws}/prov:svc" in {s["id"] for s in await caller.list_services()}
    got: list[Any] = []
    caller.on("news", got.append)
    await caller.subscribe(["news"])
    await provider.emit({"type": "news", "to": "*", "data": {"n": 1}})
    await eventually(lambda: got, timeout=5, what="the event on B")
    # pub/sub is sharded: each master holds only the channels of its slots
    per_master = {}
    for port in valkey_cluster.masters_ports():
        with valkey_cluster.client(port) as node:
            per_master[port] = {c.decode() for c in node.execute_command("PUBSUB", "SHARDCHANNELS")}
    owner = valkey_cluster.master_of(key_slot(channel_of(ws, "prov").encode()))
    assert channel_of(ws, "prov") in per_master[owner]
    assert all(channel_of(ws, "prov") not in chans for port, chans in per_master.items() if port != owner)
    # a SIGTERM drains B: exit 0, its presence gone, A's kept
    assert b.terminate() == 0
    with valkey_cluster.client(valkey_cluster.master_of(key_slot(b"sb"))) as node:
        assert not node.exists("{sb}:presence:rb")
        assert node.exists("{sb}:presence:ra")


async def test_status_and_metrics_show_every_shard(on_cluster, clients, valkey_cluster):
    a = on_cluster.start("ra")
    async with httpx.AsyncClient() as http:
        metrics = (await http.get(f"{a.url}/metrics", timeout=5)).text
    for port in valkey_cluster.masters_ports():
        assert f'switchboard_shard_healthy{{master="127.0.0.1:{port}",replica="ra"}} 1.0' in metrics

    def status() -> str:
        cmd = [sys.executable, "-m", "switchboard", "status", "--redis-url", valkey_cluster.url]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True)
        return done.stdout

    output = await eventually(lambda: asyncio.to_thread(status), timeout=10, what="switchboard status")
    lines = output.splitlines()
    assert any(line.startswith("ra ") for line in lines), output
    for port in valkey_cluster.masters_ports():
        row = next(line for line in lines if line.startswith(f"127.0.0.1:{port} "))
        assert row.endswith("1/1 replicas subscribed"), output
    assert "3 shards; 16384 of 16384 slots covered" in output


async def test_a_moved_slot_takes_its_channel_along_within_a_second(on_cluster, clients, valkey_cluster, traffic_stops):
    a, b, provider, caller = await provider_and_caller(on_cluster, clients)
    ws = provider.config["workspace"]
    traffic = Traffic(await caller.get_service("prov:svc")).start()
    traffic_stops.append(traffic)
    await eventually(lambda: len(traffic.ok) >= 5, timeout=10, what="calls flowing")
    loop = asyncio.get_running_loop()
    for trial in range(2):  # there and on again
        slot = key_slot(channel_of(ws, "prov").encode())
        source = valkey_cluster.master_of(slot)
        target = next(p for p in valkey_cluster.masters_ports() if p != source)
        await asyncio.to_thread(valkey_cluster.move_slot, slot, target)
        moved = loop.time()
        after = await eventually(
            lambda at=moved: traffic.ok_after(at + 0.05), timeout=5, what=f"a call after move {trial}"
        )
        took = after - moved
        assert took < 1.0, (
            f"calls resumed {took:.2f}s after the slot moved; {traffic.failed[-3:]}\n{a.log_tail(3000)}\n{b.log_tail(3000)}"
        )
    recent = [f for t, f in traffic.failed if t > moved + 1.0]
    assert not recent, recent


async def test_a_cluster_restarted_empty_gets_every_registration_back(on_cluster, clients, valkey_cluster):
    a, b, provider, caller = await provider_and_caller(on_cluster, clients)
    svc = await caller.get_service("prov:svc")
    assert await svc.add(1) == 2
    await asyncio.to_thread(valkey_cluster.restart_empty)

    async def found() -> bool:
        with contextlib.suppress(Exception):
            again = await asyncio.wait_for(caller.get_service("prov:svc"), 3)
            return bool(await asyncio.wait_for(again.add(2), 3) == 3)
        return False

    await eventually(found, timeout=20, what="the provider's registration re-asserted and callable from B")

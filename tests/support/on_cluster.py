"""Replica processes and call traffic on a real Valkey Cluster (tests/cluster's cluster tests)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from switchboard.testing.replica import ReplicaProcess
from switchboard.testing.valkey_cluster import ValkeyCluster


class OnCluster:
    """Replica processes on the module's cluster, links off; all killed at the end."""

    def __init__(self, cluster: ValkeyCluster) -> None:
        self.cluster = cluster
        self.started: list[ReplicaProcess] = []

    def start(self, replica_id: str, *args: str, url: str | None = None) -> ReplicaProcess:
        replica = ReplicaProcess(replica_id=replica_id, redis_url=url or self.cluster.url, args=["--no-links", *args])
        self.started.append(replica)
        return replica.start()


@pytest.fixture
def on_cluster(valkey_cluster: ValkeyCluster) -> Iterator[OnCluster]:
    valkey_cluster.wait_ok()
    for port in valkey_cluster.masters_ports():
        with valkey_cluster.client(port) as admin:
            admin.flushall()
    group = OnCluster(valkey_cluster)
    try:
        yield group
    finally:
        for replica in group.started:
            replica.kill()


def channel_of(ws: str, client_id: str) -> str:
    return f"sb:client:{ws}/{client_id}"


class Traffic:
    """A caller on B calling a provider on A every 50 ms; when each call succeeded or failed."""

    def __init__(self, svc: Any) -> None:
        self.svc = svc
        self.ok: list[float] = []
        self.failed: list[tuple[float, str]] = []
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        for n in range(10_000):  # bounded: the test stops it long before
            if self._stopped:
                return
            try:
                assert await asyncio.wait_for(self.svc.add(n), 5) == n + 1
                self.ok.append(loop.time())
            except Exception as exc:
                self.failed.append((loop.time(), repr(exc)[:200]))
            await asyncio.sleep(0.05)

    def start(self) -> Traffic:
        self._task = asyncio.create_task(self._run())
        return self

    async def stop(self) -> None:
        """Stop calling; bounded even if a call swallows the cancel (then the loop sees the flag)."""
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._task), 10)

    def ok_after(self, t: float) -> float | None:
        return next((s for s in self.ok if s > t), None)


@pytest.fixture
async def traffic_stops() -> AsyncIterator[list[Traffic]]:
    made: list[Traffic] = []
    yield made
    for traffic in made:
        await traffic.stop()

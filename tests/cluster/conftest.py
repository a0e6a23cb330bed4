"""Fixtures for multi-replica tests: a real Valkey and real replica processes."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from support.on_cluster import on_cluster, traffic_stops  # noqa: F401  (fixtures of the Valkey Cluster tests)
from switchboard.testing import ValkeyServer
from switchboard.testing.replica import ReplicaProcess


@pytest.fixture(autouse=True)
def collected_after() -> Iterator[None]:
    """What a test here leaves to the garbage collector is collected as it ends, so that a socket
    it left open fails that test, not whichever test the collector happens to run in (twice in
    CI, 304 and then 70 client sockets, each burst to one port, failed tests that had not made them)."""
    yield
    gc.collect()


@pytest.fixture
def redis_server() -> Iterator[ValkeyServer]:
    with ValkeyServer() as server:
        yield server


class Replicas:
    """Start replica processes sharing one Valkey; stop them all at the end."""

    def __init__(self, redis: ValkeyServer) -> None:
        self.redis = redis
        self.started: list[ReplicaProcess] = []

    def start(self, replica_id: str, *args: str) -> ReplicaProcess:
        replica = ReplicaProcess(replica_id=replica_id, redis_url=self.redis.url, args=list(args))
        self.started.append(replica)
        return replica.start()

    def stop_all(self) -> None:
        for replica in self.started:
            replica.kill()


@pytest.fixture
def replicas(redis_server: ValkeyServer) -> Iterator[Replicas]:
    group = Replicas(redis_server)
    try:
        yield group
    finally:
        group.stop_all()

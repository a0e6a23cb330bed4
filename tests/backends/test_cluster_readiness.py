"""Readiness on a cluster, decided from the per-shard states alone (a table: no Redis needed).

Only what a replica cannot serve without makes it not-ready: the slot map, full coverage and the
registry's shard. Another master failing over leaves every replica ready, degraded.
"""

from __future__ import annotations

import pytest

from switchboard.backends.redis.bus.cluster_health import ShardHealth, cluster_readiness

A, B, C = ("127.0.0.1", 7000), ("127.0.0.1", 7001), ("127.0.0.1", 7002)


def shards(*down: tuple[str, int], store: tuple[str, int] = A) -> list[ShardHealth]:
    return [
        ShardHealth(m, m not in down, "pub/sub connect failed" if m in down else "ok", holds_store=m == store)
        for m in (A, B, C)
    ]


@pytest.mark.parametrize(
    ("case", "kwargs", "ready", "reason"),
    [
        ("all well", {"shards": shards()}, True, "ok"),
        ("another master failing over", {"shards": shards(B)}, True, "ok, degraded: shard 127.0.0.1:7001 down"),
        ("two other masters down", {"shards": shards(B, C)}, True, "ok, degraded"),
        ("the registry's master down", {"shards": shards(A)}, False, "registry shard 127.0.0.1:7000"),
        ("the registry's master and others", {"shards": shards(A, B)}, False, "registry shard"),
        ("no slot map yet", {"shards": [], "slot_map_read": False}, False, "slot map not read"),
        ("slots nobody serves", {"shards": shards(), "covered": 16000}, False, "covers 16000 of 16384"),
        ("registry's slot unserved", {"shards": shards(), "store_served": False}, False, "registry's shard"),
        ("no bus for the registry's master yet", {"shards": shards(store=("h", 1))}, False, "registry's shard"),
        ("channels waiting for a shard", {"shards": shards(), "unplaced": 2}, True, "ok, 2 channel(s) awaiting"),
    ],
)
def test_readiness_follows_the_registrys_shard_only(case: str, kwargs: dict, ready: bool, reason: str) -> None:
    args = {"slot_map_read": True, "store_served": True, "covered": 16384, **kwargs}
    got_ready, got_reason = cluster_readiness(**args)
    assert got_ready is ready, (case, got_reason)
    assert reason in got_reason, (case, got_reason)

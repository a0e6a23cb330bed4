"""The slot map and the decisions drawn from it, without a cluster (pure functions)."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from switchboard.backends.redis.shared.cluster_setup import detect_cluster, node_url, seed_urls
from switchboard.backends.redis.shared.topology import (
    Shard,
    SlotMap,
    channel_slot,
    moves,
    plan_shards,
    probe_channel,
    slot_map_sources,
)
from switchboard.errors import ConfigError

RAW = [
    [0, 5460, [b"127.0.0.1", 7000, b"id0"], [b"127.0.0.1", 7003, b"id3"]],
    [5461, 10922, [b"127.0.0.1", 7001, b"id1"], [b"127.0.0.1", 7004, b"id4"]],
    [10923, 16383, [b"127.0.0.1", 7002, b"id2"]],
]


def test_the_slot_map_names_each_slots_master_and_its_replicas() -> None:
    m = SlotMap.parse(RAW)
    assert m.complete
    assert m.covered == 16384
    assert m.masters == [("127.0.0.1", 7000), ("127.0.0.1", 7001), ("127.0.0.1", 7002)]
    assert [m.master_of_slot(s)[1] for s in (0, 5460, 5461, 10922, 10923, 16383)] == [
        7000,
        7000,
        7001,
        7001,
        7002,
        7002,
    ]
    assert m.shards[0].replicas == (("127.0.0.1", 7003),)
    assert m.master_of("hello") == m.master_of_slot(key_slot(b"hello"))


def test_a_map_with_a_hole_is_incomplete_and_places_nothing_there() -> None:
    m = SlotMap.parse(RAW[:2])
    assert not m.complete
    assert m.covered == 10923
    assert m.master_of_slot(16000) is None


def test_channels_move_only_when_their_master_changed() -> None:
    before = SlotMap.parse(RAW)
    slot = channel_slot("sb:client:ws/a")
    owner = before.master_of_slot(slot)
    placement = {"sb:client:ws/a": owner, "sb:new": None}
    assert [c for c, _, _ in moves(placement, before)] == ["sb:new"]
    # the channel's slot moved to the third master (a migration, or a failover's promoted replica)
    promoted = [[slot, slot, [b"127.0.0.1", 7005, b"id5"]]]
    rest = [[a, b, m] for a, b, m, *_ in RAW]
    split = []
    for a, b, master in rest:
        split += [[x, y, master] for x, y in ((a, min(b, slot - 1)), (max(a, slot + 1), b)) if x <= y]
    after = SlotMap.parse(split + promoted)
    assert after.complete
    assert moves(placement, after) == [
        ("sb:client:ws/a", owner, ("127.0.0.1", 7005)),
        ("sb:new", None, after.master_of("sb:new")),
    ]


def test_a_probe_channel_lands_on_the_master_it_probes() -> None:
    m = SlotMap.parse(RAW)
    for shard in m.shards:
        channel = probe_channel("sb:", "replica-1", shard)
        assert shard.serves(channel_slot(channel)), channel
        assert channel.startswith("sb:probe:replica-1:")


def test_seeds_are_comma_separated_and_node_urls_keep_credentials() -> None:
    assert seed_urls("redis://a:1/0, redis://b:2/0,") == ["redis://a:1/0", "redis://b:2/0"]
    assert node_url("rediss://user:pw@a:1/0", ("10.0.0.5", 7001)) == "rediss://user:pw@10.0.0.5:7001/0"
    assert node_url("redis://a:1/0", ("10.0.0.5", 7001)) == "redis://10.0.0.5:7001/0"


def test_the_cluster_setting_overrides_detection() -> None:
    nobody = "redis://127.0.0.1:1/0"  # nothing listens: an override is never asked
    assert detect_cluster(nobody, True) is True
    assert detect_cluster(nobody, False) is False
    assert detect_cluster(f"{nobody},{nobody}", None) is True  # several seeds: only a cluster
    assert detect_cluster(nobody, None) is False  # one silent seed: one instance, as before
    with pytest.raises(ConfigError, match="several"):
        detect_cluster(f"{nobody},{nobody}", False)


def test_shard_buses_follow_the_masters_and_their_probe_slots() -> None:
    m = SlotMap.parse(RAW)
    drop, start = plan_shards({}, m, "r1")
    assert drop == []
    assert sorted(start) == m.masters
    current = dict(start)
    assert plan_shards(current, m, "r1") == ([], {})  # nothing changed, nothing to do
    # 7000 failed; its replica 7003 was promoted with the same slots
    promoted = SlotMap.parse([[0, 5460, [b"127.0.0.1", 7003, b"id3"]], *RAW[1:]])
    drop, start = plan_shards(current, promoted, "r1")
    assert drop == [("127.0.0.1", 7000)]
    assert list(start) == [("127.0.0.1", 7003)]
    # the probe channel's slot of 7001 moved to 7002: 7001's bus is restarted with a probe it serves
    probe_slot = channel_slot(current[("127.0.0.1", 7001)])
    moved = SlotMap.parse(
        [
            RAW[0],
            [5461, probe_slot - 1, [b"127.0.0.1", 7001, b"id1"]],
            [probe_slot, probe_slot, [b"127.0.0.1", 7002, b"id2"]],
            [probe_slot + 1, 10922, [b"127.0.0.1", 7001, b"id1"]],
            RAW[2],
        ]
    )
    drop, start = plan_shards(current, moved, "r1")
    assert drop == [("127.0.0.1", 7001)]
    assert moved.shard(("127.0.0.1", 7001)).serves(channel_slot(start[("127.0.0.1", 7001)]))


def test_during_a_failover_the_slot_map_is_asked_of_the_dead_masters_replicas_first() -> None:
    m1, m2, r1, r2, seed = ("h", 1), ("h", 2), ("h", 11), ("h", 12), ("h", 99)
    slot_map = SlotMap((Shard(m1, (r1,), ((0, 8191),)), Shard(m2, (r2,), ((8192, 16383),))))
    assert slot_map_sources(slot_map, set(), [seed, m1]) == [m1, m2, seed]
    assert slot_map_sources(slot_map, {m2}, [seed]) == [r2, m1, m2, seed]  # r2 is promoted: it knows first
    assert slot_map_sources(None, set(), [seed]) == [seed]

"""The Valkey Cluster fixture: real nodes, formed, and the faults the cluster tests inject."""

from __future__ import annotations

from redis.crc import key_slot

from switchboard.testing.valkey_cluster import ValkeyCluster


def test_three_masters_with_a_replica_each_cover_every_slot_and_a_slot_moves_with_its_keys(
    valkey_cluster: ValkeyCluster,
) -> None:
    valkey_cluster.wait_ok()
    owners = valkey_cluster.slot_owners()
    assert len(owners) == 3
    assert sum(owners.values()) == 16384
    assert all(port <= 55535 for port in (n.port for n in valkey_cluster.nodes))
    slot = key_slot(b"fixture")
    source = valkey_cluster.master_of(slot)
    with valkey_cluster.client(source) as node:
        node.set("fixture", "kept")
    target = next(p for p in owners if p != source)
    valkey_cluster.move_slot(slot, target)
    assert valkey_cluster.master_of(slot) == target
    with valkey_cluster.client(target) as node:
        assert node.get("fixture") == b"kept"


def test_a_cluster_restarted_empty_forms_again_without_its_data(valkey_cluster: ValkeyCluster) -> None:
    slot = key_slot(b"gone")
    with valkey_cluster.client(valkey_cluster.master_of(slot)) as node:
        node.set("gone", "1")
    valkey_cluster.restart_empty()
    assert sum(valkey_cluster.slot_owners().values()) == 16384
    with valkey_cluster.client(valkey_cluster.master_of(slot)) as node:
        assert node.get("gone") is None

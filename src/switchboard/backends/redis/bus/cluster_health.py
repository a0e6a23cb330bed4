"""Whether a replica on a Redis Cluster can serve, from its per-shard states (pure: no I/O).

A master SIGKILLed takes its pub/sub down on every replica at once until its
replica is promoted (``cluster-node-timeout`` and an election: seconds). If
that made every replica not-ready, a Kubernetes Service would have no
endpoint for those seconds, although each replica still serves its own
clients (calls among them never touch Redis) and the registry. So only what
a replica cannot serve without makes it not-ready: the slot map, and the
shard holding the registry's hash-tagged keys (``{sb}``: registry, presence,
lease, counters); another shard down is a degradation, reported but ready
(messages to its channels wait in the undeliverable retry window meanwhile).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from switchboard.backends.redis.shared.topology import Address, address_text


@dataclass(frozen=True, slots=True)
class ShardHealth:
    """One master's pub/sub as this replica sees it."""

    master: Address
    ok: bool
    why: str
    holds_store: bool  # serves the slot of the registry's keys


def cluster_readiness(
    *, slot_map_read: bool, store_served: bool, covered: int, shards: Sequence[ShardHealth], unplaced: int = 0
) -> tuple[bool, str]:
    """``(ready, reason)``: ready while the slot map is known, every slot served and the
    registry's shard reachable; other shards down only make the reason say "degraded"."""
    if not slot_map_read:
        return False, "cluster slot map not read yet"
    if covered < 16384:
        return False, f"cluster covers {covered} of 16384 slots"
    store = [s for s in shards if s.holds_store]
    if not store_served or not store:
        return False, "no pub/sub connection to the registry's shard yet"
    if not store[0].ok:
        return False, f"registry shard {address_text(store[0].master)}: {store[0].why}"
    down = [s for s in shards if not s.ok]
    notes = [f"shard {address_text(s.master)} down: {s.why}" for s in down]
    if unplaced:
        notes.append(f"{unplaced} channel(s) awaiting a shard")
    if not notes:
        return True, "ok"
    return True, ("ok, degraded: " if down else "ok, ") + "; ".join(notes)

"""The replica layer's counters on ``/metrics``, read at scrape time (no per-message work)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from switchboard.replicas.dataplane.unicast import Unicast
from switchboard.replicas.upkeep.cluster import Cluster


class ReplicaCollector:
    """Bus, lease, reaper and link counters of one replica."""

    def __init__(self, cluster: Cluster, unicast: Unicast) -> None:
        self.cluster = cluster
        self.unicast = unicast

    def collect(self) -> Iterator[Metric]:
        c = self.cluster
        replica = c.hub.replica_id
        stats = c.bus.stats
        healthy, _ = c.bus.health

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=["replica"])
            g.add_metric([replica], value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            m = CounterMetricFamily(name, doc, labels=["replica"])
            m.add_metric([replica], value)
            return m

        yield gauge("switchboard_subscriptions_desired", "Pub/sub channels this replica wants.", stats.desired)
        yield gauge(
            "switchboard_subscriptions_confirmed",
            "Pub/sub channels Redis confirmed on the live connection.",
            stats.confirmed,
        )
        yield gauge(
            "switchboard_bus_healthy", "1 while the pub/sub connection passes its delivery probe.", int(healthy)
        )
        yield gauge("switchboard_is_leader", "1 on the replica holding the leader lease.", int(c.elector.is_leader))
        yield gauge(
            "switchboard_reaper_suspects", "Clients that failed at least one probe in a row.", len(c.reaper.ledger)
        )
        yield counter("switchboard_subscription_repairs", "Subscriptions re-wired by the reconciler.", stats.repairs)
        yield counter(
            "switchboard_bus_publishes_to_nobody", "Publishes no replica received.", stats.publishes_to_nobody
        )
        yield counter("switchboard_redis_reconnects", "Pub/sub reconnections.", stats.reconnects)
        yield counter("switchboard_reaped_clients", "Clients whose registrations the reaper removed.", c.reaped)
        yield counter(
            "switchboard_reasserted_registrations", "Registrations re-written after Redis lost its data.", c.reasserted
        )
        u = self.unicast
        yield counter(
            "switchboard_replica_messages_malformed",
            "Messages from other replicas (through Redis or a link) this replica could not read: malformed, "
            "or of a newer wire version.",
            u.malformed + (u.links.stats.malformed if u.links is not None else 0),
        )
        if (lost := c.lost_deletes) is not None:
            yield counter(
                "switchboard_undone_registrations",
                "Registrations a failover brought back after they were deleted, removed again.",
                lost.removed_services,
            )
        if u.links is not None:
            links = u.links.stats
            yield counter(
                "switchboard_link_frames_sent",
                "Frames sent straight to another replica instead of through Redis.",
                links.direct,
            )
            yield counter(
                "switchboard_link_frames_received",
                "Frames another replica sent straight here and a client got.",
                links.received,
            )
            yield counter(
                "switchboard_link_frames_returned",
                "Frames sent back because their client had left this replica.",
                links.nacked,
            )
            yield counter(
                "switchboard_link_frames_replayed",
                "Frames a lost link left unacked, sent again through Redis.",
                u.replayed,
            )
            yield counter(
                "switchboard_link_frames_not_replayed",
                "Unacked frames of a lost link not sent again: calls whose reply had come back.",
                u.not_replayed,
            )
            yield counter(
                "switchboard_link_frames_duplicate",
                "Frames not delivered a second time: a lost link's replay of a frame the link had delivered here "
                "(or the link's copy of one a replay had).",
                links.duplicates,
            )
            yield counter(
                "switchboard_link_dial_failures",
                "Links to other replicas that could not be opened.",
                links.dial_failures,
            )
            yield counter(
                "switchboard_link_refused",
                "Incoming links refused: a bad or missing handshake, or too many unfinished from one address.",
                links.refused,
            )
            yield counter(
                "switchboard_link_forged",
                "Open links dropped because a frame failed its MAC or sequence number (injected, altered, replayed).",
                links.forged,
            )

    def describe(self) -> list[Any]:
        return []

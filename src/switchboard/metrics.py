"""Prometheus metrics, in a registry owned by one hub (no global collectors)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

# Seconds: where a drain's handover (tens of ms), a reconnect after hypha-rpc's
# first backoff (about 1 s) and one near a 5 s grace fall apart.
TRANSIT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


class HubMetrics:
    """The figures an operator watches, each labelled with the replica id."""

    def __init__(self, replica_id: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.replica_id = replica_id
        labels = {"replica": replica_id}

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, ["replica"], registry=self.registry).labels(**labels)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, ["replica"], registry=self.registry).labels(**labels)

        self.clients = gauge("switchboard_connected_clients", "Clients connected to this replica.")
        self.services = gauge("switchboard_registered_services", "Services registered through this replica.")
        self.frames = FrameCounts()
        self.registry.register(_FrameCountsCollector(self.frames, replica_id))
        self.registry.register(_CollectorCounts(replica_id))
        self.undeliverable = counter(
            "switchboard_undeliverable_messages", "Frames whose target had no live connection."
        )
        self.publishes_to_nobody = counter(
            "switchboard_publishes_to_nobody",
            "Frames for a client not here that no replica received (then held, retried or failed).",
        )
        self.rate_limited = counter(
            "switchboard_refused_over_limit", "Frames refused by the rate or pending-call limit."
        )
        self.bad_frames = counter("switchboard_rejected_frames", "Frames rejected as malformed or forbidden.")
        self.call_errors = counter("switchboard_call_errors", "Manager and HTTP calls that failed.")
        self.http_calls = counter("switchboard_http_service_calls", "Service calls made over HTTP.")
        self.calls_in_flight = gauge(
            "switchboard_calls_in_flight", "Calls routed through this replica still waiting for their reply."
        )
        self.handshake_failures = counter("switchboard_handshake_failures", "Connections refused during the handshake.")
        self.transit_seconds = Histogram(
            "switchboard_transit_seconds",
            "How long the clients that came back here had been in transit.",
            ["replica"],
            registry=self.registry,
            buckets=TRANSIT_BUCKETS,
        ).labels(**labels)
        self.transit_expiries = counter(
            "switchboard_transit_expiries",
            "Clients in transit whose grace ran out before they came back (announced gone by this replica).",
        )
        self._replica_id = replica_id

    def watch_transit(self, transit: Any) -> None:
        """Report a :class:`~switchboard.hub.sessions.in_transit.Transit` at scrape time."""
        self.registry.register(_TransitCollector(transit, self._replica_id))

    def watch_balanced(self, balanced: Any) -> None:
        """Report a :class:`~switchboard.hub.routing.balance.Balanced` at scrape time."""
        self.registry.register(_BalancedCollector(balanced, self._replica_id))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def totals(self) -> dict[str, float]:
        """Running totals the web console turns into rates: frames received, errors, calls in flight.

        Errors are what went wrong for someone: frames rejected or refused over
        a limit, frames that reached nobody, refused handshakes, failed calls.
        Each figure is read from its own metric: the presence record asks for
        them twice a second, and the registry's lookup by name collected every
        metric once per figure, the count of services too, a walk of every
        client connected here (``tests/hub/test_metrics.py``).
        """
        errors = sum(
            _value(metric, "_total")
            for metric in (
                self.bad_frames,
                self.rate_limited,
                self.undeliverable,
                self.handshake_failures,
                self.call_errors,
            )
        )
        return {
            "received": float(self.frames.received),
            "errors": errors,
            "inflight": _value(self.calls_in_flight, ""),
        }


def _value(metric: Counter | Gauge, suffix: str) -> float:
    """The value of one labelled metric (its sample named with ``suffix``), through its public ``collect``."""
    for family in metric.collect():
        for sample in family.samples:
            if sample.name == family.name + suffix:
                return float(sample.value)
    return 0.0


class FrameCounts:
    """Counters bumped for every frame: plain integers, read at scrape time.

    A ``prometheus_client`` counter takes a lock on each increment, and these
    are bumped several times per routed frame by one event loop only.
    """

    __slots__ = ("received", "received_bytes", "routed")

    def __init__(self) -> None:
        self.received = 0  # binary frames received from clients
        self.received_bytes = 0
        self.routed = 0  # frames delivered to a client (here, or handed to another replica)


class _FrameCountsCollector:
    def __init__(self, counts: FrameCounts, replica_id: str) -> None:
        self.counts = counts
        self.replica_id = replica_id

    def collect(self) -> Iterator[CounterMetricFamily]:
        c = self.counts
        for name, doc, value in (
            ("switchboard_messages_received", "Binary frames received from clients.", c.received),
            ("switchboard_received_bytes", "Bytes of binary frames received from clients.", c.received_bytes),
            ("switchboard_messages_routed", "Frames delivered to a client.", c.routed),
        ):
            family = CounterMetricFamily(name, doc, labels=["replica"])
            family.add_metric([self.replica_id], value)
            yield family

    def describe(self) -> list[CounterMetricFamily]:
        return []


class _CollectorCounts:
    """The process's garbage collections by generation (2: a pass over every tracked object)."""

    def __init__(self, replica_id: str) -> None:
        self.replica_id = replica_id

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "switchboard_gc_collections",
            "Garbage collections of this replica's process, by generation (2: over every tracked object).",
            labels=["replica", "generation"],
        )
        for generation, stats in enumerate(gc.get_stats()):
            family.add_metric([self.replica_id, str(generation)], stats["collections"])
        yield family

    def describe(self) -> list[CounterMetricFamily]:
        return []


class _TransitCollector:
    def __init__(self, transit: Any, replica_id: str) -> None:
        self.transit = transit
        self.replica_id = replica_id

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        t, labels = self.transit, [self.replica_id]
        clients = GaugeMetricFamily(
            "switchboard_clients_in_transit",
            "Clients in transit this replica knows of (every replica hears of every move: take the max, not the sum).",
            labels=["replica"],
        )
        clients.add_metric(labels, len(t))
        waiting = GaugeMetricFamily(
            "switchboard_transit_frames_waiting",
            "Frames held here right now for clients in transit.",
            labels=["replica"],
        )
        waiting.add_metric(labels, t.holding)
        held = CounterMetricFamily(
            "switchboard_transit_held_frames",
            "Frames held here for a client in transit until it came back or its grace ran out.",
            labels=["replica"],
        )
        held.add_metric(labels, t.held_total)
        yield from (clients, waiting, held)

    def describe(self) -> list[Any]:
        return []


class _BalancedCollector:
    """Calls through balanced handles: in all, per instance (those still in a handle), and failed over."""

    def __init__(self, balanced: Any, replica_id: str) -> None:
        self.balanced = balanced
        self.replica_id = replica_id

    def collect(self) -> Iterator[CounterMetricFamily]:
        b, labels = self.balanced, [self.replica_id]
        calls = CounterMetricFamily(
            "switchboard_balanced_calls", "Calls this replica sent through balanced handles.", labels=["replica"]
        )
        calls.add_metric(labels, b.balanced_calls)
        failovers = CounterMetricFamily(
            "switchboard_balanced_failovers",
            "Balanced calls re-sent to another instance after theirs died (idempotent functions only).",
            labels=["replica"],
        )
        failovers.add_metric(labels, b.failovers)
        per = CounterMetricFamily(
            "switchboard_balanced_instance_calls",
            "Balanced calls this replica sent to each instance (instances still alive).",
            labels=["replica", "instance"],
        )
        for instance, count in list(b.per_instance.items()):
            per.add_metric([self.replica_id, instance], count)
        yield from (calls, failovers, per)

    def describe(self) -> list[Any]:
        return []

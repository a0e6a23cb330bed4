"""Prometheus metrics, in a registry owned by one hub (no global collectors)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily


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
        self.undeliverable = counter(
            "switchboard_undeliverable_messages", "Frames whose target had no live connection."
        )
        self.publishes_to_nobody = counter(
            "switchboard_publishes_to_nobody",
            "Frames for a registered client that no replica received (then retried).",
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
        self.handshake_failures = counter(
            "switchboard_handshake_failures", "Connections refused during the handshake."
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def totals(self) -> dict[str, float]:
        """Running totals the web console turns into rates: frames received, errors, calls in flight.

        Errors are what went wrong for someone: frames rejected or refused over
        a limit, frames that reached nobody, refused handshakes, failed calls.
        """
        labels = {"replica": self.replica_id}

        def value(name: str) -> float:
            return self.registry.get_sample_value(name, labels) or 0.0

        errors = sum(value(f"switchboard_{name}_total") for name in (
            "rejected_frames", "refused_over_limit", "undeliverable_messages",
            "handshake_failures", "call_errors",
        ))
        return {"received": float(self.frames.received), "errors": errors,
                "inflight": value("switchboard_calls_in_flight")}


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

"""Prometheus metrics, in a registry owned by one hub (no global collectors)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest


class HubMetrics:
    """The figures an operator watches, each labelled with the replica id."""

    def __init__(self, replica_id: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = {"replica": replica_id}

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, ["replica"], registry=self.registry).labels(**labels)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, ["replica"], registry=self.registry).labels(**labels)

        self.clients = gauge("switchboard_connected_clients", "Clients connected to this replica.")
        self.services = gauge("switchboard_registered_services", "Services registered through this replica.")
        self.messages_in = counter("switchboard_messages_received", "Binary frames received from clients.")
        self.bytes_in = counter("switchboard_received_bytes", "Bytes of binary frames received from clients.")
        self.messages_routed = counter("switchboard_messages_routed", "Frames delivered to a client.")
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

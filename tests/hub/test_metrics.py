"""The running totals a replica publishes twice a second cost the same with 10,000 clients as with none.

The presence record (and the console's sampler) reads ``HubMetrics.totals``
every half second. It looked each figure up in the whole registry, which
collects every metric for each lookup, the count of registered services too:
a walk of every client connected to the replica, six times per read (issue 26:
with 4,000 clients, a tenth of the replica's idle CPU).
"""

from __future__ import annotations

from switchboard.metrics import HubMetrics


def test_totals_read_each_figure_without_counting_the_services_of_every_client() -> None:
    metrics = HubMetrics("ra")
    walks: list[int] = []

    def services_of_every_client() -> int:  # what assemble sets: a walk of the clients here
        walks.append(1)
        return 0

    metrics.services.set_function(services_of_every_client)
    metrics.calls_in_flight.set_function(lambda: 7)
    metrics.frames.received = 11
    metrics.bad_frames.inc()
    metrics.rate_limited.inc(2)
    metrics.undeliverable.inc(3)
    metrics.handshake_failures.inc(4)
    metrics.call_errors.inc(5)
    metrics.publishes_to_nobody.inc(100)  # retried, not an error for anyone

    assert metrics.totals() == {"received": 11.0, "errors": 15.0, "inflight": 7.0}
    assert not walks, f"totals() counted the services of every client {len(walks)} times"


def test_the_scrape_still_counts_the_services() -> None:
    metrics = HubMetrics("ra")
    metrics.services.set_function(lambda: 3)
    assert b'switchboard_registered_services{replica="ra"} 3.0' in metrics.render()

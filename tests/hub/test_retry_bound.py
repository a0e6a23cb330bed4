"""How long a retry window keeps a client's frames, and the port that hands them back to the dispatch."""

from __future__ import annotations

from typing import Any

import pytest

from switchboard.hub.routing.undelivered import Undelivered
from switchboard.hub.transit.released import Released
from switchboard.hub.transit.retry_bound import DrainEnd, RetryBound

ITEM = Undelivered(b"frame", "s1", "ws/caller")


class Transits:
    def __init__(self, **deadlines: float) -> None:
        self.deadlines = deadlines

    def deadline(self, client: str) -> float | None:
        return self.deadlines.get(client)


class Connection:
    def __init__(self, *, closed: bool) -> None:
        self.closed = closed


def test_a_client_in_transit_keeps_its_frames_for_its_grace() -> None:
    bound = RetryBound(Transits(moving=105.0), DrainEnd(), {})
    assert bound("moving") == 105.0


def test_without_a_drain_or_a_transit_there_is_no_bound_beyond_the_window() -> None:
    bound = RetryBound(Transits(), DrainEnd(), {"live": Connection(closed=False)})
    assert bound("live") is None


@pytest.mark.parametrize(
    ("client", "expected"),
    [("live", 130.0), ("closed", None), ("elsewhere", None)],
)
def test_while_draining_a_client_waiting_here_for_its_wave_keeps_its_frames_to_the_drains_end(
    client: str, expected: Any
) -> None:
    drain = DrainEnd()
    bound = RetryBound(Transits(), drain, {"live": Connection(closed=False), "closed": Connection(closed=True)})
    drain.until = 130.0  # the drainer began

    assert bound(client) == expected


class Carrier:
    def __init__(self) -> None:
        self.failed: list[tuple[str, Undelivered]] = []
        self.delivered: list[tuple[str, Undelivered]] = []

    def give_up(self, target: str, item: Undelivered) -> None:
        self.failed.append((target, item))

    async def deliver(self, target: str, item: Undelivered) -> None:
        self.delivered.append((target, item))


async def test_released_frames_reach_the_carrier_it_was_connected_to() -> None:
    port, carrier = Released(), Carrier()
    port.connect(carrier)

    port.give_up("ws/gone", ITEM)
    await port.deliver("ws/back", ITEM)

    assert carrier.failed == [("ws/gone", ITEM)]
    assert carrier.delivered == [("ws/back", ITEM)]


def test_a_frame_released_before_the_dispatch_is_connected_is_a_clear_error_not_a_silent_loss() -> None:
    with pytest.raises(RuntimeError, match="before the dispatch was connected"):
        Released().give_up("ws/gone", ITEM)


def test_the_port_is_connected_once() -> None:
    port = Released()
    port.connect(Carrier())
    with pytest.raises(RuntimeError, match="connected already"):
        port.connect(Carrier())

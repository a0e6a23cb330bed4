"""The calls in flight tell whoever waits for one to end: the drain (hub/transit/drain.py)."""

from __future__ import annotations

from switchboard.hub.routing.inflight import InFlight
from switchboard.server.app import build_hub
from switchboard.testing import FakeClock
from switchboard.testing.hub import settings_for_tests

HERE = {"ws/caller", "ws/p"}


def test_a_call_that_ends_or_a_peer_that_leaves_is_told() -> None:
    told: list[str] = []
    calls = InFlight(on_change=lambda: told.append("changed"))
    calls.opened("ws/caller", "s1", "ws/p", HERE)
    calls.opened("ws/caller", "s2", "ws/p", HERE)
    assert told == []  # a call opening is nothing to wait for
    calls.closed("ws/caller", "s1")
    assert told == ["changed"]
    calls.forget_peer("ws/p")
    assert told == ["changed", "changed"]


def test_the_hubs_drain_hears_of_every_call_the_router_sees_end() -> None:
    hub = build_hub(settings_for_tests(), clock=FakeClock())
    calls = hub.router.inflight
    calls.opened("ws/caller", "s1", "ws/p", HERE)
    assert not hub.drainer.calls_ended.is_set()
    calls.closed("ws/caller", "s1")
    assert hub.drainer.calls_ended.is_set()

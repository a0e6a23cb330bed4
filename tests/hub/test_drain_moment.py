"""When a drain sends a client away: early in a pause of what it sends, bounded."""

from __future__ import annotations

import pytest

from switchboard.hub.transit.drain import IDLE, PAUSE, QUIET, QUIET_WAIT, _moment


def test_a_client_early_in_a_pause_goes_now() -> None:
    assert _moment(last_heard=10.0, since=10.0, now=10.0 + QUIET) is None
    assert _moment(last_heard=10.0, since=10.0, now=10.0 + QUIET + PAUSE / 2) is None


def test_a_client_that_just_sent_is_looked_at_again_once_its_pause_began() -> None:
    assert _moment(last_heard=10.0, since=10.0, now=10.001) == pytest.approx(
        10.0 + QUIET
    )  # its heartbeat answer may follow


def test_late_in_a_pause_it_waits_for_the_next_one_or_idleness() -> None:
    later = _moment(last_heard=10.0, since=10.0, now=10.0 + QUIET + PAUSE + 0.001)
    assert later == pytest.approx(10.0 + IDLE)


def test_an_idle_client_goes_now() -> None:
    assert _moment(last_heard=0.0, since=10.0, now=10.0) is None


def test_a_client_that_never_pauses_goes_after_quiet_wait() -> None:
    assert _moment(last_heard=10.099, since=10.0, now=10.0 + QUIET_WAIT + 1e-6) is None
    assert _moment(last_heard=10.05, since=10.0, now=10.051) == pytest.approx(10.05 + QUIET)

"""The reconnect policy as a value: delays, jitter bounds, budget, classification, settings."""

from __future__ import annotations

import random
import statistics

import pytest
from websockets.datastructures import Headers
from websockets.exceptions import InvalidMessage, InvalidStatus, InvalidURI
from websockets.http11 import Response

from switchboard.client import GaveUp, Jitter, Outage, ReconnectPolicy, Refused, classify
from switchboard.client.errors import SocketClosed
from switchboard.client.policy import Verdict
from switchboard.errors import ConfigError, ProtocolError
from switchboard.testing import FakeClock


def take(policy: ReconnectPolicy, n: int, seed: int = 0) -> list[float]:
    delays = policy.delays(random.Random(seed))
    return [next(delays) for _ in range(n)]


def caps(policy: ReconnectPolicy, n: int) -> list[float]:
    return [min(policy.max_delay, policy.initial_delay * 2**k) for k in range(n)]


def test_defaults_outlast_a_measured_restart_with_headroom():
    policy = ReconnectPolicy()
    assert policy.max_wait == 150.0
    assert policy.max_wait >= 2 * 61
    assert policy.max_delay == 10.0
    assert policy.jitter is Jitter.FULL


def test_without_jitter_the_delays_double_up_to_the_cap():
    policy = ReconnectPolicy(initial_delay=0.5, max_delay=10, jitter="none")
    assert take(policy, 8) == [0.5, 1, 2, 4, 8, 10, 10, 10]


@pytest.mark.parametrize("seed", range(20))
def test_full_jitter_stays_within_zero_and_the_growing_cap(seed):
    policy = ReconnectPolicy()
    for delay, cap in zip(take(policy, 200, seed), caps(policy, 200), strict=True):
        assert 0.0 <= delay <= cap <= policy.max_delay


def test_full_jitter_spreads_a_fleet_over_the_whole_window():
    """A restart drops every client at once: their k-th retries must not line up."""
    policy = ReconnectPolicy()
    tenth = [take(policy, 10, seed)[9] for seed in range(2000)]
    assert min(tenth) < 0.5
    assert max(tenth) > 9.5
    assert statistics.mean(tenth) == pytest.approx(5.0, abs=0.3)


@pytest.mark.parametrize("seed", range(20))
def test_decorrelated_jitter_stays_within_initial_and_max_delay(seed):
    policy = ReconnectPolicy(initial_delay=0.5, max_delay=10, jitter=Jitter.DECORRELATED)
    delays = take(policy, 200, seed)
    assert all(0.5 <= d <= 10 for d in delays)
    assert max(delays) > 5  # it does grow


def simulate_outage(policy: ReconnectPolicy, seed: int, outage: float) -> int:
    """Attempts the policy makes against one dead URL during ``outage`` seconds."""
    clock = FakeClock()
    budget = Outage(policy, clock, random.Random(seed))
    attempts = 0
    while clock.monotonic() <= outage:
        attempts += 1
        budget.failed(ConnectionRefusedError())
        delay = budget.next_delay()
        if delay is None:
            break
        clock.advance(delay)
    return attempts


def test_a_150s_outage_costs_a_bounded_number_of_attempts():
    """The stated bound (ReconnectPolicy docstring): about 34 expected, never above 60."""
    counts = [simulate_outage(ReconnectPolicy(), seed, 150.0) for seed in range(2000)]
    assert max(counts) <= 60
    assert 30 <= statistics.mean(counts) <= 38


def test_the_last_attempt_lands_on_the_deadline_and_then_it_gives_up():
    clock = FakeClock()
    budget = Outage(ReconnectPolicy(max_wait=30, jitter="none"), clock)
    clock.advance(100)  # connected and busy: costs nothing
    budget.failed(ConnectionRefusedError("first"))
    assert budget.started_at == 100
    slept = 0.0
    while (delay := budget.next_delay()) is not None:
        clock.advance(delay)
        slept += delay
        budget.attempt()
    assert slept == 30
    assert clock.monotonic() == 130
    error = budget.gave_up(["ws://a/ws"])
    assert isinstance(error, GaveUp)
    assert isinstance(error, ConnectionError)
    assert error.outage_seconds == 30
    assert "outage of 30.0 s" in str(error)
    assert "ws://a/ws" in str(error)


def test_an_outage_without_failures_has_spent_nothing():
    clock = FakeClock()
    budget = Outage(ReconnectPolicy(), clock)
    clock.advance(500)
    assert budget.elapsed == 0
    assert budget.remaining == 150


@pytest.mark.parametrize(
    ("exc", "verdict"),
    [
        (ConnectionRefusedError(111, "refused"), Verdict.RETRY),
        (ConnectionResetError(), Verdict.RETRY),
        (TimeoutError(), Verdict.RETRY),
        (OSError("network unreachable"), Verdict.RETRY),
        (SocketClosed(1012, "Server restarting, please reconnect"), Verdict.RETRY),
        (SocketClosed(1006), Verdict.RETRY),
        (InvalidMessage("did not receive a valid HTTP response"), Verdict.RETRY),
        (Refused("Server is draining, please reconnect", close_code=1013), Verdict.RETRY),
        (Refused("Authentication error: expired", close_code=1008), Verdict.FATAL),
        (Refused("Client already exists and is active", close_code=1001), Verdict.FATAL),
        (InvalidURI("nope", "not a ws uri"), Verdict.FATAL),
        (ProtocolError("unexpected frame"), Verdict.FATAL),
        (ValueError("a bug"), Verdict.FATAL),
    ],
)
def test_classify(exc, verdict):
    assert classify(exc) is verdict


@pytest.mark.parametrize(
    ("status", "verdict"),
    [(502, Verdict.RETRY), (503, Verdict.RETRY), (429, Verdict.RETRY), (404, Verdict.FATAL), (403, Verdict.FATAL)],
)
def test_classify_http_answers_to_the_upgrade(status, verdict):
    assert classify(InvalidStatus(Response(status, "x", Headers()))) is verdict


def test_from_env_reads_every_setting():
    env = {
        "SWITCHBOARD_CLIENT_MAX_WAIT": "300",
        "SWITCHBOARD_CLIENT_INITIAL_DELAY": "0.25",
        "SWITCHBOARD_CLIENT_MAX_DELAY": "5",
        "SWITCHBOARD_CLIENT_JITTER": "Decorrelated",
    }
    assert ReconnectPolicy.from_env(env) == ReconnectPolicy(300, 0.25, 5, Jitter.DECORRELATED)


def test_arguments_win_over_the_environment():
    env = {"SWITCHBOARD_CLIENT_MAX_WAIT": "300"}
    assert ReconnectPolicy.from_env(env, max_wait=20).max_wait == 20
    assert ReconnectPolicy.from_env({}) == ReconnectPolicy()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"SWITCHBOARD_CLIENT_MAX_WAIT": "soon"},
            "SWITCHBOARD_CLIENT_MAX_WAIT='soon': expected a number of seconds, e.g. 150.0",
        ),
        (
            {"SWITCHBOARD_CLIENT_MAX_DELAY": "-1"},
            "SWITCHBOARD_CLIENT_MAX_DELAY='-1': must be a positive number of seconds",
        ),
        (
            {"SWITCHBOARD_CLIENT_MAX_WAIT": "inf"},
            "SWITCHBOARD_CLIENT_MAX_WAIT='inf': must be a positive number of seconds",
        ),
        ({"SWITCHBOARD_CLIENT_JITTER": "random"}, "SWITCHBOARD_CLIENT_JITTER='random': use full, decorrelated or none"),
        (
            {"SWITCHBOARD_CLIENT_MAX_DELAY": "0.1"},
            "ReconnectPolicy.max_delay=0.1: must be at least initial_delay=0.5 "
            "(from SWITCHBOARD_CLIENT_MAX_DELAY='0.1')",
        ),
    ],
)
def test_bad_settings_name_the_variable_and_the_fix(env, message):
    with pytest.raises(ConfigError) as info:
        ReconnectPolicy.from_env(env)
    assert str(info.value) == message


def test_bad_arguments_are_config_errors():
    with pytest.raises(ConfigError, match="max_wait=0"):
        ReconnectPolicy(max_wait=0)
    with pytest.raises(ConfigError, match="unknown reconnect setting"):
        ReconnectPolicy.from_env({}, retries=12)

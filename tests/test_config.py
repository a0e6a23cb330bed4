"""Settings: flags and ``SWITCHBOARD_*`` variables go through one parser, with one set of messages."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys

import pytest
from click.testing import CliRunner

from switchboard.cli import main
from switchboard.config import Settings, read
from switchboard.errors import ConfigError


def test_nothing_given_keeps_every_documented_default() -> None:
    loaded = Settings.load({}, {})
    for f in dataclasses.fields(Settings):
        if f.name != "replica_id":  # empty by default, then made unique per process
            assert getattr(loaded, f.name) == f.default, f.name


def test_a_variable_is_cast_to_the_type_of_its_default() -> None:
    env = {
        "SWITCHBOARD_PORT": "9000",
        "SWITCHBOARD_CALL_TIMEOUT": "2.5",
        "SWITCHBOARD_LINKS": "off",
        "SWITCHBOARD_HOST": "0.0.0.0",
    }
    loaded = Settings.load({}, env)
    assert (loaded.port, loaded.call_timeout, loaded.links, loaded.host) == (9000, 2.5, False, "0.0.0.0")


def test_a_flag_wins_over_its_variable() -> None:
    env = {"SWITCHBOARD_PORT": "9000", "SWITCHBOARD_LINKS": "on"}
    loaded = Settings.load({"port": "9001", "links": False}, env)
    assert (loaded.port, loaded.links) == (9001, False)


def test_a_flag_not_given_leaves_the_variable() -> None:
    assert Settings.load({"port": None}, {"SWITCHBOARD_PORT": "9000"}).port == 9000


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        ({"port": "x"}, {}, "--port='x': expected an integer"),
        ({}, {"SWITCHBOARD_PORT": "x"}, "SWITCHBOARD_PORT='x': expected an integer"),
        ({}, {"SWITCHBOARD_CALL_TIMEOUT": "soon"}, "SWITCHBOARD_CALL_TIMEOUT='soon': expected a number"),
        ({}, {"SWITCHBOARD_LINKS": "maybe"}, "SWITCHBOARD_LINKS='maybe': expected one of 1, true"),
        ({"port": "-1"}, {}, "--port=-1: must be at least 0"),
        (
            {},
            {"SWITCHBOARD_ORPHAN_REAP_MIN_FAILURES": "1"},
            "SWITCHBOARD_ORPHAN_REAP_MIN_FAILURES=1: must be at least 2",
        ),
        ({"port": "70000"}, {}, "--port/SWITCHBOARD_PORT=70000: must be at most 65535"),
        ({"log_level": "LOUD"}, {}, "--log-level/SWITCHBOARD_LOG_LEVEL='LOUD': use DEBUG, INFO, WARNING or ERROR"),
    ],
)
def test_a_bad_value_is_refused_naming_where_it_came_from(flags, env, message) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.load(flags, env)
    assert str(info.value).startswith(message)


def test_an_unknown_setting_is_refused() -> None:
    with pytest.raises(ConfigError, match="unknown settings: prot"):
        Settings.load({"prot": "1"}, {})


def test_one_setting_can_be_read_alone() -> None:
    assert read("redis_url", None, {"SWITCHBOARD_REDIS_URL": "redis://r:6379/0"}) == "redis://r:6379/0"
    assert (
        read("redis_url", "redis://flag:6379/0", {"SWITCHBOARD_REDIS_URL": "redis://r:6379/0"}) == "redis://flag:6379/0"
    )
    assert read("redis_url", None, {}) is None


def test_serve_refuses_a_bad_value_before_starting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWITCHBOARD_MAX_PENDING_CALLS", "many")
    result = CliRunner().invoke(main, ["serve"])
    assert result.exit_code == 2  # a usage error, as click gives for any bad option
    assert "SWITCHBOARD_MAX_PENDING_CALLS='many': expected an integer" in result.output


def test_serve_help_names_each_variable_and_default() -> None:
    result = CliRunner().invoke(main, ["serve", "--help"], terminal_width=1000)
    assert "--port INTEGER" in result.output
    assert "[env var: SWITCHBOARD_PORT; default: 9527]" in result.output
    assert "--links / --no-links" in result.output


def test_status_needs_a_redis_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SWITCHBOARD_REDIS_URL", raising=False)
    result = CliRunner().invoke(main, ["status"])
    assert result.exit_code == 2
    assert "--redis-url' (or SWITCHBOARD_REDIS_URL)" in result.output


@pytest.mark.parametrize(
    ("flags", "env"),
    [({"jwt_secret": "short"}, {}), ({}, {"SWITCHBOARD_JWT_SECRET": "x" * 31})],
)
def test_a_jwt_secret_shorter_than_32_bytes_is_refused_saying_how_to_make_one(flags, env) -> None:
    """A short HS256 secret can be brute-forced offline from any token it signed."""
    with pytest.raises(ConfigError) as info:
        Settings.load(flags, env)
    message = str(info.value)
    assert "--jwt-secret/SWITCHBOARD_JWT_SECRET" in message
    assert "at least 32 random bytes" in message
    assert 'python -c "import secrets; print(secrets.token_urlsafe(32))"' in message


def test_a_jwt_secret_of_32_bytes_is_accepted() -> None:
    assert Settings.load({}, {"SWITCHBOARD_JWT_SECRET": "x" * 32}).jwt_secret == "x" * 32


def test_serve_refuses_a_short_jwt_secret_before_starting() -> None:
    # a port already taken: were the secret accepted, the hub would exit 3 on the bind, not hang
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        done = subprocess.run(
            [sys.executable, "-m", "switchboard", "serve", "--port", port, "--jwt-secret", "short"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2, done.stderr  # a usage error, before anything starts
    assert "--jwt-secret/SWITCHBOARD_JWT_SECRET" in done.stderr
    assert "secrets.token_urlsafe(32)" in done.stderr


def test_the_cluster_setting_is_auto_unless_given_either_way() -> None:
    base = {"SWITCHBOARD_JWT_SECRET": "s" * 32, "SWITCHBOARD_PUBLIC_URL": "http://hub"}
    assert Settings.load({}, base).redis_cluster is None
    assert Settings.load({}, {**base, "SWITCHBOARD_REDIS_CLUSTER": "auto"}).redis_cluster is None
    assert Settings.load({}, {**base, "SWITCHBOARD_REDIS_CLUSTER": "yes"}).redis_cluster is True
    assert Settings.load({"redis_cluster": False}, {**base, "SWITCHBOARD_REDIS_CLUSTER": "yes"}).redis_cluster is False
    seeds = "redis://a:7000/0,redis://b:7001/0"
    assert Settings.load({"redis_url": seeds}, base).redis_url == seeds
    with pytest.raises(ConfigError, match="lists 2 URLs but --redis-cluster/SWITCHBOARD_REDIS_CLUSTER is off"):
        Settings.load({"redis_url": seeds, "redis_cluster": False}, base)
    with pytest.raises(ConfigError, match="must start with redis://"):
        Settings.load({"redis_url": "redis://a:7000/0,b:7001"}, base)


def test_serve_offers_the_cluster_flag_both_ways() -> None:
    text = CliRunner().invoke(main, ["serve", "--help"]).output
    assert "--redis-cluster / --no-redis-cluster" in text
    assert "SWITCHBOARD_REDIS_CLUSTER" in text

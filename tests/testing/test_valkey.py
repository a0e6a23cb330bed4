"""ValkeyServer: a real server that tests can empty, crash and disconnect."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import psutil
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from switchboard.testing import ValkeyServer, ValkeyServerError
from switchboard.testing.valkey import BINARY_ENV, find_server_binary
from switchboard.testing.wait import eventually_blocking


def no_retry() -> Retry:
    """Fail on the first error, so a test sees exactly what the server did."""
    return Retry(NoBackoff(), 0)


def pubsub_clients(server: ValkeyServer) -> int:
    with server.client() as admin:
        return len(admin.client_list(_type="pubsub"))


@pytest.fixture
def valkey() -> Iterator[ValkeyServer]:
    with ValkeyServer() as srv:
        yield srv


def test_start_answers_ping_on_loopback_without_persistence(valkey: ValkeyServer) -> None:
    assert valkey.is_running()
    assert valkey.url == f"redis://127.0.0.1:{valkey.port}/0"
    with valkey.client() as client:
        assert client.ping() is True
        assert client.config_get("save") == {"save": ""}
        assert client.config_get("appendonly") == {"appendonly": "no"}
        assert client.config_get("bind")["bind"].split() == ["127.0.0.1"]


def test_restart_comes_back_empty_on_the_same_port(valkey: ValkeyServer) -> None:
    port, pid = valkey.port, valkey.pid
    with valkey.client() as client:
        client.set("survives?", "no")
    valkey.restart()
    assert valkey.port == port
    assert valkey.pid != pid
    assert not psutil.pid_exists(pid)
    with valkey.client() as client:
        assert client.get("survives?") is None
        assert client.dbsize() == 0


def test_kill_is_a_crash_and_start_brings_it_back(valkey: ValkeyServer) -> None:
    port = valkey.port
    valkey.kill()
    assert not valkey.is_running()
    with valkey.client(retry=no_retry()) as client, pytest.raises(redis.ConnectionError):
        client.ping()
    valkey.start()
    assert valkey.port == port
    with valkey.client() as client:
        assert client.ping() is True


def test_kill_clients_pubsub_disconnects_subscribers_only(valkey: ValkeyServer) -> None:
    with valkey.client(retry=no_retry()) as normal, valkey.client(retry=no_retry()) as sub:
        normal_id = normal.client_id()
        pubsub = sub.pubsub()
        pubsub.subscribe("events")
        assert pubsub.get_message(timeout=2.0)["type"] == "subscribe"
        assert pubsub_clients(valkey) == 1

        assert valkey.kill_clients("pubsub") == 1

        assert pubsub_clients(valkey) == 0
        with pytest.raises(redis.ConnectionError):
            pubsub.get_message(timeout=2.0)
        assert normal.client_id() == normal_id  # same connection, untouched
        pubsub.close()


def test_kill_clients_by_addr_closes_that_connection(valkey: ValkeyServer) -> None:
    with valkey.client() as victim, valkey.client() as other:
        victim_id, other_id = victim.client_id(), other.client_id()
        addr = victim.client_info()["addr"]

        assert valkey.kill_clients(None, addr=addr) == 1

        assert victim.client_id() != victim_id  # had to reconnect
        assert other.client_id() == other_id


def test_kill_clients_needs_a_filter(valkey: ValkeyServer) -> None:
    with pytest.raises(ValueError, match="type_ or addr"):
        valkey.kill_clients(None)


def test_stop_leaves_no_process_port_or_files() -> None:
    server = ValkeyServer().start()
    pid, port, log_path = server.pid, server.port, server.log_path
    assert pid is not None
    assert log_path is not None
    assert log_path.exists()

    server.stop()

    assert not server.is_running()
    assert not psutil.pid_exists(pid)
    assert not log_path.parent.exists()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
    server.stop()  # idempotent


def test_context_manager_stops_the_server() -> None:
    with ValkeyServer() as server:
        pid = server.pid
        assert pid is not None
    assert not server.is_running()
    eventually_blocking(lambda: not psutil.pid_exists(pid), "the valkey process gone", interval=0.02)


def test_failed_start_raises_with_the_log_tail_and_cleans_up() -> None:
    server = ValkeyServer(extra_args=["--no-such-directive", "1"], start_timeout=5.0)
    with pytest.raises(ValkeyServerError, match="no-such-directive"):
        server.start()
    assert not server.is_running()
    assert server.log_path is None


def test_binary_can_be_named_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    real = find_server_binary()
    monkeypatch.setenv(BINARY_ENV, real)
    assert find_server_binary() == real
    monkeypatch.setenv(BINARY_ENV, "/nonexistent/valkey-server")
    with pytest.raises(ValkeyServerError, match=BINARY_ENV):
        find_server_binary()

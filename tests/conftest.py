"""Shared fixtures: a real Switchboard served in the test's event loop, and real hypha-rpc clients."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
from hypha_rpc import connect_to_server

from switchboard.config import Settings
from switchboard.testing.hub import RunningServer, running, settings_for_tests
from switchboard.testing.valkey_cluster import ValkeyCluster

# asyncio's debug mode for the async tests, its exceptions, the slow callbacks' summary
pytest_plugins = ("support.debug_loop",)


@pytest.fixture(scope="module")
def valkey_cluster() -> Iterator[ValkeyCluster]:
    """A real 3-master + 3-replica Valkey Cluster, shared by one test module (it takes ~3 s to form)."""
    with ValkeyCluster() as cluster:
        yield cluster


@pytest.fixture(scope="session", autouse=True)
def _private_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No hub of the suite, in process or spawned, keeps a token secret in the real user's data directory."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("xdg-data")))
        patch.setenv("SWITCHBOARD_STATE_DIR", str(tmp_path_factory.mktemp("state")))
        yield


@pytest.fixture
def settings() -> Settings:
    return settings_for_tests()


@pytest.fixture
async def server(settings: Settings) -> AsyncIterator[RunningServer]:
    async with running(settings) as srv:
        yield srv


Connect = Callable[..., Awaitable[Any]]


@pytest.fixture
async def connect(server: RunningServer) -> AsyncIterator[Connect]:
    """``await connect(client_id=..., token=...)``: a real hypha-rpc client, closed after the test."""
    clients: list[Any] = []

    async def _connect(**config: Any) -> Any:
        config.setdefault("server_url", server.url)
        config.setdefault("method_timeout", 20)
        client = await connect_to_server(config)
        clients.append(client)
        return client

    yield _connect
    for client in reversed(clients):
        with contextlib.suppress(Exception):
            await client.disconnect()


@pytest.fixture
async def clients() -> AsyncIterator[Connect]:
    """``await clients(url, client_id=..., token=...)``: real hypha-rpc clients of any hub
    (a replica process, say), closed at the end."""
    made: list[Any] = []

    async def _connect(url: str, **config: Any) -> Any:
        config.setdefault("method_timeout", 20)
        client = await connect_to_server({"server_url": url, **config})
        made.append(client)
        return client

    yield _connect
    for client in reversed(made):
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.disconnect(), 5)

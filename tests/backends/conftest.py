"""What the store tests of this folder share: one Valkey per module, and a client on it emptied for each test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from switchboard.backends.redis import make_client
from switchboard.testing import ValkeyServer


@pytest.fixture(scope="module")
def valkey() -> Iterator[ValkeyServer]:
    with ValkeyServer() as srv:
        yield srv


@pytest.fixture
async def redis(valkey: ValkeyServer) -> AsyncIterator[Any]:
    """A client of the module's Valkey, which starts empty."""
    client = make_client(valkey.url)
    await client.flushall()
    yield client
    await client.aclose()

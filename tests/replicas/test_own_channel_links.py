"""A replica's own channel (replies to its manager's calls) rides every link it has, and Redis untagged.

So a replica linked to another reaches it even while its own Redis connection
is cut, and a replica that has not learned this (an older one) still reaches
it through Redis as before.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from support.linked import linked_replicas
from switchboard.testing import ValkeyServer
from switchboard.testing.wait import eventually

SECRET = "own-channel-secret"


@pytest.fixture(scope="module")
def valkey_own() -> Iterator[ValkeyServer]:
    with ValkeyServer() as srv:
        yield srv


@pytest.fixture
async def make(valkey_own: ValkeyServer) -> AsyncIterator[Callable[..., Any]]:
    async with linked_replicas(valkey_own.url, SECRET) as made:
        yield made


async def test_a_replicas_own_channel_is_offered_on_every_link_it_opens(make) -> None:
    a, b = await make("a"), await make("b")
    own, got = f"sb:replica:{b.replica_id}", []
    await b.subscribe_own(own, got.append)
    assert not a.unicast.send(own, b"too early")  # no link yet: the hub publishes it

    assert await a.bus.publish(own, b"plain") == 1  # through Redis, untagged, as older replicas send it
    await eventually(lambda: got == [b"plain"], "the untagged frame")

    client = f"sb:client:ws-{uuid.uuid4().hex[:6]}/c"  # traffic for a client of b opens a link
    await b.subscribe(client, lambda _: None)
    assert await a.publish(client, b"call") == 1
    await eventually(lambda: a.links.route_of(client) == b.replica_id, "a link from a to b")
    await eventually(lambda: a.links.route_of(own) == b.replica_id, "b's own channel offered on it")

    assert a.unicast.send(own, b"reply")
    await eventually(lambda: got == [b"plain", b"reply"], "the reply over the link")


async def test_a_channel_subscribed_after_the_link_opened_is_offered_on_it_too(make) -> None:
    a, b = await make("a"), await make("b")
    client = f"sb:client:ws-{uuid.uuid4().hex[:6]}/c"
    await b.subscribe(client, lambda _: None)
    assert await a.publish(client, b"call") == 1
    await eventually(lambda: a.links.route_of(client) == b.replica_id, "a link from a to b")

    own, got = f"sb:replica:{b.replica_id}", []
    await b.subscribe_own(own, got.append)
    await eventually(lambda: a.links.route_of(own) == b.replica_id, "b's own channel offered on the open link")
    assert a.unicast.send(own, b"reply")
    await eventually(lambda: got == [b"reply"], "the reply over the link")

"""A balanced or bounced call takes a link only to a replica that announced it reads one (issue 41).

Against a real Valkey and real sockets: the sender's unicast asks its
:class:`~switchboard.protocol.link.peer_versions.PeerVersions` (filled from the
presence records by the upkeep; here by the test) before it writes such a call
to a link; the receiver gets the call as the router wrapped it whichever way it
came, and one a link gives back goes through Redis, marked.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from support.linked import LinkedReplica as Replica
from support.linked import linked_replicas
from switchboard.protocol.link import replica_wire
from switchboard.testing import ValkeyServer
from switchboard.testing.wait import eventually

SECRET = "linked-balanced-secret"
CALL = b"\x85\xa4type\xa6method\xa4from\xa4ws/p\xa2to\xa4ws/c\xa6method\xa8s1.calc"  # a map, as frames are
BALANCED = replica_wire.wrap_balanced("ws/balance|round_robin|calc", CALL)
BOUNCED = replica_wire.wrap_bounced("ws/q", CALL)


@pytest.fixture(scope="module")
def valkey_balanced() -> Iterator[ValkeyServer]:
    with ValkeyServer() as srv:
        yield srv


@pytest.fixture
async def make(valkey_balanced: ValkeyServer) -> AsyncIterator[Callable[..., Any]]:
    async with linked_replicas(valkey_balanced.url, SECRET) as made:
        yield made


async def _linked(make: Callable[..., Any]) -> tuple[Replica, Replica, str, list[bytes]]:
    """``a`` has learned the link to a channel ``b`` holds; ``got``: what ``b`` received."""
    a, b = await make("a"), await make("b")
    ch, got = f"sb:client:ws-{uuid.uuid4().hex[:6]}/c", []
    await b.subscribe(ch, got.append)
    assert await a.publish(ch, CALL) == 1
    await eventually(lambda: a.links.route_of(ch) == b.replica_id, "a learned route")
    return a, b, ch, got


@pytest.mark.parametrize("wrapped", [BALANCED, BOUNCED], ids=["balanced", "bounced"])
async def test_a_replica_that_announced_no_version_gets_it_through_redis(make, wrapped: bytes) -> None:
    a, b, ch, got = await _linked(make)
    a.unicast.peer_versions.learn([{"id": b.replica_id}])  # a replica of the previous release
    assert await a.publish(ch, wrapped) == 1
    await eventually(lambda: got[-1:] == [wrapped], "the call through Redis")
    assert a.links.stats.direct == 0


@pytest.mark.parametrize("wrapped", [BALANCED, BOUNCED], ids=["balanced", "bounced"])
async def test_a_replica_that_reads_version_2_gets_it_over_the_link(make, wrapped: bytes) -> None:
    a, b, ch, got = await _linked(make)
    a.unicast.peer_versions.learn([{"id": b.replica_id, "reads": "2"}])
    assert await a.publish(ch, wrapped) == 1
    await eventually(lambda: got[-1:] == [wrapped], "the call over the link")
    assert a.links.stats.direct == 1
    assert b.links.stats.malformed == 0


async def test_a_balanced_call_a_link_gives_back_goes_through_redis_marked(make) -> None:
    a, b, ch, _ = await _linked(make)
    c, on_c = await make("c"), []
    a.unicast.peer_versions.learn([{"id": b.replica_id, "reads": "2"}])
    await b.unsubscribe(ch)  # the client left b ...
    await c.subscribe(ch, on_c.append)  # ... for c
    assert await a.publish(ch, BALANCED) == 1  # the stale link takes it, b sends it back
    await eventually(lambda: on_c == [BALANCED], "the call, its handle kept, on c")
    assert b.links.stats.nacked == 1

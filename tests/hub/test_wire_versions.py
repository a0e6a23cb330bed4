"""What other replicas publish is read once, at the edge, in this wire version or the one before
(``protocol/link/replica_wire.py``); what cannot be read is dropped and counted, and the reader goes on.

A hub on the embedded bus, on the fake clock; messages are published on it as another replica
would, their bytes written out here: the previous release's layout (version 1, no version field),
the next one's (``0xFF``, its number, then the same body), and one from further ahead.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from support.wire import Wire, attach_client, settle
from switchboard.backends.memory import MemoryBus, MemoryRegistry
from switchboard.hub.hub import Hub
from switchboard.hub.identity.users import Permission, User
from switchboard.hub.sessions.peer import Peer
from switchboard.protocol.hypha import envelope
from switchboard.server.app import build_hub
from switchboard.testing.clock import FakeClock
from switchboard.testing.hub import settings_for_tests

pytestmark = pytest.mark.timeout(10)

WS = "ws-1"
USER = User(id="alice", grants={WS: Permission.READ_WRITE})
NEXT = b"\xff\x02"  # the start of a version-2 body
AHEAD = b"\xff\x03"  # a version this replica does not read


@pytest.fixture
async def hub() -> Any:
    made = build_hub(settings_for_tests(replica_id="r"), clock=FakeClock(), bus=MemoryBus(), registry=MemoryRegistry())
    tasks: list[asyncio.Task[None]] = []
    made.tasks = tasks  # type: ignore[attr-defined]
    yield made
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def connect(hub: Hub, client_id: str) -> tuple[Peer, Wire]:
    peer, wire_, writer = await attach_client(hub, WS, client_id, USER)
    hub.tasks.append(writer)  # type: ignore[attr-defined]
    return peer, wire_


def call(to: str, method: str) -> bytes:
    """A call from a client of another replica, as it travels: an origin tag (empty: no link), the frame."""
    frame = envelope.encode({"type": "method", "from": f"{WS}/far", "to": to, "method": method, "session": "s1"})
    return b"\x00" + frame


async def test_a_clients_frame_in_the_next_wire_version_reaches_it(hub: Hub) -> None:
    peer, wire = await connect(hub, "c")
    assert await hub.bus.publish(f"sb:client:{peer.id}", NEXT + call(peer.id, "services.s.v2")) == 1
    assert await hub.bus.publish(f"sb:client:{peer.id}", call(peer.id, "services.s.v1")) == 1
    await settle()
    assert wire.methods() == ["services.s.v2", "services.s.v1"]
    assert hub.unicast.malformed == 0


async def test_a_deletion_in_the_next_wire_version_closes_the_workspaces_clients(hub: Hub) -> None:
    peer, _ = await connect(hub, "c")
    await hub.start()
    try:
        assert await hub.bus.publish("sb:deleted", NEXT + WS.encode()) == 1
        await settle()
        assert peer.closed, "the deleted workspace's client is closed"
    finally:
        await hub.stop()


async def test_what_cannot_be_read_is_counted_and_the_reader_goes_on(hub: Hub) -> None:
    """A newer version, a malformed relayed call, a deletion that is not text, a kick without its
    code: each dropped, counted, logged; the client's next frame still arrives."""
    peer, wire = await connect(hub, "c")
    await hub.start()
    try:
        channel = f"sb:client:{peer.id}"
        assert await hub.bus.publish(channel, AHEAD + call(peer.id, "services.s.ahead")) == 1
        assert await hub.bus.publish(channel, b"\x00\x00r2 no session, no frame") == 1
        assert await hub.bus.publish("sb:deleted", b"\xfe" + WS.encode()) == 1
        assert await hub.bus.publish("sb:kick", f"{WS}/c\nnow\nbye".encode()) == 1
        assert await hub.bus.publish(channel, call(peer.id, "services.s.after")) == 1
        await settle()
        assert wire.methods() == ["services.s.after"]
        assert not peer.closed
        assert hub.unicast.malformed == 4
    finally:
        await hub.stop()

"""Text control frames cost the client its rate, and a token refresh costs the hub no signature
it signed less than a minute ago (on the fake clock: no real waiting)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from support.wire import Wire
from switchboard.hub import reconnection
from switchboard.hub.identity.users import new_anonymous_user
from switchboard.hub.sessions.peer import Peer
from switchboard.server.app import build_hub
from switchboard.testing.clock import FakeClock
from switchboard.testing.hub import settings_for_tests

PING = json.dumps({"type": "ping"})
REFRESH = json.dumps({"type": "refresh_token"})


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@contextlib.asynccontextmanager
async def peer_of(hub: Any, *, entered: bool = False) -> AsyncIterator[tuple[Peer, Wire]]:
    """A peer whose writer runs (so frames reach the wire at once); ``entered``: let in by the
    gatekeeper, which gives it its rate bucket (the hub's settings)."""
    conn = Wire()
    peer = Peer(
        workspace="ws",
        client_id="c",
        user=new_anonymous_user(),
        transport=conn,
        max_queue_bytes=1 << 20,
    )
    if entered:
        await hub.gate.enter(peer)
    writer = asyncio.create_task(peer.run_writer())
    await asyncio.sleep(0)  # the writer starts
    try:
        yield peer, conn
    finally:
        peer.close()
        await writer


async def test_text_frames_take_from_the_rate_bucket_and_get_an_error_past_it(
    clock: FakeClock,
) -> None:
    hub = build_hub(settings_for_tests(max_messages_per_second=2, message_burst=3), clock=clock)
    async with peer_of(hub, entered=True) as (peer, conn):
        for _ in range(5):
            hub.handle_text(peer, PING)
        assert [f["type"] for f in conn.controls()] == ["pong"] * 3 + ["error"] * 2
        assert conn.controls()[-1]["message"] == "Rate limit exceeded: at most 2 messages/s (burst 3)"
        clock.advance(0.5)  # one frame's worth refilled
        hub.handle_text(peer, PING)
        hub.handle_text(peer, "not json")  # unknown text costs a token too
        assert [f["type"] for f in conn.controls()[5:]] == ["pong", "error"]
        assert not peer.closed


def counting_signatures(hub: Any, monkeypatch: pytest.MonkeyPatch) -> list[Peer]:
    """The peers the hub signs a reconnection token for, one entry per signature."""
    signed: list[Peer] = []
    sign = hub.gate.reconnection_token
    monkeypatch.setattr(hub.gate, "reconnection_token", lambda peer: signed.append(peer) or sign(peer))
    return signed


async def test_a_refresh_reuses_the_token_signed_within_the_last_minute(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = build_hub(settings_for_tests(), clock=clock)
    signed = counting_signatures(hub, monkeypatch)
    async with peer_of(hub) as (peer, conn):
        for _ in range(50):
            hub.handle_text(peer, REFRESH)
        clock.advance(reconnection.TOKEN_REUSE - 0.01)
        hub.handle_text(peer, REFRESH)
        assert len(signed) == 1
        assert len(conn.controls()) == 51
        assert len({f["reconnection_token"] for f in conn.controls()}) == 1
        clock.advance(0.01)
        hub.handle_text(peer, REFRESH)
        assert len(signed) == 2


async def test_a_short_token_lifetime_shortens_the_reuse(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    hub = build_hub(settings_for_tests(reconnection_token_lifetime=60), clock=clock)
    signed = counting_signatures(hub, monkeypatch)
    async with peer_of(hub) as (peer, _):
        hub.handle_text(peer, REFRESH)
        clock.advance(6)  # a tenth of the lifetime: a reused token keeps at least 90% of it
        hub.handle_text(peer, REFRESH)
        assert len(signed) == 2

"""A client's life on a replica, as both doors (``/ws``, ``GET /rpc``) live it: ``ClientSession``.

Entering admits, attaches and tracks the client; leaving, whatever the reason,
untracks and detaches it exactly once, after the door has finished what the
client sent before it left. A refusal comes out of the ``async with`` line and
leaves nothing behind. Driven here on an embedded hub without sockets (the
doors themselves: tests/server/test_refusal.py, test_bad_input.py,
test_http_rpc.py).
"""

from __future__ import annotations

import asyncio

import pytest

from support.wire import Wire
from switchboard.errors import HandshakeError
from switchboard.hub.hub import Hub
from switchboard.hub.identity.users import Permission, User
from switchboard.hub.sessions.life import Stage
from switchboard.hub.sessions.peer import Peer
from switchboard.protocol.hypha import handshake
from switchboard.protocol.hypha.handshake import Hello
from switchboard.server.app import build_hub
from switchboard.server.common.session import ClientSession
from switchboard.server.process.server_state import ServerState
from switchboard.testing import FakeClock
from switchboard.testing.hub import settings_for_tests

pytestmark = pytest.mark.timeout(30)


class Boom(Exception):
    """A failure inside a connection's block (a bug, a broken socket)."""


@pytest.fixture
async def state() -> ServerState:
    return ServerState(build_hub(settings_for_tests(), clock=FakeClock()))


def hello(client_id: str, *, token: str | None = None, workspace: str | None = None) -> Hello:
    return Hello(client_id=client_id, workspace=workspace, token=token, reconnection_token=None)


WS = "team"


def member(state: ServerState, user_id: str) -> str:
    """A token of ``user_id`` with read-write access to :data:`WS`, signed by the hub."""
    user = User(id=user_id, roles=("user",))
    return state.hub.gate.issuer.issue(user, workspace=WS, permission=Permission.READ_WRITE, expires_in=600)


def detaches_counted(hub: Hub) -> list[Peer]:
    """Every peer the hub detaches, in order (the real detach runs)."""
    detached: list[Peer] = []
    real = hub.detach

    async def detach(peer: Peer) -> None:
        detached.append(peer)
        await real(peer)

    hub.detach = detach  # type: ignore[method-assign]
    return detached


def untouched(state: ServerState) -> None:
    hub = state.hub
    assert not state.peers, f"still tracked: {state.peers}"
    assert not hub.peers, f"still attached: {list(hub.peers)}"


async def test_inside_the_block_the_client_is_attached_and_tracked_and_after_it_neither(
    state: ServerState,
) -> None:
    detached = detaches_counted(state.hub)
    async with ClientSession(state, hello("alice"), Wire()) as session:
        peer = session.peer
        assert state.hub.peers[peer.id] is peer
        assert state.peers == {peer}
        assert session.info is not None
        assert session.info["type"] == "connection_info"
        assert session.info["client_id"] == "alice"
    untouched(state)
    assert detached == [peer]
    assert peer.closed


async def test_a_refused_admission_tracks_nothing_and_leaves_nothing_to_detach(state: ServerState) -> None:
    detached = detaches_counted(state.hub)
    session = ClientSession(state, hello("mallory", token="not-a-token"), Wire())
    with pytest.raises(HandshakeError) as refused:
        async with session:
            pytest.fail("a refused client never enters the block")
    assert refused.value.close_code == handshake.CLOSE_POLICY
    assert not session.admitted
    assert not session.attached
    untouched(state)
    assert detached == []


async def test_a_refused_attach_leaves_the_live_client_alone(state: ServerState) -> None:
    """An id held by another user is refused after the admission: the holder keeps it, undisturbed."""
    detached = detaches_counted(state.hub)
    async with ClientSession(state, hello("shared", token=member(state, "alice"), workspace=WS), Wire()) as holder:
        intruder = ClientSession(state, hello("shared", token=member(state, "mallory"), workspace=WS), Wire())
        with pytest.raises(HandshakeError, match="belongs to another user"):
            async with intruder:
                pytest.fail("a refused client never enters the block")
        assert intruder.admitted, "the admission let mallory into the workspace; the attach refused the id"
        assert not intruder.attached
        assert state.peers == {holder.peer}
        assert state.hub.peers[holder.peer.id] is holder.peer
        assert not holder.peer.closed
        assert detached == []
    untouched(state)


async def test_an_attach_that_fails_once_the_client_is_live_lets_it_go(state: ServerState) -> None:
    """A failure (or a cancel) after the hub made the peer its live connection for the id, before
    the attach returned: the half-attached client is detached, its slot and id freed."""
    hub = state.hub
    detached = detaches_counted(hub)

    async def broken(channel: str) -> None:
        raise Boom

    hub.unicast.subscribe = broken  # type: ignore[method-assign]
    session = ClientSession(state, hello("half"), Wire())
    with pytest.raises(Boom):
        async with session:
            pytest.fail("a failed attach never enters the block")
    assert not session.attached
    untouched(state)
    assert [p.client_id for p in detached] == ["half"]
    assert len(hub.from_replicas) == 0, "its channel's entry in the inbound port is gone with it"


async def test_a_failure_inside_the_block_still_detaches_the_client_once(state: ServerState) -> None:
    detached = detaches_counted(state.hub)
    session = ClientSession(state, hello("fragile"), Wire())
    peers: list[Peer] = []

    async def connection() -> None:
        async with session:
            peers.append(session.peer)
            raise Boom

    with pytest.raises(Boom):
        await connection()
    assert session.attached
    untouched(state)
    assert detached == peers


async def test_a_cancelled_connection_is_detached_too(state: ServerState) -> None:
    """The server's shutdown cancels the connection's task: the client is still let go of."""
    detached = detaches_counted(state.hub)
    inside = asyncio.Event()
    peers: list[Peer] = []

    async def connection() -> None:
        async with ClientSession(state, hello("cancelled"), Wire()) as session:
            peers.append(session.peer)
            inside.set()
            await asyncio.Event().wait()  # a client that never leaves by itself

    task = asyncio.create_task(connection())
    await asyncio.wait_for(inside.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    untouched(state)
    assert detached == peers


async def test_what_the_client_sent_before_it_left_is_settled_after_the_untrack_and_before_the_detach(
    state: ServerState,
) -> None:
    seen: list[str] = []
    hub = state.hub
    real = hub.detach

    async def detach(peer: Peer) -> None:
        seen.append("detach")
        await real(peer)

    hub.detach = detach  # type: ignore[method-assign]

    class Inbox:
        def __init__(self, peer: Peer) -> None:
            self.peer = peer

        async def settle(self) -> None:
            assert self.peer not in state.peers, "a drain waiting for the peers does not wait for its frames"
            assert hub.peers.get(self.peer.id) is self.peer, "its frames are routed while it is attached"
            seen.append("settle")

    async with ClientSession(state, hello("leaving"), Wire()) as session:
        session.settle = Inbox(session.peer)
    assert seen == ["settle", "detach"]
    untouched(state)


async def test_a_settle_that_fails_still_lets_the_client_go(state: ServerState) -> None:
    detached = detaches_counted(state.hub)

    class Inbox:
        async def settle(self) -> None:
            raise Boom

    peers: list[Peer] = []

    async def connection() -> None:
        async with ClientSession(state, hello("unsettled"), Wire()) as session:
            peers.append(session.peer)
            session.settle = Inbox()

    with pytest.raises(Boom):
        await connection()
    untouched(state)
    assert detached == peers


async def test_a_session_is_entered_once_and_holds_no_token_while_it_lives(state: ServerState) -> None:
    session = ClientSession(state, hello("once", token=None), Wire())
    async with session:
        assert all(getattr(session, slot, None) is None for slot in ("_hello", "_transport"))
        with pytest.raises(RuntimeError):
            await session.__aenter__()
    with pytest.raises(RuntimeError):
        _ = session.peer


def test_a_session_keeps_no_dict() -> None:
    """It lives as long as its connection, for each of thousands of idle clients."""
    assert not hasattr(ClientSession.__new__(ClientSession), "__dict__")


async def test_a_connections_life_goes_from_joining_through_live_to_gone_as_its_door_lives_it(
    state: ServerState,
) -> None:
    session = ClientSession(state, hello("lively"), Wire())
    async with session:
        life = session.peer.life
        assert (life.stage, session.admitted, session.attached) == (Stage.LIVE, True, True)
    assert life.stage is Stage.GONE, "the hub closed it (no drop): its client left"
    assert len(state.hub.from_replicas) == 0, "nothing more is listened to for it"


async def test_a_dropped_connection_leaves_its_client_in_transit_until_its_grace_ends() -> None:
    clock = FakeClock()
    state = ServerState(build_hub(settings_for_tests(transit_grace=5.0), clock=clock))
    async with ClientSession(state, hello("dropped"), Wire()) as session:
        life = session.peer.life
        session.peer.client_closed(1006)  # the stream broke: no goodbye
    assert (life.stage, life.until) == (Stage.IN_TRANSIT, clock.monotonic() + 5.0)
    untouched(state)
    assert session.attached, "it was attached: what ended it is no refusal"

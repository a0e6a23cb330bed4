"""A connect or a leave costs the same in a full workspace as in an empty one (issue 26).

What a connect does (admission, the built-in registration, the events it makes,
the manager calls an unmodified hypha-rpc client makes) must not walk the
clients already there: a workspace of 10,000 would make every connect cost
10,000 steps. Measured deterministically, as the lines of Switchboard's own
code that one real hypha-rpc client's connect (or leave) executes, with 50 and
then 500 clients already in its workspace (attached as the server attaches
one, each with its built-in service and subscribed to an event of its own;
not to ``client_disconnected``, whose delivery to each subscriber is the cost
of that event, not of the workspace). Each count is the least of a few tries,
so a timer of the hub that happens to fire meanwhile (a status sample) adds
nothing.

And a connect's manager calls cost what they must: none of them goes through
the manager's hypha-rpc RPC once one connect was answered (the door answers
them; through the RPC they were about half of a connect's hub CPU), and the
manager's service kept for every caller gives none of them another's rights.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from hypha_rpc import connect_to_server

import switchboard
from support.wire import Wire, attach_client
from switchboard.clock import SystemClock
from switchboard.hub.identity.auth import TokenIssuer
from switchboard.hub.identity.users import Permission, User
from switchboard.protocol.hypha import envelope
from switchboard.protocol.hypha.services import ServiceQuery
from switchboard.testing.crowd import admin_token, open_raw
from switchboard.testing.hub import TEST_SECRET, RunningServer, running, settings_for_tests
from switchboard.testing.wait import eventually

pytestmark = pytest.mark.timeout(120)

WS = "crowd"
USER = User(id="crowd-user", grants={WS: Permission.READ_WRITE})
FEW, MANY = 50, 500
TRIES = 3
# Lines of hub code one more client already in the workspace may add to a connect or a leave:
# none is needed; a walk of the workspace costs at least two per client (the loop and its test).
PER_CLIENT_THERE = 0.5

SOURCE = str(Path(switchboard.__file__).parent)
EXCLUDED = str(Path(switchboard.__file__).parent / "testing")


class LineCount:
    """Counts the lines of Switchboard's code (not its test helpers) this thread executes meanwhile."""

    def __init__(self) -> None:
        self.lines = 0

    def _call(self, frame: FrameType, event: str, arg: Any) -> Any:
        name = frame.f_code.co_filename
        if name.startswith(SOURCE) and not name.startswith(EXCLUDED):
            return self._line
        return None

    def _line(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            self.lines += 1
        return self._line

    async def measure(self, work: Callable[[], Awaitable[Any]]) -> int:
        self.lines = 0
        sys.settrace(self._call)
        try:
            await work()
        finally:
            sys.settrace(None)
        return self.lines


@pytest.fixture
async def server() -> AsyncIterator[RunningServer]:
    async with running(settings_for_tests()) as srv:
        yield srv


def token() -> str:
    issuer = TokenIssuer(TEST_SECRET, SystemClock())
    return issuer.issue(
        User(id="crowd-user", roles=("user",)), workspace=WS, permission=Permission.READ_WRITE, expires_in=600
    )


async def fill(server: RunningServer, up_to: int, writers: list[asyncio.Task[None]]) -> Wire | None:
    """Clients in the workspace up to ``up_to``; the first one, the witness, hears departures."""
    hub = server.hub
    witness = None
    for i in range(len(writers), up_to):
        events = ("news", "client_disconnected") if i == 0 else ("news",)
        _, wire, writer = await attach_client(hub, WS, f"there-{i}", USER, events=events)
        witness = witness or wire
        writers.append(writer)
    assert len(hub.peers) == up_to
    return witness


def departures(witness: Wire) -> int:
    return witness.methods().count("client_disconnected")


async def cheapest(server: RunningServer, witness: Wire, tag: str) -> tuple[int, int]:
    """The fewest lines a connect, and a leave (until its departure is announced), of a real
    hypha-rpc client took over :data:`TRIES` tries."""
    connects, leaves = [], []
    for attempt in range(TRIES):
        client_id = f"newcomer-{tag}-{attempt}"
        clients: list[Any] = []

        async def connect(client_id: str = client_id, clients: list[Any] = clients) -> None:
            config = {"server_url": server.url, "client_id": client_id, "token": token(), "workspace": WS}
            clients.append(await connect_to_server(config))

        async def leave(client_id: str = client_id, clients: list[Any] = clients) -> None:
            before = departures(witness)
            await clients[0].disconnect()
            await eventually(lambda: departures(witness) > before, what="the newcomer's departure announced")

        connects.append(await LineCount().measure(connect))
        leaves.append(await LineCount().measure(leave))
    return min(connects), min(leaves)


async def test_a_connect_and_a_leave_cost_the_same_with_500_clients_in_the_workspace_as_with_50(
    server: RunningServer,
) -> None:
    writers: list[asyncio.Task[None]] = []
    try:
        witness = await fill(server, FEW, writers)
        assert witness is not None
        few = await cheapest(server, witness, "few")
        await fill(server, MANY, writers)
        many = await cheapest(server, witness, "many")
    finally:
        for writer in writers:
            writer.cancel()
        await asyncio.gather(*(server.hub.detach(peer) for peer in list(server.hub.peers.values())))
    grew = [
        f"a {what} executed {at_few} lines of hub code with {FEW} clients in the workspace and {at_many} with "
        f"{MANY}: {(at_many - at_few) / (MANY - FEW):.1f} more per client already there (at most {PER_CLIENT_THERE})"
        for what, at_few, at_many in (("connect", few[0], many[0]), ("leave", few[1], many[1]))
        if (at_many - at_few) / (MANY - FEW) >= PER_CLIENT_THERE
    ]
    assert not grew, "; ".join(grew)


# --------------------------------------------------------------------------- the manager's share of a connect

# Frames of one hypha-rpc connect that reach the manager's RPC once the hub has answered one
# connect before: none. register_service and subscribe carry plain data, and the door answers
# them itself (through the RPC, their arguments became proxy objects and back: a third of a
# connect's hub CPU); the two get_service("default") get the manager's service as the RPC
# encoded it the first time (encoding it again took a fifth).
RPC_FRAMES_PER_CONNECT = 0


def token_as(user_id: str, permission: Permission) -> str:
    issuer = TokenIssuer(TEST_SECRET, SystemClock())
    return issuer.issue(User(id=user_id, roles=("user",)), workspace=WS, permission=permission, expires_in=600)


def count_rpc_frames(server: RunningServer) -> list[str]:
    """The methods of the frames the manager's RPC is handed from now on."""
    link = server.hub.manager.link
    rpc_handler = link.handler
    assert rpc_handler is not None
    methods: list[str] = []

    def counting(message: bytes | dict[str, Any]) -> None:
        main = message if isinstance(message, dict) else envelope.decode(message).main
        methods.append(str(main.get("method")))
        rpc_handler(message)

    link.handler = counting
    return methods


async def test_a_connect_hands_the_managers_rpc_nothing_once_one_connect_was_answered(server: RunningServer) -> None:
    first = await connect_to_server({"server_url": server.url, "client_id": "first", "token": token(), "workspace": WS})
    methods = count_rpc_frames(server)
    config = {"server_url": server.url, "client_id": "counted", "token": token(), "workspace": WS}
    client = await connect_to_server(config)
    try:
        assert len(methods) <= RPC_FRAMES_PER_CONNECT, (
            f"one connect handed the manager's RPC {len(methods)} frames ({methods}), at most "
            f"{RPC_FRAMES_PER_CONNECT}: register_service and subscribe are the door's to answer, and the "
            "manager's service is encoded once"
        )
        # what the door answered works as the RPC's answer did: registered, listed, subscribed, callable
        listed = await client.list_services({"workspace": WS})
        assert f"{WS}/counted:built-in" in [s["id"] for s in listed]
        assert server.hub.subscribers.names_of(server.hub.peers[f"{WS}/counted"]) >= {"client_disconnected"}
        assert await client.echo("through the kept answer") == "through the kept answer"
    finally:
        await client.disconnect()
        await first.disconnect()


async def test_the_kept_manager_service_gives_a_weaker_user_no_more_than_its_own_rights(
    server: RunningServer,
) -> None:
    """The manager's service an admin was answered with, kept and sent to a read-only member: the
    same functions, none of the admin's rights (they are checked on each call, on the caller's)."""
    admin = await connect_to_server(
        {"server_url": server.url, "client_id": "admin", "token": token_as("boss", Permission.ADMIN), "workspace": WS}
    )
    methods = count_rpc_frames(server)
    reader = await connect_to_server(
        {"server_url": server.url, "client_id": "reader", "token": token_as("guest", Permission.READ), "workspace": WS}
    )
    try:
        assert "services.built-in.get_service" not in methods, "the reader's get_service went to the RPC"
        assert sorted(k for k in admin if callable(admin[k])) == sorted(k for k in reader if callable(reader[k]))
        assert await admin.generate_token({"permission": "read"})
        with pytest.raises(Exception, match="Only admin can generate token"):
            await reader.generate_token({"permission": "admin"})
        with pytest.raises(Exception, match="Permission denied"):
            await reader.register_service({"id": "sneaky", "config": {"visibility": "public"}, "hello": lambda: 1})
        assert await reader.check_status() == {"status": "ready", "user_permission": "r"}
    finally:
        await reader.disconnect()
        await admin.disconnect()


async def test_a_plain_call_sent_without_a_promise_still_runs(server: RunningServer) -> None:
    """A call whose answer is not wanted (no promise: hypha-rpc's notifications, a raw client's
    ``register_service``) is run all the same when the door answers it instead of the RPC."""
    raw = await open_raw(server.url, "raw", admin_token("raw-user"))
    try:
        await raw.register("kept")  # no promise: nothing comes back
        registered = {f"{raw.address}:built-in", f"{raw.address}:kept"}

        async def listed() -> bool:
            found = await server.hub.registry.find(ServiceQuery(raw.address.partition("/")[0]))
            return registered <= {s["id"] for s in found}

        await eventually(listed, "both services of the raw client registered", timeout=5)
    finally:
        await raw.ws.close()

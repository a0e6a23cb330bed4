"""A client id belongs to the user that first connected with it: another member cannot become that client.

The victim is a provider of workspace ``W`` (a hypha-rpc client with a
read-write token minted by W's owner) offering a protected service whose
``act`` records its calls. The attacker is a member of ``W`` holding only a
``read`` token (``generate_token({"permission": "read"})``) that connects with
the victim's client id, at the moments when the hub used to hand the id over
after an unanswered 2 s ping: while the victim's connection is down (a client
in transit never answers, its ping is held for it), while the victim's event
loop is blocked, and over HTTP streaming (``GET /rpc``). It is refused every
time, gets nothing that was held for the victim, and the victim's
registrations stay; the victim itself, coming back with its reconnection
token, gets its held call. The same user connecting again with the same id
(its own token, no reconnection token) still takes it over, but what was held
for the earlier session does not go to it.

Across two replicas: ``tests/cluster/test_client_ids_across_replicas.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from hypha_rpc import connect_to_server
from hypha_rpc.rpc import RemoteException

from switchboard.testing.hub import RunningServer, running, settings_for_tests
from switchboard.testing.proxy import FaultProxy
from switchboard.testing.wait import eventually

pytestmark = pytest.mark.timeout(90)

# The default: the victim is still in transit whenever the attacker tries (the base took 2 s, its ping).
GRACE = 5.0


@pytest.fixture
async def server() -> AsyncIterator[RunningServer]:
    async with running(settings_for_tests(transit_grace=GRACE)) as srv:
        yield srv


@pytest.fixture
async def proxy(server: RunningServer) -> AsyncIterator[FaultProxy]:
    async with FaultProxy("127.0.0.1", server.hub.settings.port, connect_timeout=2.0) as p:
        yield p


class Workspace:
    """W's owner, a provider in W reached through a fault proxy, and tokens for W."""

    def __init__(self, server: RunningServer, proxy: FaultProxy) -> None:
        self.server, self.proxy = server, proxy
        self.calls: list[Any] = []
        self.clients: list[Any] = []

    async def client(self, url: str, **config: Any) -> Any:
        client = await connect_to_server({"server_url": url, "method_timeout": 20, **config})
        self.clients.append(client)
        return client

    async def start(self) -> Workspace:
        self.owner = await self.client(self.server.url, client_id="owner")
        self.ws = self.owner.config["workspace"]
        self.rw_token = await self.owner.generate_token({"permission": "read_write"})
        self.read_token = await self.owner.generate_token({"permission": "read"})
        self.victim = await self.client(
            f"http://127.0.0.1:{self.proxy.port}", client_id="victim", token=self.rw_token, workspace=self.ws
        )

        def act(arg: Any) -> str:
            self.calls.append(arg)
            return "the victim's answer"

        await self.victim.register_service({"id": "prot", "config": {"visibility": "protected"}, "act": act})
        self.service = await self.owner.get_service("victim:prot")
        assert await self.service.act("warm-up") == "the victim's answer"
        return self

    @property
    def victim_id(self) -> str:
        return f"{self.ws}/victim"

    async def drop_victim(self) -> None:
        """The victim's connection dies and it cannot come back yet: it is in transit."""
        self.proxy.drop_new(True)
        self.proxy.reset_all()
        await eventually(lambda: self.victim_id in self.server.hub.transit, what="the victim in transit", timeout=10)

    async def victim_listed(self) -> bool:
        return "prot" in {s["id"].rpartition(":")[2] for s in await self.owner.list_services()}

    async def close(self) -> None:
        self.proxy.pass_through()
        for client in reversed(self.clients):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.disconnect(), 5)


@pytest.fixture
async def w(server: RunningServer, proxy: FaultProxy) -> AsyncIterator[Workspace]:
    scene = Workspace(server, proxy)
    try:
        yield await scene.start()
    finally:
        await scene.close()


async def test_a_read_member_cannot_take_the_id_of_a_client_in_transit(w: Workspace) -> None:
    await w.drop_victim()
    held = asyncio.ensure_future(w.service.act("held for the victim"))
    await eventually(lambda: w.server.hub.transit.holding >= 1, what="the call held for the victim", timeout=5)
    with pytest.raises(ConnectionAbortedError, match="belongs to another user"):
        await w.client(w.server.url, client_id="victim", token=w.read_token, workspace=w.ws)
    assert w.victim_id in w.server.hub.transit, "the victim is still in transit, its held call with it"
    assert await w.victim_listed(), "the victim's services were not purged"
    w.proxy.pass_through()  # the real victim comes back with its reconnection token
    assert await asyncio.wait_for(held, 20) == "the victim's answer"
    assert w.calls == ["warm-up", "held for the victim"]


async def test_a_read_member_cannot_take_the_id_over_http_streaming(w: Workspace) -> None:
    await w.drop_victim()
    query = {"client_id": "victim", "workspace": w.ws}
    headers = {"Authorization": f"Bearer {w.read_token}"}
    async with (
        httpx.AsyncClient(timeout=10) as http,
        http.stream("GET", f"{w.server.url}/rpc", params=query, headers=headers) as response,
    ):
        body = (await response.aread()) if response.status_code != 200 else b""
    assert response.status_code == 409, f"the stream was opened as the victim ({response.status_code})"
    assert b"belongs to another user" in body
    assert w.victim_id in w.server.hub.transit
    assert await w.victim_listed()


async def test_an_outsider_cannot_take_the_id_either(w: Workspace) -> None:
    await w.drop_victim()
    with pytest.raises(ConnectionAbortedError, match="Permission denied"):
        await w.client(w.server.url, client_id="victim", workspace=w.ws)
    assert await w.victim_listed()


async def test_the_same_user_takes_its_id_back_but_not_what_was_held_for_the_earlier_session(w: Workspace) -> None:
    """Its own token, no reconnection token: a new session of the same client (the held call's
    frames are not handed to it: ``tests/hub/test_moves.py`` counts them)."""
    await w.drop_victim()
    held = asyncio.ensure_future(w.service.act("held for the earlier session"))
    await eventually(lambda: w.server.hub.transit.holding >= 1, what="the call held for the victim", timeout=5)
    again = await w.client(w.server.url, client_id="victim", token=w.rw_token, workspace=w.ws)
    assert again.config["client_id"] == "victim"
    with pytest.raises((RemoteException, ConnectionError)):
        await asyncio.wait_for(held, 10)
    assert w.victim_id not in w.server.hub.transit
    assert w.calls == ["warm-up"]


async def connect_and_leave(config: dict[str, Any]) -> None:
    client = await connect_to_server(config)
    await client.disconnect()


VICTIM = """
import asyncio, sys
from hypha_rpc import connect_to_server

async def main():
    api = await connect_to_server(
        {"server_url": sys.argv[1], "token": sys.argv[2], "workspace": sys.argv[3], "client_id": "victim"}
    )
    await api.register_service(
        {"id": "prot", "config": {"visibility": "protected"}, "act": lambda arg: "the victim's answer"}
    )
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_a_read_member_cannot_take_the_id_of_a_client_whose_loop_is_blocked(server: RunningServer) -> None:
    owner = await connect_to_server({"server_url": server.url, "client_id": "owner"})
    ws = owner.config["workspace"]
    rw = await owner.generate_token({"permission": "read_write"})
    read = await owner.generate_token({"permission": "read"})
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", VICTIM, server.url, rw, ws, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        assert (await asyncio.wait_for(proc.stdout.readline(), 30)).strip() == b"ready"
        service = await owner.get_service("victim:prot")
        os.kill(proc.pid, signal.SIGSTOP)  # alive, connected, and answering nothing
        try:
            with pytest.raises(ConnectionAbortedError, match="belongs to another user"):
                await connect_and_leave(
                    {"server_url": server.url, "client_id": "victim", "token": read, "workspace": ws}
                )
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert await service.act("after") == "the victim's answer"
    finally:
        proc.kill()
        await proc.wait()
        await owner.disconnect()

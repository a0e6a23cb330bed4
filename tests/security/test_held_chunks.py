"""A message in pieces sent to a provider while it reconnects cannot name its sender.

The provider is an unmodified hypha-rpc client offering a protected
``require_context`` service ``prot`` in workspace ``W``; it reaches the hub
through the project's fault proxy, which drops its connection at TCP level
(no close frame: the hub keeps it in transit and holds frames for it) and lets
it reconnect, with its reconnection token as hypha-rpc does, to the same hub
(``single``) or to the other of two replica processes on one Valkey
(``cluster``). The attacker is an anonymous raw WebSocket client that sends
``message_cache`` pieces whose joined payload sets ``from``, ``ws``, ``user``
and ``ctx``: connected, the hub refuses exactly these; held in transit, or
split around the move, they must be refused as well, and ``act`` must never run.

On 9ff5e27 every attack here succeeds (``act`` runs as W's owner): held
frames were delivered unchecked, the provider's next connection started with an
empty walk, and a key the hub had forgotten could be created again over pieces
the provider still held. The honest large call passes there and here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgpack
import pytest
import pytest_asyncio
from hypha_rpc import connect_to_server
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from switchboard.protocol.hypha.chunks import MESSAGE_CACHE as CACHE
from switchboard.testing import FaultProxy, ValkeyServer
from switchboard.testing.hub import running, settings_for_tests
from switchboard.testing.replica import ReplicaProcess
from switchboard.testing.wait import eventually

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(120),
    pytest.mark.no_asyncio_debug(
        "the provider, an unmodified hypha-rpc client in this process, is moved between replicas: on debug mode's"
        " slower loop its reconnection once ran twice at once and its answer went out on the replaced socket"
    ),
]

SECRET = "the-secret-of-w"
GRACE = 5.0  # seconds a client may take to come back (the default): ample for a test's move


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


class Raw:
    """An anonymous raw WebSocket client; a task reads every frame and collects answers by session."""

    def __init__(self, ws: Any, info: dict[str, Any]) -> None:
        self.ws = ws
        self.id = f"{info['workspace']}/{info['client_id']}"
        self.received: list[bytes] = []
        self.texts: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.answers: dict[str, asyncio.Future[tuple[str, Any]]] = {}
        self.seq = 0
        self.reader = asyncio.ensure_future(self._read())

    @classmethod
    async def open(cls, url: str, client_id: str) -> Raw:
        ws = await ws_connect(url.replace("http", "ws", 1) + "/ws", open_timeout=5, close_timeout=2, max_size=None)
        await ws.send(json.dumps({"client_id": client_id, "workspace": None, "token": None}))
        info = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert info.get("type") == "connection_info", info
        return cls(ws, info)

    async def close(self) -> None:
        self.reader.cancel()
        with contextlib.suppress(Exception):
            await self.ws.close()

    async def _read(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for data in self.ws:
                if isinstance(data, str):
                    self.texts.put_nowait(json.loads(data))
                    continue
                self.received.append(data)
                unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
                unpacker.feed(data)
                parts = list(unpacker)
                method = str(parts[0].get("method", ""))
                session, _, kind = method.rpartition(".")
                if kind in ("resolve", "reject") and len(parts) > 1:
                    args = parts[1].get("args") or [None]
                    future = self._future(session)
                    if not future.done():
                        future.set_result((kind, args[0]))

    def _future(self, session: str) -> asyncio.Future[tuple[str, Any]]:
        if session not in self.answers:
            self.answers[session] = asyncio.get_running_loop().create_future()
        return self.answers[session]

    def session(self) -> str:
        self.seq += 1
        return f"atk-{self.seq}"

    async def call(self, to: str, method: str, *args: Any) -> str:
        """A call whose answer comes back here; its session."""
        session = self.session()
        promise = {
            "resolve": {"_rtype": "method", "_rtarget": self.id, "_rmethod": f"{session}.resolve"},
            "reject": {"_rtype": "method", "_rtarget": self.id, "_rmethod": f"{session}.reject"},
        }
        head = {"type": "method", "to": to, "method": method, "session": session}
        await self.ws.send(pack(head) + pack({"args": list(args), "with_kwargs": False, "promise": promise}))
        return session

    async def answer(self, session: str, timeout: float = 20.0) -> tuple[str, str]:
        kind, value = await asyncio.wait_for(asyncio.shield(self._future(session)), timeout)
        return kind, str(value.get("_rvalue", value) if isinstance(value, dict) else value)

    async def settle(self) -> list[dict[str, Any]]:
        """The hub's error frames for what was sent so far (its pong comes after them)."""
        await self.ws.send(json.dumps({"type": "ping"}))
        texts = []
        for _ in range(1000):
            text = await asyncio.wait_for(self.texts.get(), 10)
            if text.get("type") == "pong":
                return texts
            texts.append(text)
        raise AssertionError("no pong after 1000 text frames")


@dataclass
class Stage:
    """W's provider behind a fault proxy, on ``urls[at]``; ``move`` sends it to ``urls[(at + 1) % n]``."""

    urls: list[str]
    proxy: FaultProxy
    owner: Any
    provider: Any
    workspace: str
    calls: list[dict[str, Any]]
    http: httpx.AsyncClient
    at: int = 0
    clients: list[Any] = field(default_factory=list)
    attackers: int = 0

    @property
    def provider_id(self) -> str:
        return f"{self.workspace}/provider"

    @property
    def next_url(self) -> str:
        """Where the provider comes back: the same hub, or the other replica."""
        return self.urls[(self.at + 1) % len(self.urls)]

    def forged(self) -> dict[str, Any]:
        """The identity of W's owner, as the attacker would have the provider believe."""
        user = json.loads(json.dumps(self.owner.config["user"]))
        who = {"from": f"{self.workspace}/owner", "ws": self.workspace, "user": user}
        return {**who, "ctx": {**who, "to": self.provider_id}}

    @contextlib.asynccontextmanager
    async def attacker(self) -> AsyncIterator[Raw]:
        self.attackers += 1
        raw = await Raw.open(self.next_url, f"atk-{self.attackers}")
        try:
            yield raw
        finally:
            await raw.close()

    async def drop(self) -> None:
        """Cut the provider's TCP connection; its reconnection waits in the proxy until :meth:`back`.
        Returns once the replica it comes back to knows it is in transit (frames for it are held there)."""
        self.proxy.blackhole()
        assert self.proxy.reset_all() >= 1

        async def in_transit() -> bool:
            text = (await self.http.get(f"{self.next_url}/metrics")).text
            found = re.search(r"^switchboard_clients_in_transit\{[^}]*\} (\S+)$", text, re.M)
            return found is not None and float(found.group(1)) >= 1

        await eventually(in_transit, "the provider in transit where it will come back")

    async def back(self) -> None:
        """Let the provider reconnect, to :attr:`next_url`, and wait until it answers again."""
        self.at = (self.at + 1) % len(self.urls)
        self.proxy.upstream_port = int(self.urls[self.at].rsplit(":", 1)[1])
        self.proxy.pass_through()

        async def answers() -> bool:
            pub = await self.owner.get_service(f"{self.provider_id}:pub")
            return bool(await pub.ping() == "pong")

        await eventually(answers, "the provider answering again", timeout=30)


async def open_stage(urls: list[str]) -> AsyncIterator[Stage]:
    clients: list[Any] = []
    async with contextlib.AsyncExitStack() as stack:
        upstream = int(urls[0].rsplit(":", 1)[1])
        proxy = await stack.enter_async_context(FaultProxy("127.0.0.1", upstream))
        owner = await connect_to_server({"server_url": urls[-1], "client_id": "owner", "method_timeout": 20})
        clients.append(owner)
        workspace = owner.config["workspace"]
        token = await owner.generate_token({"permission": "read_write", "expires_in": 3600})
        provider = await connect_to_server(
            {
                "server_url": f"http://127.0.0.1:{proxy.port}",
                "client_id": "provider",
                "token": token,
                "method_timeout": 20,
            }
        )
        clients.append(provider)
        calls: list[dict[str, Any]] = []

        def act(*args: Any, context: dict[str, Any] | None = None) -> str:
            calls.append({"from": (context or {}).get("from"), "user": ((context or {}).get("user") or {}).get("id")})
            return SECRET

        await provider.register_service(
            {"id": "prot", "config": {"visibility": "protected", "require_context": True}, "act": act}
        )
        await provider.register_service(
            {"id": "pub", "config": {"visibility": "public"}, "ping": lambda: "pong", "size": lambda data: len(data)}
        )
        http = await stack.enter_async_context(httpx.AsyncClient(timeout=10))
        stage = Stage(urls, proxy, owner, provider, workspace, calls, http, clients=clients)
        try:
            yield stage
        finally:
            for api in reversed(clients):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(api.disconnect(), 5)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def single() -> AsyncIterator[Stage]:
    async with running(settings_for_tests(transit_grace=GRACE)) as server:
        async for stage in open_stage([server.url]):
            yield stage


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster() -> AsyncIterator[Stage]:
    with ValkeyServer() as valkey:
        env = {"SWITCHBOARD_TRANSIT_GRACE": str(GRACE)}
        a = ReplicaProcess(replica_id="held-a", redis_url=valkey.url, env=env)
        b = ReplicaProcess(replica_id="held-b", redis_url=valkey.url, env=env)
        try:
            a.start(wait=False)
            b.start(wait=False)
            a.wait_ready()
            b.wait_ready()
            async for stage in open_stage([a.url, b.url]):
                yield stage
        finally:
            a.kill()
            b.kill()


@pytest.fixture(params=["single", pytest.param("cluster", marks=pytest.mark.cluster)])
def st(request: pytest.FixtureRequest) -> Stage:
    return request.getfixturevalue(request.param)


def forged_message(st: Stage, atk: Raw, session: str) -> tuple[bytes, bytes]:
    """A call of ``prot.act`` whose payload claims to come from W's owner, as the pieces join up.

    Returned as the header and the payload's bytes, so a test can cut it where it likes.
    """
    head = {"type": "method", "to": st.provider_id, "method": "services.prot.act", "session": session}
    promise = {
        "resolve": {"_rtype": "method", "_rtarget": atk.id, "_rmethod": f"{session}.resolve"},
        "reject": {"_rtype": "method", "_rtarget": atk.id, "_rmethod": f"{session}.reject"},
    }
    return pack(head), pack({**st.forged(), "args": ["forged"], "with_kwargs": False, "promise": promise})


async def assert_act_never_ran(st: Stage, atk: Raw, before: int) -> None:
    """The provider still answers the attacker (so what it sent before was handled), and nothing
    of W's protected ``act`` ran (since ``before`` calls) or returned."""
    kind, value = await atk.answer(await atk.call(st.provider_id, "services.pub.ping"))
    assert (kind, value) == ("resolve", "pong"), (kind, value)
    ran = st.calls[before:]
    assert not ran, f"W's protected act ran for the outsider, as {ran}"
    assert not [f for f in atk.received if SECRET.encode() in f], "W's secret reached the outsider"


async def test_a_message_in_pieces_held_while_its_receiver_reconnects_cannot_name_its_sender(st: Stage) -> None:
    """create, append and process, all held for the provider while it is away, then delivered when
    it is back: the ``process`` is refused as it would be with the provider connected."""
    before = len(st.calls)
    async with st.attacker() as atk:
        head, payload = forged_message(st, atk, "inner-1")
        await st.drop()
        create = await atk.call(st.provider_id, CACHE + "create", "k-held", False)
        append = await atk.call(st.provider_id, CACHE + "append", "k-held", head + payload, False)
        process = await atk.call(st.provider_id, CACHE + "process", "k-held", False)
        assert await atk.settle() == [], "held, not refused on the spot: nothing is decided while it is away"
        assert create not in atk.answers, "held for the provider: no answer yet"
        await st.back()
        assert (await atk.answer(create))[0] == "resolve"
        assert (await atk.answer(append))[0] == "resolve"
        kind, why = await atk.answer(process)
        assert kind == "reject", f"the forged message was processed: {why}"
        assert "may not set" in why, why
        await assert_act_never_ran(st, atk, before)


def cut_message(st: Stage, atk: Raw, session: str) -> tuple[bytes, bytes]:
    """A forged message cut in two: the first piece names W's owner and ends in the header of a
    bytes value; the tail, the bytes of that value, is two clean maps on its own."""
    tail = pack({"type": "method"}) + pack({"args": []})
    head, payload = forged_message(st, atk, session)
    fields = msgpack.unpackb(payload)
    first = head + bytes([0x80 | (len(fields) + 1)])
    first += b"".join(pack(k) + pack(v) for k, v in fields.items())
    first += pack("pad") + b"\xc4" + bytes([len(tail)])
    assert len(tail) < 256
    return first, tail


async def test_a_message_the_hub_refused_cannot_be_finished_under_the_same_key(st: Stage) -> None:
    """The hub refuses the ``process`` of a message whose pieces are missing, and forgets the key;
    the provider still holds the first piece under it. Creating the key again must not let a tail
    that is clean on its own finish the forged message (no move needed)."""
    before = len(st.calls)
    async with st.attacker() as atk:
        first, tail = cut_message(st, atk, "inner-3")
        for op, args in [("create", ()), ("append", (first,)), ("process", ())]:
            await atk.answer(await atk.call(st.provider_id, CACHE + op, "k-refused", *args, False))
        for op, args in [("create", ()), ("append", (tail,)), ("process", ())]:
            await atk.answer(await atk.call(st.provider_id, CACHE + op, "k-refused", *args, False))
        await assert_act_never_ran(st, atk, before)


async def test_a_message_cut_around_its_receivers_move_cannot_name_its_sender(st: Stage) -> None:
    """The first piece reaches the provider before its move; the provider keeps it in its message
    cache. After the move the attacker creates the key again (the provider refuses, the key
    exists) and sends a tail that is a clean message on its own, but after the first piece it is the
    padding that ends a payload naming W's owner. The walk of the key must not start afresh over
    what the provider already holds."""
    before = len(st.calls)
    async with st.attacker() as atk:
        first, tail = cut_message(st, atk, "inner-2")
        assert (await atk.answer(await atk.call(st.provider_id, CACHE + "create", "k-cut", False)))[0] == "resolve"
        assert (await atk.answer(await atk.call(st.provider_id, CACHE + "append", "k-cut", first, False)))[
            0
        ] == "resolve"
        await st.drop()
        await st.back()
        await atk.answer(await atk.call(st.provider_id, CACHE + "create", "k-cut", False))
        await atk.answer(await atk.call(st.provider_id, CACHE + "append", "k-cut", tail, False))
        await atk.answer(await atk.call(st.provider_id, CACHE + "process", "k-cut", False))
        await assert_act_never_ran(st, atk, before)


async def test_an_honest_large_call_made_while_its_provider_is_away_goes_through_when_it_is_back(
    st: Stage,
) -> None:
    """The walk refuses only what it must: a real hypha-rpc caller's message of several pieces,
    its first frames held while the provider reconnects, reaches it whole (its ``create`` as an
    overwrite, its pieces walked as they are delivered)."""
    pub = await st.owner.get_service(f"{st.provider_id}:pub")
    data = bytes(range(256)) * 3000  # 768,000 bytes: three pieces of hypha-rpc's 256 KiB
    await st.drop()
    call = asyncio.ensure_future(pub.size(data))
    await st.back()
    assert await asyncio.wait_for(call, 30) == len(data)

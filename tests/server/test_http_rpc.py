"""The HTTP streaming transport (protocol §8.4): the real client, and the raw protocol by hand."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import struct
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgpack
import pytest
from hypha_rpc import connect_to_server

from switchboard.config import Settings
from switchboard.server.http import http_rpc
from switchboard.server.process.server_state import Phase
from switchboard.server.runner import RunningServer, running
from switchboard.testing.wait import eventually

pytestmark = pytest.mark.timeout(60)


async def connect_http(connect: Any, **config: Any) -> Any:
    return await connect(transport="http", **config)


# -- a hand-rolled client of the raw protocol ---------------------------------


class RawStream:
    """One GET /rpc stream and the httpx session (cookie jar) that opened it."""

    def __init__(self, http: httpx.AsyncClient, response: httpx.Response) -> None:
        self.http = http
        self.response = response
        self._chunks = response.aiter_bytes()
        self._buffer = b""
        self.info: dict[str, Any] = {}

    @property
    def peer_id(self) -> str:
        return f"{self.info['workspace']}/{self.info['client_id']}"

    async def frame(self, timeout: float = 5.0) -> Any:
        """The next frame, unpacked (first msgpack object only)."""
        return msgpack.unpackb(await asyncio.wait_for(self._next_frame(), timeout), strict_map_key=False)

    async def frame_of_type(self, kind: str, timeout: float = 5.0) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        for _ in range(1000):  # frames of other kinds skipped, and never past the deadline
            frame = await self.frame(max(0.01, deadline - loop.time()))
            if isinstance(frame, dict) and frame.get("type") == kind:
                return frame
            if loop.time() >= deadline:
                break
        raise AssertionError(f"no {kind!r} frame within {timeout:g} s or 1000 frames")

    async def wait_ended(self, timeout: float = 5.0) -> None:
        """Return once the server ended the body, skipping any frames before the end."""

        async def drain() -> None:
            async for _ in self._chunks:
                pass

        await asyncio.wait_for(drain(), timeout)

    async def _next_frame(self) -> bytes:
        for _ in range(1 << 20):  # chunks of the body (callers bound the time)
            if len(self._buffer) >= 4:
                (length,) = struct.unpack(">I", self._buffer[:4])
                if len(self._buffer) >= 4 + length:
                    frame, self._buffer = self._buffer[4 : 4 + length], self._buffer[4 + length :]
                    return frame
            self._buffer += await self._chunks.__anext__()
        raise AssertionError("no whole frame within 2**20 chunks")

    async def post(self, body: bytes, **kwargs: Any) -> httpx.Response:
        params = {"workspace": self.info["workspace"], "client_id": self.info["client_id"]}
        return await self.http.post("/rpc", content=body, params=params, **kwargs)


@contextlib.asynccontextmanager
async def raw_stream(url: str, client_id: str, *, token: str | None = None, **params: str) -> AsyncIterator[RawStream]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx.AsyncClient(base_url=url, timeout=10, headers=headers) as http,
        http.stream("GET", "/rpc", params={"client_id": client_id, **params}) as response,
    ):
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"] == "application/x-msgpack-stream"
        stream = RawStream(http, response)
        stream.info = await stream.frame()
        yield stream


# -- the real client ------------------------------------------------------------


async def test_http_client_connects_and_echoes_through_the_manager(server: RunningServer, connect: Any) -> None:
    api = await connect_http(connect, client_id="h1")
    ws = api.config["workspace"]
    assert ws.startswith("ws-user-anonymouz-")
    assert api.config["client_id"] == "h1"
    assert api.config["manager_id"] == "manager-switchboard"
    assert isinstance(server.hub.peers[f"{ws}/h1"].transport, http_rpc.StreamTransport)
    assert await api.echo("hello") == "hello"
    assert await api.echo({"nested": [1, 2, b"\x00"]}) == {"nested": [1, 2, b"\x00"]}


async def test_service_on_http_client_is_called_from_websocket_and_http_clients(connect: Any) -> None:
    provider = await connect_http(connect, client_id="provider")
    ws = provider.config["workspace"]
    await provider.register_service({"id": "calc", "add": lambda a, b: a + b})
    token = await provider.generate_token()
    ws_caller = await connect(client_id="ws-caller", token=token)
    http_caller = await connect_http(connect, client_id="http-caller", token=token)
    for caller in (ws_caller, http_caller):
        assert caller.config["workspace"] == ws
        svc = await caller.get_service("provider:calc")
        assert svc.id == f"{ws}/provider:calc"
        assert await svc.add(2, 3) == 5


async def test_http_client_calls_a_websocket_service_with_callbacks(connect: Any) -> None:
    provider = await connect(client_id="ws-provider")

    async def twice(callback: Any, value: int) -> int:
        return await callback(value) + await callback(value)

    await provider.register_service({"id": "cb", "config": {"visibility": "public"}, "twice": twice})
    caller = await connect_http(connect, client_id="http-caller")
    svc = await caller.get_service(f"{provider.config['workspace']}/ws-provider:cb")
    seen: list[int] = []

    def callback(v: int) -> int:
        seen.append(v)
        return v * 10

    assert await svc.twice(callback, 4) == 80
    assert seen == [4, 4]


async def test_http_provider_calls_back_into_its_caller(connect: Any) -> None:
    provider = await connect_http(connect, client_id="http-provider")

    async def apply(fn: Any, x: int) -> Any:
        return await fn(x)

    await provider.register_service({"id": "apply", "config": {"visibility": "public"}, "apply": apply})
    caller = await connect(client_id="ws-caller")
    svc = await caller.get_service(f"{provider.config['workspace']}/http-provider:apply")
    assert await svc.apply(lambda x: x + 1, 41) == 42


async def test_megabyte_payloads_cross_the_http_transport_both_ways(connect: Any) -> None:
    provider = await connect_http(connect, client_id="big-provider")
    await provider.register_service({"id": "big", "config": {"visibility": "public"}, "double": lambda b: b + b[::-1]})
    payload = bytes(range(256)) * (5 * 1024) + b"tail"  # 1.25 MiB + 4
    for caller in (await connect(client_id="ws-big"), await connect_http(connect, client_id="http-big")):
        svc = await caller.get_service(f"{provider.config['workspace']}/big-provider:big")
        result = await svc.double(payload)
        assert len(result) == 2 * len(payload)
        assert result == payload + payload[::-1]


async def test_the_clients_own_token_refresh_gets_a_new_token_down_the_stream(
    server: RunningServer, connect: Any
) -> None:
    api = await connect_http(connect, client_id="refresher")
    connection = api.rpc._connection
    first = connection._reconnection_token
    # The client POSTs {"type":"refresh_token"} 2 s after connecting; the answer
    # replaces its token with a new object (the value may be equal within a second).
    await eventually(lambda: connection._reconnection_token is not first, timeout=10, what="a token refresh")
    user = server.hub.gate.issuer.verify(connection._reconnection_token)
    assert (user.client_id, user.current_workspace) == ("refresher", api.config["workspace"])


async def test_disconnect_removes_the_http_clients_services(server: RunningServer, connect: Any) -> None:
    provider = await connect_http(connect, client_id="leaver")
    ws = provider.config["workspace"]
    await provider.register_service({"id": "gone-soon", "f": lambda: 1})
    watcher = await connect(client_id="watcher", token=await provider.generate_token())
    assert f"{ws}/leaver:gone-soon" in {s["id"] for s in await watcher.list_services()}
    await provider.disconnect()
    await eventually(lambda: f"{ws}/leaver" not in server.hub.peers, what="the peer to be detached")
    assert not {s["id"] for s in await watcher.list_services()} & {f"{ws}/leaver:gone-soon"}


async def test_client_resumes_on_a_new_stream_when_the_server_drops_it(server: RunningServer, connect: Any) -> None:
    provider = await connect_http(connect, client_id="resumer")
    peer_id = f"{provider.config['workspace']}/resumer"
    await provider.register_service({"id": "kept", "config": {"visibility": "public"}, "f": lambda: "back"})
    old = server.hub.peers[peer_id]
    old.close(1012, "Service restart")  # the stream ends; the client retries after 2 s
    await eventually(lambda: server.hub.peers.get(peer_id) not in (None, old), timeout=10, what="a new stream")
    caller = await connect(client_id="resume-caller")
    # the client re-registers its services once the new connection_info arrives
    svc = await eventually(lambda: caller.get_service(f"{peer_id}:kept"), "the service registered again", interval=0.05)
    assert await svc.f() == "back"


# -- the raw protocol -------------------------------------------------------------


async def test_first_frame_is_connection_info_and_sets_a_session_cookie(server: RunningServer) -> None:
    async with raw_stream(server.url, "raw") as stream:
        assert stream.info["type"] == "connection_info"
        assert stream.info["client_id"] == "raw"
        assert stream.info["manager_id"] == server.hub.manager_id
        assert stream.info["reconnection_token"]
        cookie = http_rpc.cookie_name(stream.peer_id)
        assert stream.http.cookies.get(cookie)
        assert "HttpOnly" in stream.response.headers["set-cookie"]


async def test_post_ping_and_refresh_token_are_answered_down_the_stream(server: RunningServer) -> None:
    async with raw_stream(server.url, "ctl") as stream:
        reply = await stream.post(msgpack.packb({"type": "ping"}))
        assert (reply.status_code, reply.content) == (200, b"")
        assert await stream.frame_of_type("pong")
        assert (await stream.post(msgpack.packb({"type": "refresh_token"}))).status_code == 200
        frame = await stream.frame_of_type("reconnection_token")
        user = server.hub.gate.issuer.verify(frame["reconnection_token"])
        assert (user.client_id, user.current_workspace) == ("ctl", stream.info["workspace"])


async def test_a_routed_error_comes_down_the_stream_as_a_msgpack_error_frame(server: RunningServer) -> None:
    async with raw_stream(server.url, "bcast") as stream:
        bad = msgpack.packb({"type": "method", "to": "*"})  # a method call cannot be broadcast
        assert (await stream.post(bad)).status_code == 200
        frame = await stream.frame_of_type("error")
        assert "cannot broadcast a method call" in frame["message"]


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (b"\xc1", "not valid msgpack"),
        (msgpack.packb({"type": "method"})[:-3], "truncated"),
        (msgpack.packb([1, 2, 3]), "must be a map"),
        (msgpack.packb({"to": "x"}), "no 'type'"),
        (b"", "empty"),
    ],
)
async def test_malformed_post_body_is_400_with_json_detail(server: RunningServer, body: bytes, detail: str) -> None:
    async with raw_stream(server.url, "bad-body") as stream:
        reply = await stream.post(body)
        assert reply.status_code == 400
        assert reply.json()["success"] is False
        assert detail in reply.json()["detail"]


async def test_post_above_the_size_limit_is_413(server: RunningServer) -> None:
    limit = server.hub.settings.max_message_bytes
    async with raw_stream(server.url, "too-big") as stream:
        declared = await stream.post(b"\x00" * (limit + 1))
        assert declared.status_code == 413
        assert "exceeds the limit" in declared.json()["detail"]

        async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: counted as it arrives
            for _ in range(limit // (1 << 20) + 1):
                yield b"\x00" * (1 << 20)

        streamed = await stream.post(chunked())  # type: ignore[arg-type]
        assert streamed.status_code == 413
        assert streamed.json()["success"] is False
        assert (await stream.post(msgpack.packb({"type": "ping"}))).status_code == 200  # session intact


async def test_post_for_a_client_without_a_stream_is_a_clear_400(server: RunningServer, connect: Any) -> None:
    ws_client = await connect(client_id="ws-only")
    async with httpx.AsyncClient(base_url=server.url) as http:
        for workspace, client_id in (("ws-user-nobody", "ghost"), (ws_client.config["workspace"], "ws-only")):
            reply = await http.post(
                "/rpc", content=msgpack.packb({"type": "ping"}), params={"workspace": workspace, "client_id": client_id}
            )
            assert reply.status_code == 400
            assert reply.json() == {
                "success": False,
                "detail": f"No open HTTP stream for client {workspace}/{client_id} here: open GET /rpc first",
            }
        missing = await http.post("/rpc", content=b"\x80", params={"client_id": "x"})
        assert missing.status_code == 400
        assert "'workspace' is required" in missing.json()["detail"]


async def test_only_the_streams_owner_can_post_as_it(server: RunningServer, connect: Any) -> None:
    owner = await connect(client_id="owner")
    token = await owner.generate_token()
    other_token = await (await connect(client_id="stranger")).generate_token()
    ping = msgpack.packb({"type": "ping"})
    async with raw_stream(server.url, "victim", token=token) as stream:
        params = {"workspace": stream.info["workspace"], "client_id": "victim"}
        async with httpx.AsyncClient(base_url=server.url) as intruder:  # knows the ids, not the cookie
            assert (await intruder.post("/rpc", content=ping, params=params)).status_code == 403
            for bad, status in (("not-a-jwt", 401), (other_token, 403)):
                reply = await intruder.post(
                    "/rpc", content=ping, params=params, headers={"Authorization": f"Bearer {bad}"}
                )
                assert reply.status_code == status
                assert reply.json()["success"] is False
            intruder.cookies.set(http_rpc.cookie_name(stream.peer_id), "guessed")
            assert (await intruder.post("/rpc", content=ping, params=params)).status_code == 403
            # The same user's token is enough without the cookie: its holder could open a stream anyway.
            same_user = {"Authorization": f"Bearer {token}"}
            assert (await intruder.post("/rpc", content=ping, params=params, headers=same_user)).status_code == 200
        assert await stream.frame_of_type("pong")


async def test_anonymous_stream_accepts_only_its_cookie(server: RunningServer) -> None:
    async with raw_stream(server.url, "anon") as stream:
        params = {"workspace": stream.info["workspace"], "client_id": "anon"}
        async with httpx.AsyncClient(base_url=server.url) as intruder:
            reply = await intruder.post("/rpc", content=msgpack.packb({"type": "ping"}), params=params)
            assert reply.status_code == 403
            assert "not the owner" in reply.json()["detail"]
        assert (await stream.post(msgpack.packb({"type": "ping"}))).status_code == 200


async def test_a_new_get_supersedes_the_old_stream(server: RunningServer) -> None:
    async with raw_stream(server.url, "twice") as first:
        old_peer = server.hub.peers[first.peer_id]
        token = first.info["reconnection_token"]
        async with raw_stream(server.url, "twice", reconnection_token=token) as second:
            assert second.peer_id == first.peer_id
            await first.wait_ended()
            new_peer = server.hub.peers[second.peer_id]
            assert new_peer is not old_peer
            assert old_peer.closed
            assert (await second.post(msgpack.packb({"type": "ping"}))).status_code == 200
            assert await second.frame_of_type("pong")
    await eventually(lambda: not server.hub.peers, what="both streams to be detached")


async def test_closing_the_stream_detaches_the_peer(server: RunningServer) -> None:
    async with raw_stream(server.url, "short") as stream:
        peer_id = stream.peer_id
        assert peer_id in server.hub.peers
    await eventually(lambda: peer_id not in server.hub.peers, what="the peer to be detached")


@pytest.mark.parametrize(
    ("params", "headers", "status", "detail"),
    [
        ({}, {}, 400, "client_id is missing"),
        ({"client_id": "bad id!"}, {}, 400, "invalid client_id"),
        ({"client_id": "c"}, {"Authorization": "Bearer nope"}, 401, "Authentication error"),
        ({"client_id": "c", "reconnection_token": "nope"}, {}, 401, "Authentication error"),
        ({"client_id": "c", "workspace": "ws-user-someone-else"}, {}, 403, "does not exist or is not accessible"),
    ],
)
async def test_refused_streams_get_a_status_and_json_detail(
    server: RunningServer, params: dict[str, str], headers: dict[str, str], status: int, detail: str
) -> None:
    async with httpx.AsyncClient(base_url=server.url) as http:
        reply = await http.get("/rpc", params=params, headers=headers)
    assert reply.status_code == status
    assert reply.json()["success"] is False
    assert detail in reply.json()["detail"]


async def test_a_live_client_id_cannot_be_taken_over_with_a_plain_token(server: RunningServer, connect: Any) -> None:
    api = await connect_http(connect, client_id="taken")
    token = await api.generate_token()
    async with httpx.AsyncClient(base_url=server.url) as http:
        reply = await http.get("/rpc", params={"client_id": "taken"}, headers={"Authorization": f"Bearer {token}"})
    assert reply.status_code == 409
    assert "already exists" in reply.json()["detail"]
    assert await api.echo("unharmed") == "unharmed"


async def test_draining_server_refuses_new_streams_with_503(server: RunningServer) -> None:
    state = server.app.state.switchboard
    state.phase = Phase.DRAINING
    try:
        async with httpx.AsyncClient(base_url=server.url) as http:
            reply = await http.get("/rpc", params={"client_id": "late"})
    finally:
        state.phase = Phase.READY
    assert reply.status_code == 503
    assert reply.json()["success"] is False


# -- keepalive ---------------------------------------------------------------------


@pytest.fixture
async def fast_keepalive_server(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[RunningServer]:
    monkeypatch.setattr(http_rpc, "routes", functools.partial(http_rpc.routes, keepalive_interval=0.2))
    async with running(settings) as srv:
        yield srv


async def test_idle_stream_gets_pings_and_the_client_ignores_them(fast_keepalive_server: RunningServer) -> None:
    url = fast_keepalive_server.url
    async with raw_stream(url, "idle") as stream:
        assert await stream.frame(timeout=2) == {"type": "ping"}
        assert await stream.frame(timeout=2) == {"type": "ping"}
    api = await connect_to_server({"server_url": url, "transport": "http", "client_id": "pinged", "method_timeout": 10})
    try:
        peer = fast_keepalive_server.hub.peers[f"{api.config['workspace']}/pinged"]
        connected_at = peer.transport.last_sent
        # Only pings go down an idle stream: wait until one went out a second after connecting.
        await eventually(lambda: peer.transport.last_sent - connected_at > 1.0, what="pings on an idle stream")
        assert await api.echo("still here") == "still here"
        assert fast_keepalive_server.hub.peers[peer.id] is peer  # never reconnected
    finally:
        await api.disconnect()

"""Bad input on the WebSocket transport: refused clearly, and never at anyone else's expense.

Each test plays one misbehaving client with a raw ``websockets`` connection (no
hypha-rpc to tidy its frames up), checks the answer the protocol prescribes
(error frame and close code, §2.4; an ``error`` text frame for a bad frame
after the handshake, §3), and then checks that the hub is unharmed: a separate,
well-behaved hypha-rpc client still gets answers, and the bad connection left
no peer behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import msgpack
import pytest
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from switchboard.config import Settings
from switchboard.hub.identity.auth import TokenIssuer
from switchboard.hub.identity.users import Permission, User
from switchboard.server.runner import RunningServer, running
from switchboard.testing.clock import FakeClock
from switchboard.testing.hub import TEST_SECRET as SECRET
from switchboard.testing.hub import settings_for_tests as make_settings
from switchboard.testing.wait import eventually

pytestmark = pytest.mark.timeout(60)

MAX_FRAME = 64 * 1024


@pytest.fixture
def settings() -> Settings:
    """A small frame limit, so "too large" is cheap to reach."""
    return make_settings(max_message_bytes=MAX_FRAME)


# -- helpers -------------------------------------------------------------------


def ws_url(server: RunningServer, query: str = "") -> str:
    return server.url.replace("http", "ws", 1) + "/ws" + query


@contextlib.asynccontextmanager
async def raw_socket(server: RunningServer, query: str = "") -> AsyncIterator[ClientConnection]:
    """A bare WebSocket to the hub: nothing sent yet."""
    async with ws_connect(ws_url(server, query), open_timeout=5, close_timeout=2) as ws:
        yield ws


def first_frame(client_id: str, *, token: str | None = None, workspace: str | None = None) -> str:
    return json.dumps({"client_id": client_id, "workspace": workspace, "token": token, "reconnection_token": None})


@contextlib.asynccontextmanager
async def raw_client(
    server: RunningServer, client_id: str, **hello: Any
) -> AsyncIterator[tuple[ClientConnection, dict[str, Any]]]:
    """A raw client past the handshake, with the ``connection_info`` it got."""
    async with raw_socket(server) as ws:
        await ws.send(first_frame(client_id, **hello))
        info = await recv_text(ws)
        assert info["type"] == "connection_info", info
        yield ws, info


async def recv_text(ws: ClientConnection, timeout: float = 5.0) -> dict[str, Any]:
    frame = await asyncio.wait_for(ws.recv(), timeout)
    assert isinstance(frame, str), f"expected a text frame, got {frame[:80]!r}"
    return json.loads(frame)


async def recv_binary(ws: ClientConnection, timeout: float = 5.0) -> tuple[dict, dict | None]:
    """The ``(main, extra)`` of the next binary frame."""
    frame = await asyncio.wait_for(ws.recv(), timeout)
    assert isinstance(frame, bytes), f"expected a binary frame, got {frame!r}"
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(frame)
    parts = list(unpacker)
    return parts[0], (parts[1] if len(parts) > 1 else None)


async def refusal(ws: ClientConnection) -> tuple[dict[str, Any] | None, int | None, str | None]:
    """What a refused client sees: ``(error frame or None, close code, close reason)``."""
    error = None
    with contextlib.suppress(ConnectionClosed):
        error = await recv_text(ws)
        await asyncio.wait_for(ws.recv(), 5)  # nothing may follow the error frame but the close
        pytest.fail("the server sent another frame after the error frame")
    await asyncio.wait_for(ws.wait_closed(), 5)
    return error, ws.close_code, ws.close_reason


async def assert_still_usable(ws: ClientConnection) -> None:
    """A ping is answered by the very next frame, so nothing was queued before it."""
    await ws.send(json.dumps({"type": "ping"}))
    assert await recv_text(ws) == {"type": "pong"}


async def drain_until_closed(ws: ClientConnection) -> None:
    """Read whatever was in flight until the server's close arrives."""
    with contextlib.suppress(ConnectionClosed):
        for _ in range(10_000):  # bounded: the close comes after at most what was in flight
            await asyncio.wait_for(ws.recv(), 5)


def rpc_frame(main: dict[str, Any], extra: Any = None) -> bytes:
    frame = msgpack.packb(main, use_bin_type=True)
    return frame + msgpack.packb(extra, use_bin_type=True) if extra is not None else frame


async def assert_hub_unharmed(server: RunningServer, connect: Any, *bad_client_ids: str) -> None:
    """One bad client never hurts another: the hub still serves, and kept no trace of it."""
    api = await connect()
    assert await api.echo("ok") == "ok"

    def leftovers() -> list[str]:
        return [pid for pid in server.hub.peers if pid.rpartition("/")[2] in bad_client_ids]

    await eventually(lambda: not leftovers(), f"bad peers to be forgotten (left: {leftovers()})")
    tracked = server.app.state.switchboard.peers
    assert not [p for p in tracked if p.client_id in bad_client_ids]


def token_for(server: RunningServer, workspace: str, user_id: str = "bob") -> str:
    return server.hub.gate.issuer.issue(
        User(id=user_id), workspace=workspace, permission=Permission.READ_WRITE, expires_in=600
    )


# -- the first frame -----------------------------------------------------------


@pytest.mark.parametrize(
    "frame",
    [pytest.param("hello, server", id="text"), pytest.param(b"\xff\xfe\x00", id="binary-not-utf8")],
)
async def test_a_first_frame_that_is_not_json_is_refused_with_1003(server, connect, frame):
    async with raw_socket(server) as ws:
        await ws.send(frame)
        error, code, _ = await refusal(ws)
    assert error == {"type": "error", "message": "Failed to decode authentication information"}
    assert code == 1003
    await assert_hub_unharmed(server, connect)


@pytest.mark.parametrize("frame", ["[1, 2, 3]", '"client"', "42", "null"])
async def test_a_first_frame_that_is_json_but_not_an_object_is_refused_with_1003(server, connect, frame):
    async with raw_socket(server) as ws:
        await ws.send(frame)
        error, code, _ = await refusal(ws)
    assert error["type"] == "error"
    assert error["message"].startswith("Failed to decode authentication information")
    assert code == 1003
    await assert_hub_unharmed(server, connect)


@pytest.mark.parametrize(
    "hello",
    [
        pytest.param({"workspace": None, "token": None, "reconnection_token": None}, id="absent"),
        pytest.param({"client_id": None}, id="null"),
        pytest.param({"client_id": ""}, id="empty"),
        pytest.param({"client_id": 7}, id="not-a-string"),
    ],
)
async def test_a_first_frame_without_a_client_id_is_refused_with_1001(server, connect, hello):
    async with raw_socket(server) as ws:
        await ws.send(json.dumps(hello))
        error, code, _ = await refusal(ws)
    assert error["type"] == "error"
    assert error["message"].startswith("Failed to establish connection")
    assert "client_id" in error["message"]
    assert code == 1001
    await assert_hub_unharmed(server, connect)


@pytest.mark.parametrize(
    "client_id",
    [
        pytest.param("ws/evil", id="slash"),
        pytest.param("svc:evil", id="colon"),
        pytest.param("x" * 129, id="129-chars"),
    ],
)
async def test_a_client_id_with_a_slash_colon_or_too_long_is_refused(server, connect, client_id):
    async with raw_socket(server) as ws:
        await ws.send(first_frame(client_id))
        error, code, _ = await refusal(ws)
    assert error["message"].startswith("Failed to establish connection: invalid client_id")
    assert code == 1001
    await assert_hub_unharmed(server, connect)


async def test_the_managers_client_id_is_reserved(server, connect):
    manager_id = server.hub.manager_id
    async with raw_socket(server) as ws:
        await ws.send(first_frame(manager_id))
        error, code, _ = await refusal(ws)
    assert error["message"] == (
        f"Failed to establish connection: client_id {manager_id!r} is reserved for the hub's manager"
    )
    assert code == 1001
    await assert_hub_unharmed(server, connect)


async def test_no_first_frame_within_the_handshake_timeout_is_refused_with_1008(connect):
    async with running(make_settings(handshake_timeout=0.3)) as server:
        loop = asyncio.get_running_loop()
        async with raw_socket(server) as ws:
            started = loop.time()
            error, code, _ = await refusal(ws)  # we send nothing at all
            waited = loop.time() - started
        assert error == {"type": "error", "message": "Authentication payload timeout"}
        assert code == 1008
        assert waited < 3, f"refused after {waited:.2f}s, not after the 0.3s timeout"
        api = await connect(server_url=server.url)
        assert await api.echo("ok") == "ok"
        await api.disconnect()
        metrics = server.hub.metrics.render().decode()
        assert re.search(r"^switchboard_handshake_failures_total\{.*\} [1-9]", metrics, re.M)


# -- tokens --------------------------------------------------------------------


def expired_token(server: RunningServer) -> str:
    return server.hub.gate.issuer.issue(
        User(id="late"), workspace="ws-user-late", permission=Permission.ADMIN, expires_in=-10
    )


def token_from_a_fake_past(server: RunningServer) -> str:
    """Signed with the right secret, but issued (and expired) back in 2023."""
    issuer = TokenIssuer(secret=SECRET, clock=FakeClock(wall=1_700_000_000.0))
    return issuer.issue(User(id="late"), workspace="ws-user-late", permission=Permission.ADMIN, expires_in=3600)


def token_signed_elsewhere(server: RunningServer) -> str:
    issuer = TokenIssuer(secret="another-secret-entirely-0123456789", clock=FakeClock(wall=4e9))
    return issuer.issue(User(id="mallory"), workspace="ws-user-mallory", permission=Permission.ADMIN, expires_in=60)


@pytest.mark.parametrize(
    ("make_token", "detail"),
    [
        pytest.param(lambda server: "garbage", "not a JWT", id="garbage"),
        pytest.param(lambda server: "a.b.c", "invalid token", id="three-garbage-parts"),
        pytest.param(token_signed_elsewhere, "invalid token", id="wrong-secret"),
        pytest.param(expired_token, "expired", id="expired"),
        pytest.param(token_from_a_fake_past, "expired", id="expired-long-ago"),
    ],
)
async def test_a_bad_or_expired_token_is_refused_with_1008(server, connect, make_token, detail):
    async with raw_socket(server) as ws:
        await ws.send(first_frame("tokenless", token=make_token(server)))
        error, code, _ = await refusal(ws)
    assert error["type"] == "error"
    assert error["message"].startswith("Authentication error")
    assert detail in error["message"]
    assert code == 1008
    await assert_hub_unharmed(server, connect, "tokenless")


async def test_a_bad_reconnection_token_is_refused_with_1008(server, connect):
    async with raw_socket(server) as ws:
        await ws.send(
            json.dumps({"client_id": "ghost", "workspace": None, "token": None, "reconnection_token": "x.y.z"})
        )
        error, code, _ = await refusal(ws)
    assert error["message"].startswith("Authentication error")
    assert code == 1008
    await assert_hub_unharmed(server, connect, "ghost")


async def test_legacy_query_parameter_authentication_is_closed_with_1008(server, connect):
    async with raw_socket(server, "?client_id=x&workspace=public&token=t") as ws:
        error, code, reason = await refusal(ws)
    assert error is None, "legacy clients get a bare close, no error frame (§2.4)"
    assert code == 1008
    assert "upgrade to hypha-rpc" in reason
    await assert_hub_unharmed(server, connect, "x")


# -- frames after the handshake -------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "problem"),
    [
        pytest.param(b"\xc1", "not valid msgpack", id="reserved-byte"),
        pytest.param(b"\x92\x01", "truncated", id="truncated"),
        pytest.param(msgpack.packb([1, 2, 3]), "must be a map", id="header-is-a-list"),
        pytest.param(msgpack.packb("method"), "must be a map", id="header-is-a-string"),
        pytest.param(msgpack.packb({1: "method"}), "msgpack", id="non-string-key"),
        pytest.param(rpc_frame({"to": "somebody"}), "no 'type'", id="no-type"),
        pytest.param(rpc_frame({"type": 5, "to": "somebody"}), "no 'type'", id="type-not-str"),
        pytest.param(rpc_frame({"type": "method", "method": "a.b"}), "no 'to'", id="no-to"),
        pytest.param(rpc_frame({"type": "method", "to": ""}), "no 'to'", id="empty-to"),
        pytest.param(rpc_frame({"type": "method", "to": 42}), "'to' must be a string", id="to-int"),
        pytest.param(rpc_frame({"type": "method", "to": "a:b"}), "invalid target", id="to-colon"),
        pytest.param(rpc_frame({"type": "method", "to": "a/b/c"}), "invalid target", id="to-slashes"),
        pytest.param(
            rpc_frame({"type": "method", "to": "x", "session": 3}),
            "'session' must be a string",
            id="session-int",
        ),
        pytest.param(
            rpc_frame({"type": "my-event", "to": "ws-user-someone-else/*"}),
            "Permission denied",
            id="broadcast-elsewhere",
        ),
        pytest.param(rpc_frame({"type": "method", "to": "*"}), "cannot broadcast", id="broadcast-call"),
    ],
)
async def test_a_bad_binary_frame_gets_an_error_frame_and_the_connection_stays_usable(server, connect, frame, problem):
    async with raw_client(server, "sloppy") as (ws, info):
        await ws.send(frame)
        error = await recv_text(ws)
        assert error["type"] == "error"
        assert error["message"].startswith("Invalid message")
        assert problem in error["message"]
        await assert_still_usable(ws)
        assert f"{info['workspace']}/sloppy" in server.hub.peers
    await assert_hub_unharmed(server, connect, "sloppy")


async def test_an_empty_binary_frame_gets_an_error_frame(server, connect):
    async with raw_client(server, "sloppy") as (ws, _):
        await ws.send(b"")
        error = await recv_text(ws)
        assert error["type"] == "error"
        assert "empty" in error["message"]
        await assert_still_usable(ws)
    await assert_hub_unharmed(server, connect, "sloppy")


async def test_unknown_and_oversized_text_frames_are_ignored(server, connect):
    async with raw_client(server, "chatty") as (ws, _):
        for text in ("not json", "[]", '{"type": "shout"}', json.dumps({"type": "ping", "x": "y" * 2000})):
            await ws.send(text)
        await assert_still_usable(ws)  # the pong is the first frame back: nothing answered the rest
    await assert_hub_unharmed(server, connect, "chatty")


async def test_forged_from_ws_and_user_are_overwritten_before_delivery(server, connect):
    forged_user = {"id": "root", "roles": ["admin"], "is_anonymous": False, "scope": {}}
    async with raw_client(server, "forger") as (forger, info):
        ws = info["workspace"]
        token = token_for(server, ws)
        async with raw_client(server, "victim", token=token, workspace=ws) as (victim, _):
            await forger.send(
                rpc_frame(
                    {
                        "type": "method",
                        "to": "victim",
                        "from": "*/manager-switchboard",
                        "ws": "public",
                        "user": forged_user,
                        "method": "services.built-in.get_service",
                    },
                    {"args": ["anything"], "with_kwargs": False},
                )
            )
            main, extra = await recv_binary(victim)
    assert main["from"] == f"{ws}/forger"
    assert main["ws"] == ws
    assert main["user"] == info["user"]
    assert main["user"]["id"] != "root"
    assert main["to"] == f"{ws}/victim"
    assert main["method"] == "services.built-in.get_service"
    assert extra == {"args": ["anything"], "with_kwargs": False}, "the payload is forwarded untouched"
    await assert_hub_unharmed(server, connect, "forger", "victim")


async def test_a_forged_sender_never_reaches_a_real_client_as_someone_else(server, connect):
    """The real client sees the trusted context: its built-in service answers the raw caller."""
    real = await connect(client_id="real")
    ws = real.config["workspace"]
    token = token_for(server, ws)
    async with raw_client(server, "forger", token=token, workspace=ws) as (forger, info):
        await forger.send(
            rpc_frame(
                {
                    "type": "method",
                    "to": "real",
                    "from": f"{ws}/somebody-else",
                    "ws": "elsewhere",
                    "user": {"id": "root", "roles": ["admin"]},
                    "method": "services.built-in.get_service",
                    "session": "s-forged",
                },
                {"args": ["built-in"], "promise": "*", "t": 10},
            )
        )
        replies = []
        while not any(m["method"].endswith((".resolve", ".reject")) for m, _ in replies):
            replies.append(await recv_binary(forger))
    for main, _ in replies:
        assert main["from"] == f"{ws}/real"
        assert main["to"] == f"{ws}/forger", "the reply went to the real sender, not the forged one"
        assert main["ws"] == ws
    main, extra = replies[-1]
    assert main["method"] == "s-forged.resolve", extra
    assert extra["args"][0]["id"].endswith("built-in"), extra
    await assert_hub_unharmed(server, connect, "forger")


async def test_frames_the_manager_cannot_parse_are_dropped_and_it_keeps_answering(server, connect):
    async with raw_client(server, "garbler") as (ws, info):
        manager = f"*/{info['manager_id']}"
        echo = {"type": "method", "to": manager, "method": "services.default.echo"}
        await ws.send(rpc_frame({"type": "method", "to": manager}, {"args": [1]}))  # no method
        await ws.send(msgpack.packb({**echo, "session": "s1"}) + b"\xc1\xc1")  # extra not msgpack
        await ws.send(rpc_frame({**echo, "session": "s2"}, [1, 2]))  # extra not a map
        await ws.send(rpc_frame({**echo, "session": "s3"}, {"args": ["still here"], "promise": "*", "t": 5}))
        replies, errors = [], []
        while not any(m["method"].endswith((".resolve", ".reject")) for m, _ in replies):
            frame = await asyncio.wait_for(ws.recv(), 5)
            if isinstance(frame, str):
                errors.append(json.loads(frame)["message"])
            else:
                unpacker = msgpack.Unpacker(raw=False)
                unpacker.feed(frame)
                parts = list(unpacker)
                replies.append((parts[0], parts[1] if len(parts) > 1 else None))
    # the two payloads that are no msgpack map are refused at the hub's edge, with a reason
    assert len(errors) == 2, errors
    assert errors[0].startswith("Invalid message: message payload is not valid msgpack"), errors
    assert errors[1] == "Invalid message: each part of a message must be a msgpack map", errors
    assert all(m["method"].startswith("s3.") for m, _ in replies), "nothing answers the bad frames"
    main, extra = replies[-1]
    assert main["method"] == "s3.resolve"
    assert extra["args"] == ["still here"]
    await assert_hub_unharmed(server, connect, "garbler")


async def test_a_call_to_a_client_that_is_not_connected_is_rejected_fast(server, connect):
    async with raw_client(server, "caller") as (ws, info):
        loop = asyncio.get_running_loop()
        started = loop.time()
        await ws.send(
            rpc_frame(
                {"type": "method", "to": "ghost", "method": "services.s.f", "session": "sess-1"},
                {"args": [], "promise": "*", "t": 10},
            )
        )
        main, extra = await recv_binary(ws)
        assert loop.time() - started < 1
    assert main["type"] == "method"
    assert main["method"] == "sess-1.reject"
    assert main["to"] == f"{info['workspace']}/caller"
    assert main["from"] == f"{info['workspace']}/ghost"
    (error,) = extra["args"]
    assert error["_rtype"] == "error"
    assert "is not connected" in error["_rvalue"]
    await assert_hub_unharmed(server, connect, "caller")


async def test_a_fire_and_forget_message_to_nobody_is_dropped_silently(server, connect):
    async with raw_client(server, "caller") as (ws, _):
        await ws.send(rpc_frame({"type": "method", "to": "ghost", "method": "sess-9.resolve"}, {"args": [1]}))
        await ws.send(rpc_frame({"type": "method", "to": "other-ws/ghost", "method": "a.b"}))
        await assert_still_usable(ws)  # the pong comes first: no reject was queued before it
    await assert_hub_unharmed(server, connect, "caller")


async def test_a_frame_above_the_size_limit_closes_the_connection_with_1009(server, connect):
    async with raw_client(server, "bulky") as (ws, info):
        peer_id = f"{info['workspace']}/bulky"
        await ws.send(rpc_frame({"type": "method", "to": "bulky"}, {"blob": b"x" * MAX_FRAME}))
        await drain_until_closed(ws)
        assert ws.close_code == 1009
    await eventually(lambda: peer_id not in server.hub.peers, "the oversized client to be detached")
    await assert_hub_unharmed(server, connect, "bulky")


async def test_a_frame_just_below_the_size_limit_is_routed(server, connect):
    async with raw_client(server, "bulky") as (ws, _):
        frame = rpc_frame({"type": "method", "to": "bulky"}, {"blob": b"x" * (MAX_FRAME - 200)})
        assert len(frame) <= MAX_FRAME
        await ws.send(frame)
        main, extra = await recv_binary(ws)
        assert main["from"].endswith("/bulky")
        assert len(extra["blob"]) == MAX_FRAME - 200
    await assert_hub_unharmed(server, connect, "bulky")


async def test_a_client_that_vanishes_mid_handshake_leaves_nothing_behind(server, connect):
    async with raw_socket(server) as ws:
        await ws.send(first_frame("flaky"))
        # closes without reading connection_info
    async with raw_socket(server) as ws:
        pass  # closes before sending anything
    await assert_hub_unharmed(server, connect, "flaky")


async def test_a_storm_of_bad_clients_does_not_hurt_a_working_pair(server, connect):
    provider = await connect(client_id="provider")
    await provider.register_service({"id": "calc", "config": {"visibility": "public"}, "add": lambda a, b: a + b})
    caller = await connect()
    svc = await caller.get_service(f"{provider.config['workspace']}/provider:calc")

    async def misbehave(n: int) -> None:
        async with raw_client(server, f"bad{n}") as (ws, _):
            await ws.send(b"\xc1")
            await ws.send(rpc_frame({"type": "method", "to": "ghost", "session": "s"}))
            await ws.send(rpc_frame({"type": "method", "to": "x"}, {"blob": b"x" * MAX_FRAME}))
            await drain_until_closed(ws)
            assert ws.close_code == 1009

    results = await asyncio.gather(*(misbehave(n) for n in range(10)), svc.add(20, 22))
    assert results[-1] == 42
    assert await svc.add(1, 2) == 3
    await assert_hub_unharmed(server, connect, *(f"bad{n}" for n in range(10)))

"""Who may do what in a workspace: every cell of docs/authorization.md, checked on the server.

One workspace ``W`` belongs to its (anonymous) owner. A provider in ``W``
offers a public and a protected service. Six actors then try every operation
on ``W`` through real hypha-rpc clients, the raw manager proxy and plain HTTP:

* on one in-process hub (``single``), and
* across two replica processes sharing one Valkey (``cluster``): the provider
  on replica A, every actor (the owner included) and every HTTP call on B.

Each cell returns True (allowed) or False (refused with a permission error);
any other outcome fails the test. The expected table is the one the docs
show (a test compares them). A cell where the implementation is wrong is an
``xfail(strict=True)`` naming the bug.

The actors are built once per scenario (module-scoped fixtures on the module's
event loop), so the whole matrix costs a few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jwt
import msgpack
import pytest
import pytest_asyncio
from hypha_rpc import connect_to_server
from websockets.asyncio.client import connect as ws_connect

from switchboard.clock import SystemClock
from switchboard.hub.identity.auth import TokenIssuer
from switchboard.hub.identity.users import Permission, User
from switchboard.testing import ValkeyServer
from switchboard.testing.hub import TEST_SECRET, running, settings_for_tests
from switchboard.testing.replica import ReplicaProcess
from switchboard.testing.wait import eventually

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(120)]

DOC = Path(__file__).resolve().parents[2] / "docs" / "authorization.md"

ACTORS = ("anonymous", "owner", "read", "read_write", "admin", "other")
OPERATIONS = (
    "join",
    "list_public",
    "get_public",
    "call_public",
    "list_protected",
    "call_protected",
    "register",
    "unregister_own",
    "unregister_other",
    "emit",
    "receive",
    "generate_token",
    "http_call_public",
    "http_call_protected",
    "http_list_protected",
)

_Y, _N = True, False
#                    join list_pub get_pub call_pub list_prot call_prot reg  unreg_own unreg_oth emit recv token http_pub http_prot http_list_prot
_ROWS = {
    "anonymous": (_N, _Y, _Y, _Y, _N, _N, _N, _N, _N, _N, _N, _N, _Y, _N, _N),
    "owner": (_Y, _Y, _Y, _Y, _Y, _Y, _Y, _Y, _N, _Y, _Y, _Y, _Y, _Y, _Y),
    "read": (_Y, _Y, _Y, _Y, _Y, _Y, _N, _N, _N, _N, _Y, _N, _Y, _Y, _Y),
    "read_write": (_Y, _Y, _Y, _Y, _Y, _Y, _Y, _Y, _N, _Y, _Y, _N, _Y, _Y, _Y),
    "admin": (_Y, _Y, _Y, _Y, _Y, _Y, _Y, _Y, _N, _Y, _Y, _Y, _Y, _Y, _Y),
    "other": (_N, _Y, _Y, _Y, _N, _N, _N, _N, _N, _N, _N, _N, _Y, _N, _N),
}
EXPECTED: dict[tuple[str, str], bool] = {
    (actor, op): allowed for actor, row in _ROWS.items() for op, allowed in zip(OPERATIONS, row, strict=True)
}

BUGS: dict[tuple[str, str], str] = {}  # (actor, operation) -> known bug; none open

PERMISSION_REFUSAL = re.compile(
    r"Permission denied|PermissionError|PermissionDenied|Only admin can generate token|does not match the specified workspace"
    r"|does not exist or is not accessible"
)


# -- the scenario ---------------------------------------------------------------


@dataclass
class Actor:
    name: str
    api: Any  # the hypha-rpc workspace manager proxy of its connection
    manager: Any  # the raw manager proxy (no client-side wrappers)
    http_token: str | None
    join_token: str | None
    events: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def ws(self) -> str:
        return self.api.config["workspace"]

    @property
    def cid(self) -> str:
        return self.api.config["client_id"]

    @property
    def user_id(self) -> str:
        return self.api.config["user"]["id"]

    async def listen(self, event_type: str) -> list[Any]:
        """Subscribe this connection to ``event_type``; the list fills with each event's data."""
        got: list[Any] = []
        self.events[event_type] = got
        self.api.on(event_type, lambda message: got.append(message.get("data")))
        await self.api.subscribe(event_type)
        return got


@dataclass
class Scenario:
    name: str
    provider_url: str  # where the provider of W's services is connected
    actor_url: str  # where every actor connects and every HTTP call goes
    workspace: str
    provider: Actor
    actors: dict[str, Actor]
    http: httpx.AsyncClient
    issuer: TokenIssuer
    clients: list[Any]
    seq: itertools.count = field(default_factory=itertools.count)

    def unique(self, prefix: str) -> str:
        return f"{prefix}-{next(self.seq)}"


def _who(label: str) -> Callable[..., dict[str, Any]]:
    """A require_context function reporting the trusted context it was called with.

    One function object per service: hypha-rpc keys its method annotations
    by function, so sharing one between services would mix their ids up.
    """

    def who(context: dict[str, Any] | None = None) -> dict[str, Any]:
        assert context is not None
        return {"service": label, "from": context["from"], "ws": context["ws"], "user": context["user"]["id"]}

    return who


async def _actor(name: str, url: str, clients: list[Any], **config: Any) -> Actor:
    api = await connect_to_server({"server_url": url, "method_timeout": 20, **config})
    clients.append(api)
    manager = await api.rpc.get_manager_service({"timeout": 20, "case_conversion": "snake"})
    token = config.get("token")
    return Actor(name=name, api=api, manager=manager, http_token=token, join_token=token)


async def build_scenario(name: str, provider_url: str, actor_url: str) -> Scenario:
    clients: list[Any] = []
    owner = await _actor("owner", actor_url, clients, client_id="owner")
    ws = owner.ws
    owner.http_token = owner.api.config["reconnection_token"]  # the anonymous owner's only credential
    tokens = {
        perm: await owner.api.generate_token({"permission": perm, "expires_in": 3600})
        for perm in ("read", "read_write", "admin")
    }
    provider_token = await owner.api.generate_token({"permission": "read_write"})
    provider = await _actor("provider", provider_url, clients, client_id="provider", token=provider_token)
    await provider.api.register_service(
        {"id": "pub", "config": {"visibility": "public", "require_context": True}, "who": _who("pub")}
    )
    await provider.api.register_service(
        {"id": "prot", "config": {"visibility": "protected", "require_context": True}, "who": _who("prot")}
    )
    await provider.api.register_service(
        {"id": "keep", "config": {"visibility": "public"}, "ping": lambda: "still here"}
    )
    issuer = TokenIssuer(secret=TEST_SECRET, clock=SystemClock())
    eve = User(id=f"eve{secrets.token_hex(4)}")
    other_token = issuer.issue(eve, workspace=f"ws-user-{eve.id}", permission=Permission.ADMIN, expires_in=3600)
    actors = {"owner": owner}
    actors["anonymous"] = await _actor("anonymous", actor_url, clients, client_id="anon")
    for perm, token in tokens.items():
        actors[perm] = await _actor(perm, actor_url, clients, client_id=f"{perm.replace('_', '-')}-holder", token=token)
    actors["other"] = await _actor("other", actor_url, clients, client_id="eve", token=other_token)
    assert {a.ws for n, a in actors.items() if n not in ("anonymous", "other")} == {ws}
    assert actors["anonymous"].ws != ws
    assert actors["other"].ws not in (ws, actors["anonymous"].ws)
    return Scenario(
        name=name,
        provider_url=provider_url,
        actor_url=actor_url,
        workspace=ws,
        provider=provider,
        actors=actors,
        http=httpx.AsyncClient(base_url=actor_url, timeout=20),
        issuer=issuer,
        clients=clients,
    )


async def close_scenario(sc: Scenario) -> None:
    await sc.http.aclose()
    for api in reversed(sc.clients):
        with contextlib.suppress(Exception):
            await asyncio.wait_for(api.disconnect(), 5)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def single() -> AsyncIterator[Scenario]:
    async with running(settings_for_tests()) as server:
        sc = await build_scenario("single", server.url, server.url)
        yield sc
        await close_scenario(sc)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster() -> AsyncIterator[Scenario]:
    with ValkeyServer() as valkey:
        a = ReplicaProcess(replica_id="authz-a", redis_url=valkey.url)
        b = ReplicaProcess(replica_id="authz-b", redis_url=valkey.url)
        try:
            a.start(wait=False)
            b.start(wait=False)
            a.wait_ready()
            b.wait_ready()
            sc = await build_scenario("cluster", a.url, b.url)
            yield sc
            await close_scenario(sc)
        finally:
            a.kill()
            b.kill()


# -- the operations: True = allowed, False = refused for lack of permission ------


async def refused(call: Awaitable[Any]) -> tuple[bool, Any]:
    """``(False, None)`` for a permission refusal, ``(True, result)`` for success; else raise."""
    try:
        return True, await call
    except Exception as exc:
        if PERMISSION_REFUSAL.search(str(exc)):
            return False, None
        raise


def assert_trusted_context(result: dict[str, Any], actor: Actor, service: str) -> None:
    """What the provider saw is the caller's true identity, stamped by the hub."""
    assert result == {"service": service, "from": f"{actor.ws}/{actor.cid}", "ws": actor.ws, "user": actor.user_id}


async def op_join(sc: Scenario, actor: Actor) -> bool:
    """Open a new connection into W with the actor's credential."""
    if actor.name == "owner":
        return actor.ws == sc.workspace  # an anonymous owner's workspace is where it connects
    config: dict[str, Any] = {"server_url": sc.actor_url, "workspace": sc.workspace, "client_id": sc.unique("joiner")}
    if actor.join_token:
        config["token"] = actor.join_token
    ok, api = await refused(connect_to_server(config))
    if ok:
        assert api.config["workspace"] == sc.workspace
        await api.disconnect()
    return ok


async def _listed(sc: Scenario, actor: Actor) -> set[str]:
    return {s["id"] for s in await actor.api.list_services({"workspace": sc.workspace})}


async def op_list_public(sc: Scenario, actor: Actor) -> bool:
    return f"{sc.workspace}/provider:pub" in await _listed(sc, actor)


async def op_list_protected(sc: Scenario, actor: Actor) -> bool:
    return f"{sc.workspace}/provider:prot" in await _listed(sc, actor)


async def op_get_public(sc: Scenario, actor: Actor) -> bool:
    ok, info = await refused(actor.api.get_service_info(f"{sc.workspace}/provider:pub"))
    return ok and info["id"] == f"{sc.workspace}/provider:pub"


async def _call(sc: Scenario, actor: Actor, service: str) -> bool:
    ok, svc = await refused(actor.api.get_service(f"{sc.workspace}/provider:{service}"))
    if ok:
        assert_trusted_context(await svc.who(), actor, service)
    return ok


async def op_call_public(sc: Scenario, actor: Actor) -> bool:
    return await _call(sc, actor, "pub")


async def op_call_protected(sc: Scenario, actor: Actor) -> bool:
    return await _call(sc, actor, "prot")


async def op_register(sc: Scenario, actor: Actor) -> bool:
    """Register a service in W: by its short id from inside W, by full id from outside."""
    name = sc.unique("reg")
    sid = f"{sc.workspace}/{actor.cid}:{name}"
    ok, _ = await refused(actor.manager.register_service({"id": sid, "name": name, "config": {"visibility": "public"}}))
    listed = sid in {s["id"] for s in await sc.provider.api.list_services({"workspace": sc.workspace})}
    assert listed == ok, f"register said {ok} but the registry says {listed}"
    if ok:
        await actor.manager.unregister_service(name)
    return ok


async def op_unregister_own(sc: Scenario, actor: Actor) -> bool:
    """Withdraw a service of its own from W (registered first where the actor may)."""
    name = sc.unique("own")
    if actor.ws == sc.workspace:
        with contextlib.suppress(Exception):  # a read-only actor cannot register it: still try to withdraw
            await actor.manager.register_service({"id": name, "name": name, "config": {}})
    ok, _ = await refused(actor.manager.unregister_service(f"{sc.workspace}/{actor.cid}:{name}"))
    return ok


async def op_unregister_other(sc: Scenario, actor: Actor) -> bool:
    """Withdraw or replace the provider's service ``keep``: allowed if either works."""
    victim = f"{sc.workspace}/provider:keep"
    removed, _ = await refused(actor.manager.unregister_service(victim))
    replaced, _ = await refused(
        actor.manager.register_service({"id": victim, "name": "hijacked", "config": {"visibility": "public"}})
    )
    info = await sc.provider.api.get_service_info(victim)
    assert info.get("name") != "hijacked" or replaced
    return removed or replaced


async def _sentinel_wait(got: list[Any], what: str) -> bool:
    """Wait for the sentinel sent after the event under test; was the event delivered before it?"""
    await eventually(lambda: "sentinel" in got, timeout=10, what=what)
    return "broadcast" in got[: got.index("sentinel")]


async def op_emit(sc: Scenario, actor: Actor) -> bool:
    """Broadcast an event into W; the provider (in W, subscribed) tells whether it arrived.

    Then the actor sends the provider a point-to-point event (always delivered,
    §7.3) on the same ordered path: once that sentinel is in, the broadcast
    would have been too.
    """
    event = sc.unique("emit")
    got = await sc.provider.listen(event)
    to = "*" if actor.ws == sc.workspace else f"{sc.workspace}/*"
    await actor.api.emit({"type": event, "to": to, "data": "broadcast"})
    await actor.api.emit({"type": event, "to": f"{sc.workspace}/provider", "data": "sentinel"})
    return await _sentinel_wait(got, f"{actor.name}'s sentinel at the provider")


async def op_receive(sc: Scenario, actor: Actor) -> bool:
    """The provider broadcasts in W; does the actor, subscribed to that type, get it?"""
    event = sc.unique("recv")
    got = await actor.listen(event)
    if actor.ws != sc.workspace:  # naming W's events outright is refused too
        ok, _ = await refused(actor.api.subscribe(f"{sc.workspace}/{event}"))
        assert not ok
    await sc.provider.api.emit({"type": event, "to": "*", "data": "broadcast"})
    await sc.provider.api.emit({"type": event, "to": f"{actor.ws}/{actor.cid}", "data": "sentinel"})
    return await _sentinel_wait(got, f"the provider's sentinel at {actor.name}")


async def op_generate_token(sc: Scenario, actor: Actor) -> bool:
    ok, token = await refused(actor.api.generate_token({"workspace": sc.workspace, "permission": "read"}))
    if ok:
        assert sc.issuer.verify(token).permission(sc.workspace) == Permission.READ
    return ok


async def _http(sc: Scenario, actor: Actor, path: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {actor.http_token}"} if actor.http_token else {}
    response = await sc.http.get(f"/{sc.workspace}/services{path}", headers=headers)
    assert response.status_code in (200, 403), response.text
    return response


async def op_http_call_public(sc: Scenario, actor: Actor) -> bool:
    response = await _http(sc, actor, "/provider:pub/who")
    return response.status_code == 200 and response.json()["service"] == "pub"


async def op_http_call_protected(sc: Scenario, actor: Actor) -> bool:
    response = await _http(sc, actor, "/provider:prot/who")
    return response.status_code == 200 and response.json()["service"] == "prot"


async def op_http_list_protected(sc: Scenario, actor: Actor) -> bool:
    response = await _http(sc, actor, "")
    assert response.status_code == 200
    return f"{sc.workspace}/provider:prot" in {s["id"] for s in response.json()}


OPS: dict[str, Callable[[Scenario, Actor], Awaitable[bool]]] = {name: globals()[f"op_{name}"] for name in OPERATIONS}


def cells() -> list[Any]:
    params = []
    for actor in ACTORS:
        for op in OPERATIONS:
            marks = [pytest.mark.xfail(strict=True, reason=BUGS[(actor, op)])] if (actor, op) in BUGS else []
            params.append(pytest.param(actor, op, marks=marks, id=f"{actor}-{op}"))
    return params


async def check_cell(sc: Scenario, actor: str, op: str) -> None:
    allowed = await OPS[op](sc, sc.actors[actor])
    expected = EXPECTED[(actor, op)]
    assert allowed is expected, (
        f"{actor} {op}: {'allowed' if allowed else 'refused'}, the matrix says {'✓' if expected else '✗'}"
    )


@pytest.mark.parametrize(("actor", "op"), cells())
async def test_cell_on_one_replica(single: Scenario, actor: str, op: str) -> None:
    await check_cell(single, actor, op)


@pytest.mark.cluster
@pytest.mark.parametrize(("actor", "op"), cells())
async def test_cell_across_two_replicas(cluster: Scenario, actor: str, op: str) -> None:
    await check_cell(cluster, actor, op)


async def test_the_documented_matrix_is_the_tested_one() -> None:
    """docs/authorization.md shows EXPECTED cell by cell (bugs as the intended ✗)."""
    text = DOC.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    header = [c.strip().strip("`") for c in rows[0].strip("|").split("|")]
    assert header[1:] == list(OPERATIONS), header
    documented = {}
    for line in rows[1:]:  # the "|---|" line does not start with "| "
        cols = [c.strip() for c in line.strip("|").split("|")]
        name = cols[0].strip("`* ").split()[0]
        if name not in ACTORS:
            break
        for op, mark in zip(OPERATIONS, cols[1:], strict=True):
            assert mark[:1] in ("✓", "✗"), (name, op, mark)
            documented[(name, op)] = mark.startswith("✓")
    assert documented == EXPECTED


# -- no spoofing --------------------------------------------------------------------


def _frame(main: dict[str, Any], extra: Any = None) -> bytes:
    packed = msgpack.packb(main, use_bin_type=True)
    return packed + msgpack.packb(extra, use_bin_type=True) if extra is not None else packed


@contextlib.asynccontextmanager
async def raw_client(url: str, client_id: str, **hello: Any) -> AsyncIterator[tuple[Any, dict[str, Any]]]:
    async with ws_connect(url.replace("http", "ws", 1) + "/ws", open_timeout=5, close_timeout=2) as ws:
        await ws.send(json.dumps({"client_id": client_id, **hello}))
        info = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert info["type"] == "connection_info", info
        yield ws, info


async def next_reply(ws: Any, session: str) -> tuple[dict[str, Any], Any]:
    """The ``<session>.resolve`` or ``.reject`` frame (skipping anything else)."""
    for _ in range(1000):  # frames skipped, each within 10 s
        frame = await asyncio.wait_for(ws.recv(), 10)
        if isinstance(frame, str):
            continue
        unpacker = msgpack.Unpacker(raw=False)
        unpacker.feed(frame)
        parts = list(unpacker)
        if parts[0].get("method") in (f"{session}.resolve", f"{session}.reject"):
            return parts[0], (parts[1] if len(parts) > 1 else None)
    raise AssertionError(f"no reply to {session} within 1000 frames")


FORGED_ROOT = {"id": "root", "roles": ["admin"], "is_anonymous": False, "scope": {"workspaces": {"*": "a"}}}


async def test_a_forged_ws_user_and_from_never_open_a_protected_service(single: Scenario) -> None:
    """An outsider claims to be W's manager, in W, as root: the provider sees who it really is."""
    w = single.workspace
    async with raw_client(single.actor_url, "forger") as (ws, info):
        await ws.send(
            _frame(
                {
                    "type": "method",
                    "to": f"{w}/provider",
                    "method": "services.prot.who",
                    "session": "s-forged",
                    "from": f"*/{info['manager_id']}",
                    "ws": w,
                    "user": FORGED_ROOT,
                },
                {"args": [], "with_kwargs": False, "promise": "*", "t": 10},
            )
        )
        main, extra = await next_reply(ws, "s-forged")
    assert main["method"] == "s-forged.reject", extra
    assert main["from"] == f"{w}/provider"
    assert main["to"] == f"{info['workspace']}/forger"
    assert "Permission denied for invoking protected method" in extra["args"][0]["_rvalue"]


async def test_the_same_forged_call_from_inside_the_workspace_is_stamped_with_the_true_caller(single: Scenario) -> None:
    w = single.workspace
    reader = single.actors["read"]
    async with raw_client(single.actor_url, "insider", token=reader.join_token) as (ws, info):
        await ws.send(
            _frame(
                {
                    "type": "method",
                    "to": "provider",
                    "method": "services.prot.who",
                    "session": "s-in",
                    "from": f"*/{info['manager_id']}",
                    "ws": "elsewhere",
                    "user": FORGED_ROOT,
                },
                {"args": [], "with_kwargs": False, "promise": "*", "t": 10},
            )
        )
        main, extra = await next_reply(ws, "s-in")
    assert main["method"] == "s-in.resolve", extra
    assert extra["args"][0] == {"service": "prot", "from": f"{w}/insider", "ws": w, "user": info["user"]["id"]}


@pytest.mark.parametrize("event", ["client_disconnected", "peer_not_found", "service_added"])
async def test_a_client_cannot_send_server_events_to_anyone(single: Scenario, event: str) -> None:
    """hypha-rpc acts on these without checking the sender: forged, they would fail others' calls."""
    w = single.workspace
    victim = single.actors["read_write"]
    async with raw_client(single.actor_url, "herald") as (ws, _):
        for to in (f"{victim.ws}/{victim.cid}", "*"):
            await ws.send(
                _frame(
                    {"type": event, "to": to, "data": {"id": "provider", "workspace": w}, "peer_id": f"{w}/provider"}
                )
            )
            error = json.loads(await asyncio.wait_for(ws.recv(), 5))
            assert error["type"] == "error"
            assert f"event type '{event}' is reserved for the server" in error["message"]


async def test_a_forged_client_disconnected_does_not_fail_calls_in_flight(single: Scenario) -> None:
    """The attack the refusal stops: an outsider names a provider as gone while a caller waits on it."""
    release = asyncio.Event()

    async def slow() -> str:
        await release.wait()
        return "done"

    provider = await connect_to_server(
        {"server_url": single.provider_url, "client_id": "slowpoke", "token": single.provider.join_token}
    )
    single.clients.append(provider)
    await provider.register_service({"id": "slow", "config": {"visibility": "public"}, "slow": slow})
    caller = single.actors["anonymous"]
    svc = await caller.api.get_service(f"{single.workspace}/slowpoke:slow")
    pending = asyncio.ensure_future(svc.slow())
    async with raw_client(single.actor_url, "herald2") as (ws, _):
        await ws.send(
            _frame(
                {
                    "type": "client_disconnected",
                    "to": f"{caller.ws}/{caller.cid}",
                    "data": {"id": "slowpoke", "workspace": single.workspace},
                }
            )
        )
        assert json.loads(await asyncio.wait_for(ws.recv(), 5))["type"] == "error"
    assert await caller.api.echo("after") == "after"  # the forged frame had its turn before this
    release.set()
    assert await pending == "done"
    await provider.disconnect()


# -- HTTP calls --------------------------------------------------------------------------


async def test_http_cannot_reach_protected_services_through_the_built_in_service(single: Scenario) -> None:
    """Over HTTP the provider sees the manager (root, its own workspace): the context the
    built-in service trusts. Without read permission on W, it stays closed: for such a caller
    the client is not there (404, as for a client that is not: its presence is not theirs to learn)."""
    w = single.workspace
    ran: list[Any] = []
    holder = await connect_to_server(
        {"server_url": single.provider_url, "client_id": "vault", "token": single.actors["read_write"].join_token}
    )
    single.clients.append(holder)
    await holder.register_service(
        {"id": "vault", "config": {"visibility": "protected"}, "secret": "s3cr3t", "wipe": lambda: ran.append("wiped")}
    )
    base = f"/{w}/services/vault:built-in"
    outsider = {"Authorization": f"Bearer {single.actors['other'].http_token}"}
    for headers in ({}, outsider):
        response = await single.http.get(f"{base}/get_service", params={"service_id": "vault"}, headers=headers)
        assert response.status_code == 404, response.text
        assert "s3cr3t" not in response.text
        payload = _frame({"type": "method", "method": "services.vault.wipe"}, {"args": [], "with_kwargs": False})
        for fn, body in (
            ("create", {"key": "k"}),
            ("set", {"key": "k", "index": 0, "data": payload}),
            ("process", {"key": "k"}),
        ):
            response = await single.http.post(
                f"{base}/message_cache.{fn}",
                content=msgpack.packb(body),
                headers={**headers, "Content-Type": "application/msgpack"},
            )
            assert response.status_code == 404, response.text
    reader = {"Authorization": f"Bearer {single.actors['read'].http_token}"}
    response = await single.http.get(f"{base}/ping", params={"msg": "ping"}, headers=reader)
    assert response.status_code == 200  # W's own members still may
    assert response.json() == "pong"
    assert ran == []
    await holder.disconnect()


async def test_an_http_call_reaches_the_provider_as_the_http_caller(single: Scenario) -> None:
    response = await single.http.get(f"/{single.workspace}/services/provider:pub/who")
    assert response.status_code == 200
    seen = response.json()
    assert seen["user"] != "root"
    assert not seen["from"].startswith("*/")


# -- tokens -----------------------------------------------------------------------


def tampered(token: str, **changes: Any) -> str:
    """The same header and signature over a payload with ``changes``."""
    header, payload, signature = token.split(".")
    claims = jwt.decode(token, options={"verify_signature": False})
    claims.update(changes)
    body = jwt.utils.base64url_encode(json.dumps(claims).encode()).decode()
    return f"{header}.{body}.{signature}"


def unsigned(token: str) -> str:
    claims = jwt.decode(token, options={"verify_signature": False})
    return jwt.encode(claims, key=None, algorithm="none")


async def _refused_at_connect(url: str, **config: Any) -> str:
    with pytest.raises(Exception) as caught:  # noqa: PT011 - hypha-rpc raises several types
        await connect_to_server({"server_url": url, **config})
    return str(caught.value)


async def test_a_tampered_or_unsigned_token_is_refused_on_websocket_and_http(single: Scenario) -> None:
    w = single.workspace
    read_token = single.actors["read"].join_token
    assert read_token
    forged = {
        "escalated": tampered(read_token, scope=f"ws:{w}#a wid:{w}"),
        "other-user": tampered(read_token, sub="someone-else"),
        "unsigned": unsigned(read_token),
    }
    for name, token in forged.items():
        message = await _refused_at_connect(single.actor_url, client_id=f"t-{name}", token=token)
        assert "Authentication error: invalid token" in message, (name, message)
        response = await single.http.get(
            f"/{w}/services/provider:prot/who", headers={"Authorization": f"Bearer {token}"}
        )
        assert response.status_code == 401, (name, response.text)
        assert response.json()["detail"].startswith("Authentication error: invalid token"), response.text


async def test_an_expired_token_is_refused_with_a_clear_message(single: Scenario) -> None:
    expired = single.issuer.issue(
        User(id="late"), workspace=single.workspace, permission=Permission.ADMIN, expires_in=-1
    )
    message = await _refused_at_connect(single.actor_url, client_id="late", token=expired)
    assert "Authentication error: token has expired" in message
    response = await single.http.get(
        f"/{single.workspace}/services/provider:prot/who", headers={"Authorization": f"Bearer {expired}"}
    )
    assert response.status_code == 401
    assert response.json()["detail"] == "Authentication error: token has expired"


async def test_a_reconnection_token_is_bound_to_its_client_id_and_workspace(single: Scenario) -> None:
    reader = single.actors["read"]
    token = reader.api.config["reconnection_token"]
    message = await _refused_at_connect(single.actor_url, client_id="not-the-reader", reconnection_token=token)
    assert "Client id mismatch: the reconnection token was issued to another client" in message
    other_ws = single.actors["anonymous"].ws
    message = await _refused_at_connect(
        single.actor_url, client_id=reader.cid, workspace=other_ws, reconnection_token=token
    )
    assert f"reconnection token is for workspace {single.workspace}, not {other_ws}" in message
    assert (await reader.api.check_status())["user_permission"] == "r"  # the holder is unaffected


async def test_a_token_bound_to_a_client_id_admits_only_that_client(single: Scenario) -> None:
    owner = single.actors["owner"]
    token = await owner.api.generate_token({"permission": "read_write", "client_id": "the-one"})
    message = await _refused_at_connect(single.actor_url, client_id="another-one", token=token)
    assert "Client id mismatch: this token is restricted to client with client_id='the-one'" in message
    api = await connect_to_server({"server_url": single.actor_url, "client_id": "the-one", "token": token})
    assert api.config["workspace"] == single.workspace
    await api.disconnect()

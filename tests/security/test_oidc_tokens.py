"""Tokens of an OpenID Connect provider open the hub, and every forgery of one is refused (issue 22).

The provider is real (tests/support/oidc_provider.py: discovery and JWKS over
HTTP on loopback, RSA and EC keys); the hub fetches its keys like any
provider's. The attacker forges tokens every way the issue lists and must get
the reason, never a connection.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from hypha_rpc import connect_to_server
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from support.oidc_provider import AUDIENCE, OidcProvider
from support.tokens import claims, first_reply
from switchboard.hub.identity.oidc import subject_user_id
from switchboard.testing.hub import RunningServer, running, settings_for_tests
from switchboard.testing.wait import eventually, scaled

ALICE = "auth0|5f3c00aa"
BOB = "google-oauth2|1234"


@pytest.fixture
def provider() -> Iterator[OidcProvider]:
    with OidcProvider() as p:
        yield p


@pytest.fixture
async def hub(provider: OidcProvider) -> AsyncIterator[RunningServer]:
    settings = settings_for_tests(**provider.settings(oidc_key_refetch_interval=1.0))
    async with running(settings) as srv:
        yield srv


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unsigned(provider: OidcProvider, header: dict[str, Any], body: dict[str, Any] | None = None) -> tuple[str, str]:
    now = int(time.time())
    body = body or {"iss": provider.issuer, "aud": AUDIENCE, "sub": ALICE, "iat": now, "exp": now + 300}
    return _b64(json.dumps(header).encode()), _b64(json.dumps(body).encode())


def _forge(provider: OidcProvider, how: str) -> str:
    now = int(time.time())
    rsa = provider.published[0]
    if how == "expired":
        return provider.token(ALICE, exp=now - 120, iat=now - 600)
    if how == "not yet valid":
        return provider.token(ALICE, nbf=now + 600)
    if how == "wrong audience":
        return provider.token(ALICE, aud="some-other-app")
    if how == "wrong issuer":
        return provider.token(ALICE, iss="https://evil.example/")
    if how == "unpublished key":
        return provider.token(ALICE, kid=provider.add_key("rsa", publish=False))
    if how == "alg none":
        head, body = _unsigned(provider, {"alg": "none", "typ": "JWT", "kid": rsa})
        return f"{head}.{body}."
    if how == "HS256 keyed with the public key":
        head, body = _unsigned(provider, {"alg": "HS256", "typ": "JWT", "kid": rsa})
        mac = hmac.new(provider.public_pem(rsa), f"{head}.{body}".encode(), hashlib.sha256).digest()
        return f"{head}.{body}.{_b64(mac)}"
    if how == "tampered payload":
        head, _, sig = provider.token(BOB).split(".")
        _, body = _unsigned(provider, {})  # the same claims but for ALICE, under BOB's signature
        return f"{head}.{body}.{sig}"
    raise AssertionError(how)


REASONS = {
    "expired": "token has expired",
    "not yet valid": "not valid yet",
    "wrong audience": "wrong audience",
    "wrong issuer": "unknown issuer",
    "unpublished key": "unknown key",
    "alg none": "algorithm 'none' is not accepted",
    "HS256 keyed with the public key": "algorithm 'HS256' is not accepted",
    "tampered payload": "bad signature",
}


@pytest.mark.parametrize("kind", ["rsa", "ec"])
async def test_a_providers_token_opens_its_users_own_workspace(
    hub: RunningServer, provider: OidcProvider, kind: str
) -> None:
    kid = next(k for k in provider.published if k.startswith(kind))
    token = provider.token(ALICE, kid=kid, email="alice@example.org", email_verified=True)
    reply = await first_reply(hub.url, "alices-laptop", token=token)
    assert reply["type"] == "connection_info", reply
    assert reply["workspace"] == f"ws-user-{ALICE}"
    assert reply["user"]["email"] == "alice@example.org"
    assert claims(reply["reconnection_token"])["exp"] <= claims(token)["exp"], "outlives the provider's token"


@pytest.mark.parametrize("how", list(REASONS))
async def test_each_forgery_is_refused_with_its_reason(hub: RunningServer, provider: OidcProvider, how: str) -> None:
    reply = await first_reply(hub.url, "mallory", token=_forge(provider, how))
    assert reply["type"] == "error", f"{how}: admitted as {reply.get('user')}"
    assert REASONS[how] in reply["message"], reply["message"]
    assert "Traceback" not in reply["message"]


@pytest.mark.parametrize("how", ["wrong audience", "wrong issuer", "unpublished key"])
async def test_the_close_frame_carries_the_reason(hub: RunningServer, provider: OidcProvider, how: str) -> None:
    async with ws_connect(hub.url.replace("http", "ws", 1) + "/ws", open_timeout=5) as ws:
        hello = {"client_id": "mallory", "workspace": None, "token": _forge(provider, how), "reconnection_token": None}
        await ws.send(json.dumps(hello))
        error = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert error["type"] == "error"
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 5)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1008
    assert REASONS[how] in closed.value.rcvd.reason


@pytest.mark.parametrize("how", ["expired", "wrong audience", "tampered payload"])
async def test_http_calls_refuse_a_forgery_with_a_401_and_its_reason(
    hub: RunningServer, provider: OidcProvider, how: str
) -> None:
    async with httpx.AsyncClient(base_url=hub.url, timeout=5) as http:
        response = await http.get(
            f"/ws-user-{ALICE}/services", headers={"Authorization": f"Bearer {_forge(provider, how)}"}
        )
    assert response.status_code == 401, response.text
    assert REASONS[how] in response.json()["detail"]


async def test_a_rotated_key_is_accepted_within_seconds_without_a_restart(
    hub: RunningServer, provider: OidcProvider
) -> None:
    assert (await first_reply(hub.url, "before", token=provider.token(ALICE)))["type"] == "connection_info"
    new = provider.add_key("ec")
    fetched = provider.fetches
    started = time.monotonic()

    async def accepted() -> bool:
        reply = await first_reply(hub.url, "after", token=provider.token(ALICE, kid=new))
        return reply["type"] == "connection_info"

    await eventually(accepted, "the rotated key accepted", timeout=5)
    assert time.monotonic() - started < scaled(3), "a rotated key took longer than the refetch interval allows"
    # made-up key ids cost the provider at most one fetch per refetch interval
    for i in range(20):
        await first_reply(hub.url, "flood", token=provider.token(ALICE, kid=provider.add_key("ec", publish=False)))
        assert i < 19 or provider.fetches - fetched <= 3, f"{provider.fetches - fetched} fetches for 20 bad kids"


async def test_while_the_provider_is_down_cached_keys_keep_working(hub: RunningServer, provider: OidcProvider) -> None:
    assert (await first_reply(hub.url, "first", token=provider.token(ALICE)))["type"] == "connection_info"
    provider.stop()
    reply = await first_reply(hub.url, "second", token=provider.token(BOB))
    assert reply["type"] == "connection_info", reply
    unknown = await first_reply(hub.url, "third", token=provider.token(BOB, kid=provider.add_key("rsa")))
    assert "unknown key" in unknown["message"]
    after = await first_reply(hub.url, "fourth", token=provider.token(BOB))  # a failed fetch keeps the cache
    assert after["type"] == "connection_info", after
    async with httpx.AsyncClient(base_url=hub.url, timeout=5) as http:
        assert (await http.get("/health/readiness")).status_code == 200


async def test_a_failed_fetch_keeps_the_cached_keys(hub: RunningServer, provider: OidcProvider) -> None:
    assert (await first_reply(hub.url, "first", token=provider.token(ALICE)))["type"] == "connection_info"
    provider.failing = True
    tried = provider.fetches

    async def fetch_tried() -> bool:  # an unknown key id makes the hub fetch once the refetch interval passed
        await first_reply(hub.url, "probe", token=provider.token(ALICE, kid=provider.add_key("rsa", publish=False)))
        return provider.fetches > tried

    await eventually(fetch_tried, "a fetch from the failing provider", timeout=5)
    reply = await first_reply(hub.url, "after", token=provider.token(BOB))
    assert reply["type"] == "connection_info", f"a failed fetch lost the cached keys: {reply}"


async def test_the_unmodified_client_signs_in_and_keeps_another_subject_out(
    hub: RunningServer, provider: OidcProvider
) -> None:
    alice = await connect_to_server({"server_url": hub.url, "client_id": "lab", "token": provider.token(ALICE)})
    try:
        assert alice.config["workspace"] == f"ws-user-{ALICE}"
        await alice.register_service({"id": "notes", "config": {"visibility": "protected"}, "read": lambda: "mine"})
        bob = await connect_to_server({"server_url": hub.url, "client_id": "bobs", "token": provider.token(BOB)})
        try:
            assert bob.config["workspace"] == f"ws-user-{BOB}"
            with pytest.raises(Exception, match="(?i)permission|denied|not found"):  # noqa: PT011
                await bob.get_service(f"ws-user-{ALICE}/lab:notes")
        finally:
            await bob.disconnect()
        # HTTP calls with the provider's bearer token: alice in, bob out
        async with httpx.AsyncClient(base_url=hub.url, timeout=10) as http:
            url = f"/ws-user-{ALICE}/services/lab:notes/read"
            mine = await http.get(url, headers={"Authorization": f"Bearer {provider.token(ALICE)}"})
            assert mine.status_code == 200, mine.text
            assert mine.json() == "mine"
            theirs = await http.get(url, headers={"Authorization": f"Bearer {provider.token(BOB)}"})
            assert theirs.status_code in (403, 404), theirs.text
    finally:
        await alice.disconnect()


async def test_the_http_streaming_transport_takes_a_providers_bearer_token(
    hub: RunningServer, provider: OidcProvider
) -> None:
    headers = {"Authorization": f"Bearer {provider.token(ALICE)}"}
    async with httpx.AsyncClient(base_url=hub.url, timeout=5) as http:
        async with http.stream("GET", "/rpc", params={"client_id": "streamer"}, headers=headers) as response:
            assert response.status_code == 200
        forged = {"Authorization": f"Bearer {_forge(provider, 'wrong audience')}"}
        async with http.stream("GET", "/rpc", params={"client_id": "streamer2"}, headers=forged) as response:
            assert response.status_code == 401
            assert "wrong audience" in (await response.aread()).decode()


async def test_the_unmodified_http_streaming_client_signs_in_with_a_providers_token(
    hub: RunningServer, provider: OidcProvider
) -> None:
    client = await connect_to_server(
        {"server_url": hub.url, "transport": "http", "client_id": "streamed", "token": provider.token(ALICE)}
    )
    try:
        assert client.config["workspace"] == f"ws-user-{ALICE}"
        await client.register_service({"id": "echo", "config": {"visibility": "protected"}, "echo": lambda x: x})
        echo = await client.get_service(f"ws-user-{ALICE}/streamed:echo")
        assert await echo.echo("over http") == "over http"
    finally:
        await client.disconnect()


async def test_hub_tokens_keep_working_beside_the_providers(hub: RunningServer, provider: OidcProvider) -> None:
    from support.tokens import credential

    token, _ = credential("operator-made", 60)
    reply = await first_reply(hub.url, "ops", token=token)
    assert reply["type"] == "connection_info", reply
    assert reply["workspace"] == "ws-user-operator-made"


async def test_the_same_subject_lands_in_the_same_workspace_after_a_restart(provider: OidcProvider) -> None:
    settings = settings_for_tests(**provider.settings())
    seen = []
    for _ in range(2):
        async with running(settings) as srv:
            reply = await first_reply(srv.url, "lab", token=provider.token("0b9d2c64-4e1c-4c1d-9d57-2b7f0a1e6f11"))
            seen.append(reply["workspace"])
    assert seen == [f"ws-user-{subject_user_id('0b9d2c64-4e1c-4c1d-9d57-2b7f0a1e6f11')}"] * 2

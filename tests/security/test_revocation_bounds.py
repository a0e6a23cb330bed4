"""What the revocation store holds is bounded per principal and hub-wide (issue 37, item 11). The attacker is an
anonymous client that mints and revokes its own tokens in a loop (each revocation once kept for a year, the whole
store copied on every revoke), and an account doing the same through tokens derived from its own."""

from __future__ import annotations

from collections.abc import AsyncIterator

import jwt
import pytest
import pytest_asyncio
from hypha_rpc import connect_to_server
from hypha_rpc.rpc import RemoteException

from support.tokens import credential
from switchboard.testing.hub import RunningServer, running, settings_for_tests

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(60)]

PER_USER = 8
HUB_WIDE = 20


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def hub() -> AsyncIterator[RunningServer]:
    settings = settings_for_tests(max_revocations_per_user=PER_USER, max_revocations=HUB_WIDE)
    async with running(settings) as srv:
        yield srv


async def _mint_and_revoke(client, times: int) -> str | None:
    """Mint and revoke ``times`` tokens; the refusal's message, if one came."""
    for _ in range(times):
        token = await client.generate_token({"permission": "read", "expires_in": 365 * 24 * 3600})
        try:
            await client.revoke_token(token)
        except RemoteException as exc:
            return str(exc)
    return None


async def test_anonymous_clients_minting_and_revoking_tokens_share_one_bounded_allowance(hub: RunningServer) -> None:
    first = await connect_to_server({"server_url": hub.url, "client_id": "anon-1"})
    second = await connect_to_server({"server_url": hub.url, "client_id": "anon-2"})
    alice = await connect_to_server({"server_url": hub.url, "client_id": "alice", "token": credential("alice", 600)[0]})
    try:
        refusal = await _mint_and_revoke(first, PER_USER + 5)
        assert refusal is not None
        assert f"Too many revoked tokens for anonymous users: at most {PER_USER}" in refusal
        # a fresh anonymous identity is free: it gets no allowance of its own
        assert "Too many revoked tokens" in str(await _mint_and_revoke(second, 1))
        assert len(hub.hub.gate.credentials.revocations) == PER_USER  # type: ignore[arg-type]
        assert await _mint_and_revoke(alice, 1) is None, "an account still revokes its tokens"
    finally:
        for c in (first, second, alice):
            await c.disconnect()


async def test_an_account_is_bounded_through_every_token_derived_from_it(hub: RunningServer) -> None:
    bob = await connect_to_server({"server_url": hub.url, "client_id": "bob", "token": credential("bob", 600)[0]})
    try:
        child = await bob.generate_token({"permission": "admin", "expires_in": 600})
        bobs_child = await connect_to_server({"server_url": hub.url, "client_id": "bob-child", "token": child})
        try:
            refusal = await _mint_and_revoke(bobs_child, PER_USER + 5)  # each minted token is a new user id
        finally:
            await bobs_child.disconnect()
        assert refusal is not None
        assert f"Too many revoked tokens for bob: at most {PER_USER}" in refusal
    finally:
        await bob.disconnect()


async def test_past_the_hub_wide_ceiling_a_revoke_is_refused_with_a_clear_error(hub: RunningServer) -> None:
    refusal = None
    for n in range(HUB_WIDE):  # bounded: the ceiling is reached within HUB_WIDE accounts at most
        user = await connect_to_server(
            {"server_url": hub.url, "client_id": f"crowd-{n}", "token": credential(f"crowd-{n}", 600)[0]}
        )
        try:
            refusal = await _mint_and_revoke(user, PER_USER)
        finally:
            await user.disconnect()
        if refusal is not None:
            break
    assert refusal is not None
    assert f"The hub holds its maximum of {HUB_WIDE} revoked tokens" in refusal
    assert len(hub.hub.gate.credentials.revocations) == HUB_WIDE  # type: ignore[arg-type]


async def test_an_anonymous_users_tokens_live_a_day_at_most(hub: RunningServer) -> None:
    anonymous = await connect_to_server({"server_url": hub.url, "client_id": "anon-3"})
    try:
        token = await anonymous.generate_token({"permission": "read", "expires_in": 365 * 24 * 3600})
    finally:
        await anonymous.disconnect()
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["exp"] - claims["iat"] <= 24 * 3600 + 1

"""Named users on a hub of several replicas (issue 22): a provider's user is the same user on every replica and
after a restart, and a token revoked on one replica is refused on the others within a second, with every
reconnection token derived from it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from hypha_rpc import connect_to_server

from support.oidc_provider import OidcProvider
from support.tokens import credential, first_reply
from switchboard.testing.wait import eventually, scaled

ALICE = "auth0|5f3c00aa"


@pytest.fixture
def provider() -> Iterator[OidcProvider]:
    with OidcProvider() as p:
        yield p


def _oidc_args(provider: OidcProvider) -> list[str]:
    audience = provider.settings()["oidc_audience"]
    return ["--oidc-issuer", provider.issuer, "--oidc-audience", audience, "--oidc-allow-http"]


async def test_the_same_subject_is_the_same_user_on_every_replica_and_after_a_restart(
    replicas, provider: OidcProvider
) -> None:
    a = replicas.start("oidc-a", *_oidc_args(provider))
    b = replicas.start("oidc-b", *_oidc_args(provider))
    alice = await connect_to_server({"server_url": a.url, "client_id": "lab", "token": provider.token(ALICE)})
    try:
        await alice.register_service({"id": "notes", "config": {"visibility": "protected"}, "read": lambda: "mine"})
        for _ in range(2):  # on B, then on B restarted
            again = await connect_to_server({"server_url": b.url, "client_id": "desk", "token": provider.token(ALICE)})
            try:
                assert again.config["workspace"] == f"ws-user-{ALICE}"
                notes = await again.get_service(f"ws-user-{ALICE}/lab:notes")
                assert await notes.read() == "mine"
            finally:
                await again.disconnect()
            bob = await first_reply(
                b.url, "bobs", token=provider.token("google-oauth2|1234"), workspace=f"ws-user-{ALICE}"
            )
            assert bob["type"] == "error", f"another subject entered alice's workspace: {bob}"
            b.restart()
    finally:
        await alice.disconnect()


async def test_a_token_revoked_on_one_replica_is_refused_on_the_other_within_a_second(replicas) -> None:
    a = replicas.start("revoke-a")
    b = replicas.start("revoke-b")
    token, _ = credential("erin", 600)
    client = await connect_to_server({"server_url": a.url, "client_id": "erins", "token": token})
    resume, workspace = client.config["reconnection_token"], client.config["workspace"]
    try:
        before = await first_reply(b.url, "erins-probe", token=token)
        assert before["type"] == "connection_info", before
        await client.revoke_token(token)
        revoked_at = time.monotonic()
    finally:
        await client.disconnect()

    async def refused_on_b() -> bool:
        reply = await first_reply(b.url, "erins-probe", token=token)
        return reply["type"] == "error" and "revoked" in reply["message"]

    await eventually(refused_on_b, "the revoked token refused on B", timeout=1.0, interval=0.05)
    assert time.monotonic() - revoked_at < scaled(1.0), "B took longer than a second"
    resumed = await first_reply(b.url, "erins", reconnection_token=resume, workspace=workspace)
    assert resumed["type"] == "error", f"B resumed a client with a reconnection token of a revoked token: {resumed}"
    assert "revoked" in resumed["message"]
    async with httpx.AsyncClient(base_url=b.url, timeout=5) as http:
        response = await http.get(f"/{workspace}/services", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 401
    assert "revoked" in response.json()["detail"]

"""A revoked token stops working everywhere it worked, and only its holder or its workspace's admins may revoke it
(issue 22). The attacker keeps a copy of a token after its holder revoked it, and an outsider tries to revoke
someone else's."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from hypha_rpc import connect_to_server

from support.oidc_provider import OidcProvider
from support.tokens import credential, first_reply
from switchboard.clock import SystemClock
from switchboard.hub.identity.auth import TokenIssuer
from switchboard.hub.identity.users import Permission, User
from switchboard.testing.hub import TEST_SECRET, RunningServer, running, settings_for_tests


@pytest.fixture
def provider() -> Iterator[OidcProvider]:
    with OidcProvider() as p:
        yield p


@pytest.fixture
async def hub(provider: OidcProvider) -> AsyncIterator[RunningServer]:
    async with running(settings_for_tests(**provider.settings())) as srv:
        yield srv


def _grant(user_id: str, workspace: str, permission: Permission) -> str:
    issuer = TokenIssuer(TEST_SECRET, SystemClock())
    user = User(id=user_id, grants={workspace: permission})
    return issuer.issue(user, workspace=workspace, permission=permission, expires_in=600)


async def _refused_everywhere(url: str, token: str, resume: str, workspace: str, client_id: str) -> None:
    fresh = await first_reply(url, client_id + "-again", token=token)
    assert fresh["type"] == "error", f"a revoked token still connects: {fresh}"
    assert "revoked" in fresh["message"]
    resumed = await first_reply(url, client_id, reconnection_token=resume, workspace=workspace)
    assert resumed["type"] == "error", f"a reconnection token of a revoked token still resumes: {resumed}"
    assert "revoked" in resumed["message"]
    async with httpx.AsyncClient(base_url=url, timeout=5) as http:
        response = await http.get(f"/{workspace}/services", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 401, response.text
    assert "revoked" in response.json()["detail"]


@pytest.mark.parametrize("source", ["hub", "provider"])
async def test_the_holder_revokes_its_token_and_what_derives_from_it(
    hub: RunningServer, provider: OidcProvider, source: str
) -> None:
    token = credential("alice", 600)[0] if source == "hub" else provider.token("auth0|alice")
    client = await connect_to_server({"server_url": hub.url, "client_id": "alices", "token": token})
    resume, workspace = client.config["reconnection_token"], client.config["workspace"]
    try:
        await client.revoke_token(token)
    finally:
        await client.disconnect()
    await _refused_everywhere(hub.url, token, resume, workspace, "alices")


async def test_an_outsider_cannot_revoke_someone_elses_token(hub: RunningServer, provider: OidcProvider) -> None:
    alices = provider.token("auth0|alice")
    mallory = await connect_to_server({"server_url": hub.url, "client_id": "m", "token": provider.token("auth0|mal")})
    try:
        with pytest.raises(Exception, match="only the holder of a token or an admin"):  # noqa: PT011
            await mallory.revoke_token(alices)
    finally:
        await mallory.disconnect()
    assert (await first_reply(hub.url, "alices", token=alices))["type"] == "connection_info"


async def test_an_admin_of_the_workspace_revokes_a_members_token(hub: RunningServer) -> None:
    member = _grant("carol", "lab-shared", Permission.READ_WRITE)
    member_client = await connect_to_server({"server_url": hub.url, "client_id": "carols", "token": member})
    resume = member_client.config["reconnection_token"]
    await member_client.disconnect()
    admin = await connect_to_server(
        {"server_url": hub.url, "client_id": "dave", "token": _grant("dave", "lab-shared", Permission.ADMIN)}
    )
    reader = await connect_to_server(
        {"server_url": hub.url, "client_id": "erin", "token": _grant("erin", "lab-shared", Permission.READ_WRITE)}
    )
    try:
        with pytest.raises(Exception, match="only the holder of a token or an admin"):  # noqa: PT011
            await reader.revoke_token(member)  # a member, not an admin
        await admin.revoke_token(member)
    finally:
        await admin.disconnect()
        await reader.disconnect()
    await _refused_everywhere(hub.url, member, resume, "lab-shared", "carols")

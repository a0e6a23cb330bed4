"""A provider's login owns only what is its own (issue 37, items 6 and 7), against a real OpenID
Connect provider on loopback (tests/support/oidc_provider.py) and an unmodified hypha-rpc client:

- an email makes an owner only when the provider verified it (``email_verified: true``), or when
  the hub is told the provider verifies every address (``--oidc-trust-email``);
- the CLI's operator users and the provider's subjects are distinct: ``switchboard token --user
  alice`` is not the provider's ``alice``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from hypha_rpc import connect_to_server
from hypha_rpc.rpc import RemoteException

from support.oidc_provider import OidcProvider
from switchboard.cli import main
from switchboard.testing.hub import TEST_SECRET, RunningServer, running, settings_for_tests

pytestmark = pytest.mark.timeout(60)

VICTIM_EMAIL = "victim@example.org"


@pytest.fixture(scope="module")
def provider() -> Iterator[OidcProvider]:
    with OidcProvider() as p:
        yield p


@pytest.fixture
async def hub(provider: OidcProvider) -> AsyncIterator[RunningServer]:
    async with running(settings_for_tests(**provider.settings())) as srv:
        yield srv


@pytest.fixture
async def trusting_hub(provider: OidcProvider) -> AsyncIterator[RunningServer]:
    async with running(settings_for_tests(**provider.settings(oidc_trust_email=True))) as srv:
        yield srv


@pytest.fixture
async def clients() -> AsyncIterator[Any]:
    made: list[Any] = []

    async def _connect(url: str, **config: Any) -> Any:
        client = await connect_to_server({"server_url": url, "method_timeout": 20, **config})
        made.append(client)
        return client

    yield _connect
    for client in reversed(made):
        await client.disconnect()


async def victims_workspace(url: str, clients: Any, provider: OidcProvider) -> str:
    """A record the victim created naming its (verified) email as owner."""
    victim = await clients(
        url, client_id="victim", token=provider.token("victim-sub", email=VICTIM_EMAIL, email_verified=True)
    )
    ws = f"vault-{uuid.uuid4().hex[:8]}"
    await victim.create_workspace({"id": ws, "owners": [VICTIM_EMAIL]})
    return ws


@pytest.mark.parametrize("verified", [None, False, "true"])
async def test_an_unverified_email_does_not_make_its_claimant_an_owner(
    hub: RunningServer, provider: OidcProvider, clients: Any, verified: object
) -> None:
    ws = await victims_workspace(hub.url, clients, provider)
    # mallory's account at the provider claims the victim's address, unverified
    mallory = await clients(
        hub.url, client_id="mallory", token=provider.token("mallory-sub", email=VICTIM_EMAIL, email_verified=verified)
    )
    with pytest.raises(RemoteException, match="Permission denied"):
        await mallory.get_workspace_info(ws)
    with pytest.raises(RemoteException, match="Permission denied"):
        await mallory.delete_workspace(ws)
    assert mallory.config["user"]["email"] is None  # an unverified address is not the user's


async def test_a_verified_email_makes_its_holder_an_owner(
    hub: RunningServer, provider: OidcProvider, clients: Any
) -> None:
    ws = await victims_workspace(hub.url, clients, provider)
    laptop = await clients(
        hub.url, client_id="laptop", token=provider.token("victim-sub-2", email=VICTIM_EMAIL, email_verified=True)
    )
    assert (await laptop.get_workspace_info(ws))["id"] == ws


async def test_a_provider_configured_as_verifying_makes_its_emails_count(
    trusting_hub: RunningServer, provider: OidcProvider, clients: Any
) -> None:
    ws = await victims_workspace(trusting_hub.url, clients, provider)
    laptop = await clients(
        trusting_hub.url, client_id="laptop", token=provider.token("victim-sub-2", email=VICTIM_EMAIL)
    )
    assert (await laptop.get_workspace_info(ws))["id"] == ws


async def test_the_clis_user_alice_is_not_the_providers_subject_alice(
    hub: RunningServer, provider: OidcProvider, clients: Any
) -> None:
    # the provider's alice keeps a protected service in her own workspace
    alice = await clients(hub.url, client_id="alice", token=provider.token("alice"))
    await alice.register_service({"id": "diary", "config": {"visibility": "protected"}, "read": lambda: "secret"})
    # an operator hands a CLI user named alice a read token for a shared workspace
    printed = CliRunner().invoke(
        main,
        ["token", "--user", "alice", "--workspace", "lab_shared", "--permission", "read", "--jwt-secret", TEST_SECRET],
    )
    assert printed.exit_code == 0, printed.output
    operator_alice = await clients(hub.url, client_id="op-alice", token=printed.output.strip())
    assert operator_alice.config["user"]["id"] != alice.config["user"]["id"]
    with pytest.raises(RemoteException, match="(?i)permission"):
        await operator_alice.get_service(f"{alice.config['workspace']}/alice:diary")


def _printed(user: str, workspace: str, permission: str, expires_in: float) -> str:
    args = ["token", "--user", user, "--workspace", workspace, "--permission", permission]
    result = CliRunner().invoke(main, [*args, "--expires-in", str(expires_in), "--jwt-secret", TEST_SECRET])
    assert result.exit_code == 0, result.output
    return result.output.strip()


async def test_a_60s_operator_admin_grant_never_becomes_ownership_of_the_attackers_provider_login(
    hub: RunningServer, provider: OidcProvider, clients: Any
) -> None:
    ws = f"proj_{uuid.uuid4().hex[:8]}"
    lead = await clients(hub.url, client_id="lead", token=_printed("lead", ws, "admin", 600), workspace=ws)
    await lead.create_workspace({"id": ws})
    grant = _printed("mallory", ws, "admin", 60)
    mallory = await clients(hub.url, client_id="mallory-op", token=grant, workspace=ws)
    with pytest.raises(RemoteException, match="only an owner changes"):
        await mallory.create_workspace({"id": ws, "owners": ["mallory"]}, overwrite=True)
    assert (await mallory.create_workspace({"id": ws}, overwrite=True))["owners"] == ["op.lead"]
    await mallory.revoke_token(grant)
    login = await clients(hub.url, client_id="mallory-login", token=provider.token("mallory"))
    with pytest.raises(RemoteException, match="Permission denied"):
        await login.get_workspace_info(ws)

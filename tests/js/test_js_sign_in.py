"""Signing in with an OpenID Connect provider's token from a browser (issue 22): the unmodified hypha-rpc
JavaScript client in Chromium (and Node) lands in its user's own workspace, and the web console signs in with
such a token; the provider is a real one on loopback (tests/support/oidc_provider.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from support.oidc_provider import OidcProvider
from switchboard.config import Settings
from switchboard.testing.hub import settings_for_tests
from switchboard.testing.wait import eventually

pytestmark = [pytest.mark.timeout(90)]

ALICE = "auth0|5f3c00aa"


@pytest.fixture
def provider() -> Iterator[OidcProvider]:
    with OidcProvider() as p:
        yield p


@pytest.fixture
def settings(provider: OidcProvider) -> Settings:
    return settings_for_tests(**provider.settings())


async def test_the_js_client_signs_in_with_a_providers_token(start_agent, server, connect, provider) -> None:
    agent = await start_agent(server_url=server.url, token=provider.token(ALICE), client_id="browser")
    assert agent.workspace == f"ws-user-{ALICE}"
    # the same person from Python, with another of the provider's tokens: the same workspace, the agent's service
    desk = await connect(client_id="desk", token=provider.token(ALICE))
    assert desk.config["workspace"] == agent.workspace
    js = await desk.get_service(agent.service_id)
    assert await js.echo("hi") == "hi"


async def test_a_forged_token_is_refused_in_the_browser_with_its_reason(start_agent, server, provider) -> None:
    agent = await start_agent(
        server_url=server.url, token=provider.token(ALICE, aud="another-app"), client_id="forged", wait=False
    )
    await agent.wait_log("wrong audience", timeout=15)


async def test_the_console_signs_in_with_a_providers_token(js_tools, chromium, server, connect, provider) -> None:
    alice = await connect(client_id="lab", token=provider.token(ALICE))
    await alice.register_service({"id": "vault", "config": {"visibility": "protected"}, "peek": lambda: "s"})
    vault = f'[data-service="ws-user-{ALICE}/lab:vault"]'
    async with chromium.page() as page:
        await page.goto(f"{server.url}/console")
        await eventually(lambda: page.evaluate("document.body.dataset.updated"), timeout=5, what="first update")
        assert not await page.evaluate(f"!!document.querySelector({json.dumps(vault)})")
        await page.evaluate(
            f"document.getElementById('token').value = {json.dumps(provider.token(ALICE))};"
            "document.getElementById('signin-button').click()"
        )
        await eventually(
            lambda: page.evaluate(f"!!document.querySelector({json.dumps(vault)})"),
            timeout=5,
            what="alice's protected service after signing in",
        )
        assert ALICE in await page.evaluate("document.getElementById('viewer').textContent")

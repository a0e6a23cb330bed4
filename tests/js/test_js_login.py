"""The JavaScript client's ``login()`` against ``public/hypha-login`` (issue 39), unmodified: in headless
Chromium, where a person signs in by filling the provider's login form in another tab, and in Node, where the
person's browser is played over HTTP; the token then calls a protected service of the user's workspace."""

from __future__ import annotations

import asyncio
import json
import os
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypha_rpc import connect_to_server

from support.node_oidc import CLIENT_ID, CLIENT_SECRET, MODULES, node_provider, sign_in
from switchboard.config import Settings
from switchboard.testing.hub import RunningServer, settings_for_tests
from switchboard.testing.ports import free_port
from switchboard.testing.replica import ReplicaProcess
from switchboard.testing.wait import eventually

pytestmark = [pytest.mark.timeout(90)]

ALICE = "alice-js"
PUBLIC = "http://switchboard.test"  # the public URL of the replicas below (a load balancer's)


@pytest.fixture(scope="module")
def hub_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def issuer(hub_port: int, js_tools: None) -> Iterator[str]:
    callbacks = [f"{base}/public/apps/hypha-login/callback" for base in (f"http://127.0.0.1:{hub_port}", PUBLIC)]
    with node_provider(callbacks) as url:
        yield url


@pytest.fixture
def settings(issuer: str, hub_port: int, tmp_path: Any) -> Settings:
    secret = tmp_path / "client-secret"
    secret.write_text(CLIENT_SECRET)
    return settings_for_tests(
        port=hub_port,
        oidc_issuer=issuer,
        oidc_allow_http=True,
        oidc_audience=CLIENT_ID,
        oidc_client_id=CLIENT_ID,
        oidc_client_secret_file=str(secret),
    )


async def _calls_a_protected_service_of_alices_workspace(url: str, token: str) -> None:
    owner = await connect_to_server({"server_url": url, "token": token, "client_id": "lab"})
    try:
        assert owner.config["workspace"] == f"ws-user-{ALICE}"
        await owner.register_service({"id": "notes", "config": {"visibility": "protected"}, "read": lambda: "mine"})
        other = await connect_to_server({"server_url": url, "token": token, "client_id": "desk"})
        try:
            assert await (await other.get_service(f"ws-user-{ALICE}/lab:notes")).read() == "mine"
        finally:
            await other.disconnect()
    finally:
        await owner.disconnect()


async def _chromium_login(chromium: Any, static_server: Any, server_url: str, page_at: str | None = None) -> str:
    """``login()`` in a page whose client talks to ``server_url``; in another tab the person fills the
    provider's form (``page_at``: where the login page must be served, if named)."""
    config = {"server_url": server_url}
    async with chromium.tabs(2) as (app, person):
        await app.goto(f"{static_server.url}/login.html#{urllib.parse.quote(json.dumps(config))}")

        async def reported(kind: str) -> Any:
            state = await app.evaluate("window.login")
            if state and state.get("error"):
                raise AssertionError(state["error"])
            return state.get(kind) if state else None

        login_url = await eventually(lambda: reported("url"), what="login() giving the login_url", timeout=20)
        if page_at is not None:
            assert login_url.startswith(f"{page_at}/public/apps/hypha-login/"), login_url
        await person.goto(login_url)  # the hub's page sends the tab to the provider's login form
        await person.evaluate(
            f"document.querySelector('input[name=login]').value = {json.dumps(ALICE)};"
            "document.querySelector('input[name=password]').value = 'any';"
            "document.querySelector('form').submit()"
        )

        async def at(text: str) -> bool:
            return text in (await person.evaluate("document.body ? document.body.innerText : ''") or "")

        await eventually(lambda: at("Continue"), what="the provider's consent page", timeout=15)
        await person.evaluate("document.querySelector('form').submit()")
        await eventually(lambda: at("You are signed in"), what="the hub's callback page", timeout=15)
        token: str = await eventually(lambda: reported("token"), what="login() returning the token", timeout=20)
    return token


async def test_login_in_chromium_with_the_providers_form_filled_in_another_tab(
    server: RunningServer, chromium: Any, static_server: Any
) -> None:
    token = await _chromium_login(chromium, static_server, server.url)
    await _calls_a_protected_service_of_alices_workspace(server.url, token)


async def _node_login(server_url: str, route: Callable[[str], str] = lambda url: url) -> str:
    """``login()`` in Node against ``server_url``; the person signs in over HTTP at the URL it prints."""
    proc = await asyncio.create_subprocess_exec(
        "node",
        str(Path(__file__).parent / "node_login.mjs"),
        json.dumps({"server_url": server_url}),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "SB_JS_MODULES": str(MODULES)},
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        for _ in range(50):  # URL, then TOKEN or ERROR (and any warnings between)
            raw = await asyncio.wait_for(proc.stdout.readline(), 30)
            line = raw.decode().rstrip()
            lines.append(line)
            if line.startswith("URL "):
                page = await sign_in(route(line[4:]), ALICE, route=route)
                assert page.status_code == 200, page.text
            if not raw or line.startswith(("TOKEN ", "ERROR ")):
                break
        assert lines[-1].startswith("TOKEN "), "\n".join(lines)
        return lines[-1][6:]
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def test_login_in_node(server: RunningServer, js_tools: None) -> None:
    await _calls_a_protected_service_of_alices_workspace(server.url, await _node_login(server.url))


async def test_login_in_node_started_on_one_replica_finishes_on_the_other(issuer: str, redis_server: Any) -> None:
    args = ["--oidc-issuer", issuer, "--oidc-audience", CLIENT_ID, "--oidc-allow-http", "--oidc-client-id", CLIENT_ID]
    env = {"SWITCHBOARD_OIDC_CLIENT_SECRET": CLIENT_SECRET}
    a = ReplicaProcess(replica_id="js-login-a", redis_url=redis_server.url, args=args, env=env, public_url=PUBLIC)
    b = ReplicaProcess(replica_id="js-login-b", redis_url=redis_server.url, args=args, env=env, public_url=PUBLIC)
    try:
        a.start()
        b.start()
        # the page opened on A (login_url names the public URL), the provider's redirect reaching B
        opened: list[str] = []

        def route(url: str) -> str:
            opened.append(url)
            return url.replace(PUBLIC, b.url if len(opened) > 1 else a.url)

        token = await _node_login(a.url, route)
        assert any(u.startswith(f"{PUBLIC}/public/apps/hypha-login/callback") for u in opened)  # reached B
        await _calls_a_protected_service_of_alices_workspace(b.url, token)
    finally:
        a.kill()
        b.kill()


async def test_login_in_chromium_started_on_one_replica_finishes_on_the_other(
    issuer: str, hub_port: int, redis_server: Any, chromium: Any, static_server: Any
) -> None:
    """The page's client starts and checks the login on replica A; the login page and the provider's
    redirect are served by replica B, the public URL (as a load balancer may send them anywhere)."""
    args = ["--oidc-issuer", issuer, "--oidc-audience", CLIENT_ID, "--oidc-allow-http", "--oidc-client-id", CLIENT_ID]
    env = {"SWITCHBOARD_OIDC_CLIENT_SECRET": CLIENT_SECRET}
    public = f"http://127.0.0.1:{hub_port}"  # B's address: one of the provider's registered redirects
    a = ReplicaProcess(replica_id="js-page-a", redis_url=redis_server.url, args=args, env=env, public_url=public)
    b = ReplicaProcess(
        replica_id="js-page-b", redis_url=redis_server.url, args=args, env=env, public_url=public, port=hub_port
    )
    try:
        a.start()
        b.start()
        token = await _chromium_login(chromium, static_server, a.url, page_at=public)  # B serves the page
        await _calls_a_protected_service_of_alices_workspace(b.url, token)
    finally:
        a.kill()
        b.kill()

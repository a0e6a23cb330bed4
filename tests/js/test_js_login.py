"""The JavaScript client's ``login()`` against ``public/hypha-login`` (issue 39), unmodified: in headless
Chromium, where a person signs in by filling the provider's login form in another tab, and in Node, where the
person's browser is played over HTTP; the token then calls a protected service of the user's workspace."""

from __future__ import annotations

import asyncio
import json
import os
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypha_rpc import connect_to_server

from support.node_oidc import CLIENT_ID, CLIENT_SECRET, MODULES, node_provider, sign_in
from switchboard.config import Settings
from switchboard.testing.hub import RunningServer, settings_for_tests
from switchboard.testing.ports import free_port
from switchboard.testing.wait import eventually

pytestmark = [pytest.mark.timeout(90)]

ALICE = "alice-js"


@pytest.fixture(scope="module")
def hub_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def issuer(hub_port: int, js_tools: None) -> Iterator[str]:
    with node_provider([f"http://127.0.0.1:{hub_port}/public/apps/hypha-login/callback"]) as url:
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


async def _calls_a_protected_service_of_alices_workspace(server: RunningServer, token: str) -> None:
    owner = await connect_to_server({"server_url": server.url, "token": token, "client_id": "lab"})
    try:
        assert owner.config["workspace"] == f"ws-user-{ALICE}"
        await owner.register_service({"id": "notes", "config": {"visibility": "protected"}, "read": lambda: "mine"})
        other = await connect_to_server({"server_url": server.url, "token": token, "client_id": "desk"})
        try:
            assert await (await other.get_service(f"ws-user-{ALICE}/lab:notes")).read() == "mine"
        finally:
            await other.disconnect()
    finally:
        await owner.disconnect()


async def test_login_in_chromium_with_the_providers_form_filled_in_another_tab(
    server: RunningServer, chromium: Any, static_server: Any
) -> None:
    config = {"server_url": server.url}
    async with chromium.tabs(2) as (app, person):
        await app.goto(f"{static_server.url}/login.html#{urllib.parse.quote(json.dumps(config))}")

        async def reported(kind: str) -> Any:
            state = await app.evaluate("window.login")
            if state and state.get("error"):
                raise AssertionError(state["error"])
            return state.get(kind) if state else None

        login_url = await eventually(lambda: reported("url"), what="login() giving the login_url", timeout=20)
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
        token = await eventually(lambda: reported("token"), what="login() returning the token", timeout=20)
    await _calls_a_protected_service_of_alices_workspace(server, token)


async def test_login_in_node(server: RunningServer, js_tools: None) -> None:
    proc = await asyncio.create_subprocess_exec(
        "node",
        str(Path(__file__).parent / "node_login.mjs"),
        json.dumps({"server_url": server.url}),
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
                page = await sign_in(line[4:], ALICE)
                assert page.status_code == 200, page.text
            if not raw or line.startswith(("TOKEN ", "ERROR ")):
                break
        assert lines[-1].startswith("TOKEN "), "\n".join(lines)
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
    await _calls_a_protected_service_of_alices_workspace(server, lines[-1][6:])

"""``public/hypha-login`` (issue 39 items 1-3): unmodified ``hypha_rpc.login()`` signs a person in at the
operator's OpenID Connect provider (a real one: npm oidc-provider on loopback), and what a login key grants
is that flow's token, once; the forgeries an outsider tries are refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import httpx
import jwt
import pytest
from hypha_rpc import connect_to_server, login

from support.node_oidc import CLIENT_ID, CLIENT_SECRET, node_provider, sign_in
from switchboard.testing.hub import RunningServer, running, settings_for_tests
from switchboard.testing.ports import free_port

pytestmark = [pytest.mark.timeout(60)]

ALICE = "alice-1"


@pytest.fixture(scope="module")
def hub_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def issuer(hub_port: int) -> Iterator[str]:
    with node_provider([f"http://127.0.0.1:{hub_port}/public/apps/hypha-login/callback"]) as url:
        yield url


@pytest.fixture
async def hub(issuer: str, hub_port: int, tmp_path: Any) -> AsyncIterator[RunningServer]:
    secret = tmp_path / "client-secret"
    secret.write_text(CLIENT_SECRET + "\n")
    settings = settings_for_tests(
        port=hub_port,
        oidc_issuer=issuer,
        oidc_allow_http=True,
        oidc_audience="switchboard-api",  # the provider's access tokens' audience: the sign-in checks the client id
        oidc_client_id=CLIENT_ID,
        oidc_client_secret_file=str(secret),
    )
    async with running(settings) as srv:
        yield srv


async def _login(hub: RunningServer, who: str = ALICE, **config: Any) -> Any:
    """``hypha_rpc.login()`` as a user types it; the person opens ``login_url`` and signs in as ``who``."""
    pages: list[httpx.Response] = []

    async def open_browser(context: dict[str, Any]) -> None:
        async def person() -> None:
            pages.append(await sign_in(context["login_url"], who))

        asyncio.get_running_loop().create_task(person())

    result = await login({"server_url": hub.url, "login_callback": open_browser, "login_timeout": 20, **config})
    assert pages, "the person never got an answer"
    assert pages[0].status_code == 200, pages[0].text
    return result


async def test_hypha_rpc_login_returns_a_hub_token_that_opens_the_users_workspace(hub: RunningServer) -> None:
    token = await _login(hub)
    assert jwt.get_unverified_header(token)["alg"] == "HS256"  # the hub's own: nothing from the provider is needed
    api = await connect_to_server({"server_url": hub.url, "token": token})
    try:
        assert api.config["workspace"] == f"ws-user-{ALICE}"
        await api.register_service({"id": "notes", "config": {"visibility": "protected"}, "read": lambda: "mine"})
        again = await connect_to_server({"server_url": hub.url, "token": token, "client_id": "second"})
        try:
            assert await (await again.get_service(f"{api.config['workspace']}/notes")).read() == "mine"
        finally:
            await again.disconnect()
    finally:
        await api.disconnect()


async def test_login_with_profile_and_workspace_over_http_gives_a_scoped_token_and_the_profile(
    hub: RunningServer,
) -> None:
    mine = f"ws-user-{ALICE}"
    profile = await _login(hub, profile=True, workspace=mine, expires_in=600, transport="http")
    assert profile["user_id"] == ALICE
    assert profile["email"] == f"{ALICE}@example.org"
    assert profile["workspace"] == mine
    assert profile["expires_in"] == 600
    claims = jwt.decode(profile["token"], options={"verify_signature": False})
    assert mine in claims["scope"]
    assert 590 <= claims["exp"] - claims["iat"] <= 600


async def test_a_workspace_the_user_may_not_read_is_refused_to_the_login(hub: RunningServer) -> None:
    with pytest.raises(Exception, match="Invalid permission for the workspace ws-user-bob"):
        await _login_refused(hub, workspace="ws-user-bob")


async def _login_refused(hub: RunningServer, **start: Any) -> None:
    api = await connect_to_server({"server_url": hub.url})
    try:
        svc = await api.get_service("public/hypha-login")
        ctx = await svc.start(**start)
        page = await sign_in(ctx["login_url"], ALICE)
        assert page.status_code == 403
        await svc.check(ctx["key"], timeout=5)
    finally:
        await api.disconnect()


async def test_a_key_is_used_once_and_answers_only_its_own_flow(hub: RunningServer) -> None:
    api = await connect_to_server({"server_url": hub.url})
    try:
        svc = await api.get_service("public/hypha-login")
        mine, other = await svc.start(), await svc.start()
        assert await svc.check(other["key"], timeout=0) is None
        async with httpx.AsyncClient(timeout=10) as browser:
            page = await sign_in(mine["login_url"], ALICE, http=browser)
            assert page.status_code == 200
            # the provider's redirect replayed (the same state and code) finishes nothing again
            assert "/public/apps/hypha-login/callback" in str(page.url)
            replay = await browser.get(str(page.url))
            assert replay.status_code == 400
            assert "unknown or was finished already" in replay.text
        assert await svc.check(other["key"], timeout=0) is None  # the other key got nothing
        assert await svc.check(mine["key"], timeout=5)
        with pytest.raises(Exception, match="Invalid key"):  # a replayed key
            await svc.check(mine["key"], timeout=0)
        async with httpx.AsyncClient(timeout=10) as http:  # a used key starts no flow
            used = await http.get(mine["login_url"])
            assert used.status_code == 400
            assert "expired or was used" in used.text
    finally:
        await api.disconnect()


async def test_a_state_of_no_flow_and_a_code_for_another_client_are_refused(hub: RunningServer) -> None:
    api = await connect_to_server({"server_url": hub.url})
    try:
        svc = await api.get_service("public/hypha-login")
        ctx = await svc.start()
        async with httpx.AsyncClient(timeout=10) as http:
            made_up = await http.get(f"{hub.url}/public/apps/hypha-login/callback", params={"code": "x", "state": "y"})
            assert made_up.status_code == 400
            # a flow of the hub, sent on with a code the provider made for another application
            to_provider = await http.get(ctx["login_url"])
            assert to_provider.status_code == 303
            other_app = to_provider.headers["location"].replace(f"client_id={CLIENT_ID}", "client_id=another-app")
            page = await sign_in(other_app, ALICE)
            assert page.status_code in (400, 403), page.text
            assert "refused the code" in page.text or "unknown or was finished" in page.text
        assert await svc.check(ctx["key"], timeout=0) is None
    finally:
        await api.disconnect()


async def test_report_accepts_only_a_token_the_hub_verifies(hub: RunningServer) -> None:
    api = await connect_to_server({"server_url": hub.url})
    try:
        svc = await api.get_service("public/hypha-login")
        ctx = await svc.start()
        forged = jwt.encode({"sub": ALICE, "iss": "https://evil.example", "exp": 2**31}, "k" * 32, algorithm="HS256")
        with pytest.raises(Exception, match="Invalid token provided to report_login"):
            await svc.report(ctx["key"], forged)
        assert await svc.check(ctx["key"], timeout=0) is None
        mine = await api.generate_token({"expires_in": 300})
        await svc.report(ctx["key"], mine)
        assert await svc.check(ctx["key"], timeout=0) == mine
        # scoped to a workspace, the token made from a reported one expires no later than it, whatever is asked
        ctx = await svc.start()
        await svc.report(ctx["key"], mine, workspace=api.config["workspace"], expires_in=3600)
        scoped = jwt.decode(await svc.check(ctx["key"], timeout=0), options={"verify_signature": False})
        assert scoped["exp"] <= jwt.decode(mine, options={"verify_signature": False})["exp"]

    finally:
        await api.disconnect()


async def test_a_login_asks_for_a_bounded_lifetime(hub: RunningServer) -> None:
    api = await connect_to_server({"server_url": hub.url})
    try:
        svc = await api.get_service("public/hypha-login")
        with pytest.raises(Exception, match="expires_in must be a number of seconds from 0 to 604800"):
            await svc.start(workspace=f"ws-user-{ALICE}", expires_in=365 * 24 * 3600)
    finally:
        await api.disconnect()


async def test_without_a_provider_the_login_page_and_a_check_say_what_to_set() -> None:
    async with running(settings_for_tests()) as srv:
        api = await connect_to_server({"server_url": srv.url})
        try:
            svc = await api.get_service("public/hypha-login")
            ctx = await svc.start()  # a token may still be reported for the key (Hypha's own tests do)
            async with httpx.AsyncClient(timeout=10) as http:
                page = await http.get(ctx["login_url"].replace("http://127.0.0.1:0", srv.url))
            assert "--oidc-client-id" in page.text
            with pytest.raises(Exception, match="Login timeout.*--oidc-client-id"):
                await svc.check(ctx["key"], timeout=0.1)
        finally:
            await api.disconnect()


async def test_a_code_sent_back_with_the_state_of_another_flow_is_refused(hub: RunningServer) -> None:
    api = await connect_to_server({"server_url": hub.url})
    try:
        svc = await api.get_service("public/hypha-login")
        mine, theirs = await svc.start(), await svc.start()
        async with httpx.AsyncClient(timeout=10) as http:
            to_provider = await http.get(theirs["login_url"])  # another flow's state, taken from its redirect
            their_state = parse_qs(urlsplit(to_provider.headers["location"]).query)["state"][0]

        def swap_state(url: str) -> str:
            parts = urlsplit(url)
            if not parts.path.endswith("/callback"):
                return url
            query = {k: v[0] for k, v in parse_qs(parts.query).items()} | {"state": their_state}
            return urlunsplit(parts._replace(query=urlencode(query)))

        page = await sign_in(mine["login_url"], ALICE, route=swap_state)
        assert page.status_code == 403  # PKCE: the code is not that flow's
        assert "refused the code" in page.text
        for ctx in (mine, theirs):
            assert await svc.check(ctx["key"], timeout=0) is None
    finally:
        await api.disconnect()


async def test_a_token_made_from_a_reported_one_is_revoked_with_it(hub: RunningServer) -> None:
    """A reported token scoped to a workspace is derived from the reported credential: revoking that
    credential revokes it too, so ``report`` launders no leaked token into a fresh one."""
    api = await connect_to_server({"server_url": hub.url})
    try:
        svc = await api.get_service("public/hypha-login")
        leaked = await api.generate_token({"expires_in": 300})
        ctx = await svc.start()
        await svc.report(ctx["key"], leaked, workspace=api.config["workspace"])
        laundered = await svc.check(ctx["key"], timeout=0)
        await api.revoke_token(leaked)
        async with httpx.AsyncClient(base_url=hub.url, timeout=5) as http:
            answer = await http.get(
                f"/{api.config['workspace']}/services", headers={"Authorization": f"Bearer {laundered}"}
            )
        assert answer.status_code == 401, f"a token made from a revoked one still works: {answer.text}"
    finally:
        await api.disconnect()

"""A sign-in started on replica A finishes on replica B (issue 39): unmodified ``hypha_rpc.login()`` on A, the
provider's redirect to the hub's public URL reaching B, the token good on either; the client secret from
``SWITCHBOARD_OIDC_CLIENT_SECRET``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypha_rpc import connect_to_server, login

from support.node_oidc import CLIENT_ID, CLIENT_SECRET, node_provider, sign_in
from switchboard.testing import ValkeyServer
from switchboard.testing.replica import ReplicaProcess

PUBLIC = "http://switchboard.test"  # the replicas' shared public URL (a load balancer's)
ALICE = "alice-1"


@pytest.fixture
def pair(redis_server: ValkeyServer) -> Iterator[tuple[ReplicaProcess, ReplicaProcess]]:
    with node_provider([f"{PUBLIC}/public/apps/hypha-login/callback"]) as issuer:
        args = ["--oidc-issuer", issuer, "--oidc-audience", CLIENT_ID, "--oidc-allow-http"]
        args += ["--oidc-client-id", CLIENT_ID]
        env = {"SWITCHBOARD_OIDC_CLIENT_SECRET": CLIENT_SECRET}
        started: list[ReplicaProcess] = []
        try:
            for name in ("login-a", "login-b"):
                replica = ReplicaProcess(replica_id=name, redis_url=redis_server.url, args=args, env=env)
                started.append(replica)
                replica.start()
            yield started[0], started[1]
        finally:
            for replica in started:
                replica.kill()


async def test_a_login_started_on_one_replica_finishes_on_the_other(pair: Any) -> None:
    a, b = pair
    answers: list[httpx.Response] = []

    def at(replica: ReplicaProcess):  # noqa: ANN202
        return lambda url: url.replace(PUBLIC, replica.url)

    async def open_browser(context: dict[str, Any]) -> None:
        async def person() -> None:  # opens the page on A; the provider's redirect lands on B
            async with httpx.AsyncClient(timeout=10) as http:
                page = await http.get(at(a)(context["login_url"]))
                answers.append(await sign_in(page.headers["location"], ALICE, http=http, route=at(b)))

        asyncio.get_running_loop().create_task(person())

    token = await login({"server_url": a.url, "login_callback": open_browser, "login_timeout": 20})
    assert answers[0].status_code == 200, answers[0].text
    assert answers[0].url.port == b.port
    on_a = await connect_to_server({"server_url": a.url, "token": token, "client_id": "lab"})
    try:
        await on_a.register_service({"id": "notes", "config": {"visibility": "protected"}, "read": lambda: "mine"})
        on_b = await connect_to_server({"server_url": b.url, "token": token, "client_id": "desk"})
        try:
            assert on_b.config["workspace"] == f"ws-user-{ALICE}"
            assert await (await on_b.get_service(f"ws-user-{ALICE}/lab:notes")).read() == "mine"
        finally:
            await on_b.disconnect()
    finally:
        await on_a.disconnect()

"""``GET /api/status``: the web console's data, under the same authorization as everything else."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from switchboard.testing.wait import eventually

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def http(server) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        yield client


@pytest.fixture
async def provider(connect):
    client = await connect(client_id="prov")
    await client.register_service(
        {
            "id": "pub",
            "name": "Public",
            "config": {"visibility": "public"},
            "add": lambda a, b: a + b,
            "nested": {"mul": lambda a, b: a * b},
        }
    )
    await client.register_service({"id": "prot", "config": {"visibility": "protected"}, "peek": lambda: 1})
    await client.register_service({"id": "hidden", "config": {"visibility": "unlisted"}, "f": lambda: 1})
    return client


def _workspace(body: dict, ws: str) -> dict | None:
    return next((w for w in body["workspaces"] if w["id"] == ws), None)


async def test_anonymous_sees_public_services_and_no_clients(http, provider):
    body = (await http.get("/api/status")).json()
    assert body["viewer"]["anonymous"] is True
    ws = _workspace(body, provider.config["workspace"])
    assert ws is not None
    assert ws["readable"] is False
    assert ws["clients"] is None, "list_clients needs read"
    assert [s["service"] for s in ws["services"]] == ["pub"], "not protected, unlisted or built-in"
    pub = ws["services"][0]
    assert pub["id"] == f"{provider.config['workspace']}/prov:pub"
    assert sorted(pub["functions"]) == ["add", "nested.mul"]
    assert pub["name"] == "Public"
    assert body["server"]["manager_id"] == "manager-switchboard"
    assert [r["self"] for r in body["replicas"]] == [True]


@pytest.mark.parametrize("permission", ["read", "read_write", "admin"])
async def test_a_token_for_the_workspace_shows_its_clients_and_protected_services(http, provider, connect, permission):
    token = await provider.generate_token({"permission": permission})
    watcher = await connect(client_id="watcher", token=token, workspace=provider.config["workspace"])
    body = (await http.get("/api/status", headers={"Authorization": f"Bearer {token}"})).json()
    assert body["viewer"]["anonymous"] is False
    assert provider.config["workspace"] in body["viewer"]["workspaces"]
    ws = _workspace(body, provider.config["workspace"])
    assert ws["readable"] is True
    ws_id = provider.config["workspace"]
    clients = {c["id"] for c in ws["clients"]}
    assert {f"{ws_id}/prov", f"{ws_id}/{watcher.config['client_id']}"} <= clients
    assert {s["service"] for s in ws["services"]} >= {"pub", "prot"}


async def test_another_workspace_stays_public_only(http, provider, connect):
    stranger = await connect(client_id="stranger")
    token = await stranger.generate_token()
    body = (await http.get("/api/status", headers={"Authorization": f"Bearer {token}"})).json()
    ws = _workspace(body, provider.config["workspace"])
    assert ws["readable"] is False
    assert ws["clients"] is None
    assert [s["service"] for s in ws["services"]] == ["pub"]
    assert _workspace(body, stranger.config["workspace"])["readable"] is True


async def test_a_bad_token_is_refused(http):
    response = await http.get("/api/status", headers={"Authorization": "Bearer not-a-jwt"})
    assert response.status_code == 401
    assert response.json()["success"] is False


async def test_rates_count_messages_and_calls(http, server, provider, connect):
    server.app.state.status_sampler.interval = 0.1  # sample fast for the test
    caller = await connect(client_id="caller")
    pub = await caller.get_service(f"{provider.config['workspace']}/prov:pub")
    for i in range(20):
        assert await pub.add(i, 1) == i + 1

    async def counted() -> bool:
        history = (await http.get("/api/status")).json()["rates"]["history"]
        return any(s["messages_per_second"] > 0 for s in history)

    await eventually(counted, timeout=5, what="messages/s above 0 in the history")
    row = (await http.get("/api/status")).json()["replicas"][0]
    assert row["clients"] == 2
    assert set(row["rates"]) == {"messages_per_second", "errors_per_second", "calls_in_flight"}


async def test_the_console_page_is_served_with_a_strict_policy(http):
    page = await http.get("/console")
    assert page.status_code == 200
    assert "Switchboard console" in page.text
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy
    assert "script-src 'self'" in policy
    for name, kind in (("console.js", "text/javascript"), ("console.css", "text/css")):
        asset = await http.get(f"/console/{name}")
        assert asset.status_code == 200
        assert asset.headers["content-type"].startswith(kind)
    assert (await http.get("/console/../config.py")).status_code == 404
    assert (await http.get("/console/nope.js")).status_code == 404
    root = await http.get("/", follow_redirects=False)
    assert root.status_code == 307
    assert root.headers["location"] == "/console"

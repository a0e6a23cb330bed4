"""Who may learn which clients a workspace has: every listing answers alike.

A client's ``built-in`` service (hypha-rpc registers it ``public``) names the
client and nothing else: it is its presence. ``list_clients`` and the status
API show presence only to viewers with ``read`` on the workspace; so do
``GET /{ws}/services`` and ``list_services``. A viewer without read sees the
workspace's public services, and of its clients only the ids those services'
own ids contain.
"""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.timeout(60)


def _client_ids(service_ids: list[str]) -> set[str]:
    return {sid.partition("/")[2].partition(":")[0] for sid in service_ids}


async def _views(url: str, ws: str, token: str | None) -> tuple[list[str], dict]:
    """``GET /{ws}/services`` (ids) and the status API's card of ``ws`` for one viewer."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(base_url=url, timeout=10, headers=headers) as http:
        listing = await http.get(f"/{ws}/services")
        status = await http.get("/api/status")
    assert listing.status_code == 200, listing.text
    assert status.status_code == 200, status.text
    card = next((w for w in status.json()["workspaces"] if w["id"] == ws), {"clients": None, "services": []})
    return sorted(s["id"] for s in listing.json()), card


@pytest.fixture
async def workspace(connect):
    """W: "prov" with a public and a protected service, and "quiet", a client with no service of its own."""
    prov = await connect(client_id="prov")
    await prov.register_service({"id": "pub", "config": {"visibility": "public"}, "f": lambda: 1})
    await prov.register_service({"id": "prot", "config": {"visibility": "protected"}, "f": lambda: 2})
    token = await prov.generate_token({"permission": "read"})
    await connect(client_id="quiet", token=token)
    return prov


async def test_a_viewer_without_read_learns_no_client_beyond_the_public_service_ids(server, connect, workspace):
    ws = workspace.config["workspace"]
    other = await connect(client_id="other")
    other_admin = await other.generate_token()  # admin, but of its own workspace only
    for viewer, token in (("anonymous", None), ("other", other_admin)):
        listed, card = await _views(server.url, ws, token)
        assert listed == [f"{ws}/prov:pub"], f"{viewer}: public services only, no client's built-in service"
        assert card["clients"] is None, viewer
        assert [s["id"] for s in card["services"]] == listed, f"{viewer}: the status API shows the same"
        assert "quiet" not in _client_ids(listed), f"{viewer} learned of a client with no public service"
    # the same over RPC: list_services({"workspace": W}) from another workspace
    assert sorted(s["id"] for s in await other.list_services({"workspace": ws})) == [f"{ws}/prov:pub"]


async def test_a_member_with_read_sees_every_client_in_both(server, workspace):
    ws = workspace.config["workspace"]
    read = await workspace.generate_token({"permission": "read"})
    listed, card = await _views(server.url, ws, read)
    assert listed == sorted([f"{ws}/prov:pub", f"{ws}/prov:prot", f"{ws}/prov:built-in", f"{ws}/quiet:built-in"])
    assert sorted(c["id"].partition("/")[2] for c in card["clients"]) == ["prov", "quiet"]
    assert _client_ids(listed) == {"prov", "quiet"}, "the listing's clients are the status API's"
    assert sorted(s["id"] for s in card["services"]) == sorted([f"{ws}/prov:pub", f"{ws}/prov:prot"])

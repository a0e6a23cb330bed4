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
from hypha_rpc.rpc import RemoteException

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


# Every mode a lookup takes: the presence rule holds whichever chooses among the matches
MODES = (None, "random", "first", "last", "min_load", "native:random", "select:max:load", "select:first_success:ping")


async def _answer(lookup, service_id: str, config: dict) -> str:
    """What a lookup answers: the error's text, or ``found <id>``."""
    try:
        found = await lookup(service_id, config)
    except RemoteException as exc:
        return str(exc)
    return f"found {found['id']}"


async def test_no_lookup_shows_a_client_to_a_viewer_who_may_not_list_clients(server, connect, workspace):
    """The attack: ``get_service_info("W/*:built-in", {"mode": "last"})`` (or ``GET /W/services/*:built-in``)
    answered a client's built-in service, whose ``created_by`` carries its user's id, email and grants.
    To a viewer without read on W a client's built-in service is not there, by any id, mode or door:
    the answer is the one for a client that does not exist."""
    ws = workspace.config["workspace"]
    other = await connect(client_id="other")
    other_admin = await other.generate_token()  # admin, but of its own workspace only
    anonymous = await connect()
    for viewer in (anonymous, other):
        for name in ("*:built-in", "quiet:built-in", "prov:built-in", "*:*"):
            for mode in MODES if name.startswith("*") else (None,):
                config = {"mode": mode} if mode else {}
                for lookup in (viewer.get_service_info, viewer.get_service):
                    answer = await _answer(lookup, f"{ws}/{name}", config)
                    if name == "*:*" and answer == f"found {ws}/prov:pub":
                        continue  # the public service: anyone may find that one
                    assert "service not found" in answer.lower(), (name, mode, answer[:300])
                    assert "built-in" not in answer.replace(f"{ws}/{name}", ""), (name, mode)
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        for token in (None, other_admin):
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            for path in (
                "quiet:built-in",
                "quiet:built-in/ping",
                "*:built-in?_mode=random",
                "*:built-in?_mode=last",
                "*:built-in?_mode=select:max:load&_select_timeout=1",
                "*:built-in/ping?_mode=first",
            ):
                answer = await http.get(f"/{ws}/services/{path}", headers=headers)
                assert answer.status_code == 404, (path, answer.status_code, answer.text)
                assert "created_by" not in answer.text, path
                assert "prov" not in answer.text, path
                if path.startswith("quiet"):  # answered as for a client that is not there
                    ghost = await http.get(f"/{ws}/services/{path.replace('quiet', 'ghost')}", headers=headers)
                    assert (ghost.status_code, ghost.text.replace("ghost", "quiet")) == (404, answer.text)


async def test_a_member_with_read_finds_a_client_by_lookup(connect, workspace):
    ws = workspace.config["workspace"]
    reader = await connect(token=await workspace.generate_token({"permission": "read"}))
    info = await reader.get_service_info(f"{ws}/quiet:built-in")
    assert info["id"] == f"{ws}/quiet:built-in"
    assert info["config"]["created_by"]["id"], "a member sees who the client is"
    last = await reader.get_service_info(f"{ws}/*:built-in", {"mode": "last"})
    assert last["id"].endswith(":built-in")


async def test_authorized_workspaces_shown_only_within_the_services_workspace(server, connect, workspace):
    """Hypha's rule: a workspace that the list admits may use the service, but not read who else may."""
    ws = workspace.config["workspace"]
    other = await connect(client_id="other")
    other_ws = other.config["workspace"]
    shared = {"visibility": "protected", "authorized_workspaces": [other_ws, "ws-secret-partner"]}
    await workspace.register_service({"id": "shared", "config": shared, "f": lambda: 3})
    sid = f"{ws}/prov:shared"
    info = await other.get_service_info(sid)
    assert "authorized_workspaces" not in info["config"], info["config"]
    service = await other.get_service(sid)
    assert await service.f() == 3
    assert "authorized_workspaces" not in dict(service["config"]), dict(service["config"])
    listed = {s["id"]: s for s in await other.list_services({"workspace": ws})}
    assert "authorized_workspaces" not in listed[sid]["config"]
    other_token = await other.generate_token()
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        headers = {"Authorization": f"Bearer {other_token}"}
        one = await http.get(f"/{ws}/services/prov:shared", headers=headers)
        assert one.status_code == 200, one.text
        assert "authorized_workspaces" not in one.json()["config"]
        everything = await http.get(f"/{ws}/services", headers=headers)
        assert "ws-secret-partner" not in everything.text
    # the service's own workspace still reads the whole list
    own = await workspace.get_service_info(sid)
    assert own["config"]["authorized_workspaces"] == [other_ws, "ws-secret-partner"]
    assert [s for s in await workspace.list_services() if s["id"] == sid][0]["config"]["authorized_workspaces"]

"""The manager refuses where Hypha refuses, and allows what Hypha allows (issue 37, item 16).

``list_services(..., include_unlisted=True)`` of another workspace, or of every
workspace, is refused with Hypha's words instead of being filtered silently, so
a client learns that it asked for something it may not have. ``subscribe`` to
``<own workspace>/<event>`` (or to the workspace's own name) is allowed, as
Hypha allows it; another workspace's prefix stays refused. The callers are
real hypha-rpc clients: an anonymous outsider in a workspace of its own, and a
member of the victim's workspace.
"""

from __future__ import annotations

import re

import httpx
import pytest
from hypha_rpc.rpc import RemoteException

pytestmark = pytest.mark.timeout(60)

ALL_WORKSPACES = "Cannot include unlisted services when searching all workspaces."


def from_another(workspace: str, own: str) -> str:
    return (
        f"Cannot include unlisted services from workspace {workspace}. "
        f"Only services from your current workspace ({own}) can include unlisted services."
    )


async def _victim(connect):
    """A workspace serving an unlisted and a public service, and a read token for it."""
    owner = await connect(client_id="owner")
    await owner.register_service({"id": "hidden", "config": {"visibility": "unlisted"}, "f": lambda: 1})
    await owner.register_service({"id": "shown", "config": {"visibility": "public"}, "f": lambda: 2})
    return owner, owner.config["workspace"], await owner.generate_token({"permission": "read"})


def ids(listing: list) -> set[str]:
    return {s["id"].rpartition(":")[2] for s in listing}


QUERIES = ["{W}", {"workspace": "{W}"}, "{W}/*:*", "*", {"workspace": "*"}, "*/*:hidden"]


async def test_listing_unlisted_services_of_another_or_every_workspace_is_refused(connect) -> None:
    _, ws, _ = await _victim(connect)
    outsider = await connect(client_id="outsider")
    own = outsider.config["workspace"]
    for query in QUERIES:
        asked = {k: v.format(W=ws) for k, v in query.items()} if isinstance(query, dict) else query.format(W=ws)
        everywhere = (asked.get("workspace") if isinstance(asked, dict) else asked.partition("/")[0]) == "*"
        message = ALL_WORKSPACES if everywhere else from_another(ws, own)
        with pytest.raises(RemoteException, match=re.escape(message)):
            await outsider.list_services(asked, include_unlisted=True)
        assert "hidden" not in ids(await outsider.list_services(asked)), query  # without the flag: what it may see


async def test_a_member_connected_into_the_workspace_lists_its_unlisted_services(connect) -> None:
    _, ws, read_token = await _victim(connect)
    inside = await connect(client_id="inside", token=read_token, workspace=ws)
    assert {"hidden", "shown"} <= ids(await inside.list_services({"workspace": ws}, include_unlisted=True))


async def test_own_and_public_workspaces_may_ask_for_unlisted_services(connect) -> None:
    outsider = await connect(client_id="outsider")
    await outsider.register_service({"id": "mine", "config": {"visibility": "unlisted"}, "f": lambda: 1})
    own = outsider.config["workspace"]
    assert "mine" in ids(await outsider.list_services({"workspace": own}, include_unlisted=True))
    assert "mine" in ids(await outsider.list_services(None, include_unlisted=True))
    await outsider.list_services({"workspace": "public"}, include_unlisted=True)  # as Hypha: no refusal


async def test_the_plain_http_door_refuses_the_same_listing(connect, server) -> None:
    _, ws, _ = await _victim(connect)
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        refused = await http.get(
            f"/{ws}/services/~/list_services", params={"query": f'{{"workspace": "{ws}"}}', "include_unlisted": "true"}
        )
    assert refused.status_code == 403, refused.text
    assert "Cannot include unlisted services from workspace" in refused.json()["detail"]


async def test_subscribing_to_events_under_ones_own_workspace_prefix_is_allowed(connect) -> None:
    client = await connect(client_id="listener")
    own = client.config["workspace"]
    assert await client.subscribe([f"{own}/news", own, "plain-news", "service_added"]) is True


async def test_subscribing_to_another_workspaces_events_stays_refused(connect) -> None:
    _, ws, _ = await _victim(connect)
    client = await connect(client_id="listener")
    for name in (f"{ws}/news", ws, "ws-user-someone-else/news", f"{ws}:news"):
        with pytest.raises(RemoteException, match=f"Subscription to event .{re.escape(name)}. is forbidden"):
            await client.subscribe([name])


@pytest.mark.parametrize("visibility", ["protected", "unlisted"])
async def test_listing_every_workspace_for_protected_or_unlisted_services_is_refused(connect, visibility) -> None:
    """As Hypha: a search of every workspace gives public services only, so asking it for others is an error,
    not an answer that silently leaves them out (Hypha's test_workspace.py::test_unlisted_services)."""
    await _victim(connect)
    outsider = await connect(client_id="outsider")
    with pytest.raises(RemoteException, match="Cannot list protected or unlisted services in all workspaces."):
        await outsider.list_services({"workspace": "*", "visibility": visibility})
    assert "shown" in ids(await outsider.list_services({"workspace": "*", "visibility": "public"}))

"""The workspace manager's functions over plain HTTP (``/{workspace}/services/~/<function>``), as Hypha
serves them: each runs as the request's user (its bearer token, or anonymous with no grant), never as the
manager's root user, with the same permission checks a WebSocket client of that workspace meets."""

from __future__ import annotations

import json

import httpx
import pytest

pytestmark = pytest.mark.timeout(60)


async def _workspace(connect):
    """An owner in its workspace serving ``pub`` (public) and ``prot`` (protected), and tokens for it."""
    owner = await connect(client_id="owner")
    ws = owner.config["workspace"]
    await owner.register_service({"id": "pub", "config": {"visibility": "public"}, "f": lambda: 1})
    await owner.register_service({"id": "prot", "config": {"visibility": "protected"}, "f": lambda: 2})
    tokens = {p: await owner.generate_token({"permission": p}) for p in ("read", "read_write", "admin")}
    return owner, ws, tokens


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def names(listing: httpx.Response) -> set[str]:
    assert listing.status_code == 200, listing.text
    return {s["id"].rpartition(":")[2] for s in listing.json()}


async def test_list_services_shows_a_member_the_protected_services_and_an_outsider_only_public_ones(connect, server):
    _, ws, tokens = await _workspace(connect)
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        member = await http.get(f"/{ws}/services/~/list_services", headers=bearer(tokens["read"]))
        assert {"pub", "prot"} <= names(member)
        assert names(await http.get(f"/{ws}/services/~/list_services")) == {"pub"}  # anonymous
        other = await connect(client_id="other")
        outsider = bearer(await other.generate_token())  # admin of its own workspace, nothing in ws
        assert names(await http.get(f"/{ws}/services/~/list_services", headers=outsider)) == {"pub"}
        # as any listing: an explicit query, its own visibility rules
        query = json.dumps({"workspace": ws, "service_id": "p*"})
        assert names(await http.get(f"/{ws}/services/~/list_services", params={"query": query})) == {"pub"}
        member_query = await http.get(
            f"/{ws}/services/~/list_services", params={"query": query}, headers=bearer(tokens["read"])
        )
        assert names(member_query) == {"pub", "prot"}


async def test_generate_token_over_http_needs_admin(connect, server):
    _, ws, tokens = await _workspace(connect)
    config = json.dumps({"workspace": ws, "permission": "read"})
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        weak = await http.get(
            f"/{ws}/services/~/generate_token", params={"config": config}, headers=bearer(tokens["read"])
        )
        assert weak.status_code == 403
        assert weak.json()["detail"] == "PermissionError: Only admin can generate token."
        anonymous = await http.get(f"/{ws}/services/~/generate_token", params={"config": config})
        assert anonymous.status_code == 403
        # the anonymous HTTP caller is a user of its own, not one whose personal workspace every request shares
        shared = json.dumps({"workspace": "ws-user-anonymouz-http"})
        assert (await http.get(f"/{ws}/services/~/generate_token", params={"config": shared})).status_code == 403
        made = await http.post(
            f"/{ws}/services/~/generate_token", json={"config": {"permission": "read"}}, headers=bearer(tokens["admin"])
        )
        assert made.status_code == 200, made.text
        parsed = await http.get(
            f"/{ws}/services/~/parse_token", params={"token": made.json()}, headers=bearer(tokens["admin"])
        )
        assert parsed.status_code == 200, parsed.text
        assert parsed.json()["scope"]["current_workspace"] == ws


async def test_a_read_member_cannot_set_the_environment_over_http(connect, server):
    owner, ws, tokens = await _workspace(connect)
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        url = f"/{ws}/services/~/set_env"
        refused = await http.post(url, json={"key": "mode", "value": "fast"}, headers=bearer(tokens["read"]))
        assert refused.status_code == 403
        assert refused.json()["detail"] == f"PermissionError: Permission denied for workspace {ws}"
        # anonymous: refused, and written nowhere else either
        assert (await http.post(url, json={"key": "mode", "value": "fast"})).status_code == 403
        bookmark = {"item": {"bookmark_type": "service", "id": f"{ws}/owner:pub"}}
        assert (await http.post(f"/{ws}/services/~/bookmark", json=bookmark)).status_code == 400
        done = await http.post(url, json={"key": "mode", "value": "slow"}, headers=bearer(tokens["read_write"]))
        assert done.status_code == 200, done.text
    assert await owner.get_env("mode") == "slow"


async def test_unknown_and_connection_only_functions_are_refused_clearly(connect, server):
    _, ws, tokens = await _workspace(connect)
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        unknown = await http.get(f"/{ws}/services/~/no_such_function", headers=bearer(tokens["admin"]))
        assert unknown.status_code == 404
        assert unknown.json()["detail"] == "KeyError: no_such_function not found."
        for function in ("subscribe", "register_service"):
            refused = await http.get(f"/{ws}/services/~/{function}", headers=bearer(tokens["admin"]))
            assert refused.status_code == 400
            assert "acts on the caller's connection" in refused.json()["detail"]
        bad = await http.get(f"/{ws}/services/~/echo", params={"nonsense": "1"}, headers=bearer(tokens["admin"]))
        assert bad.status_code == 400
        echoed = await http.get(f"/{ws}/services/~/echo", params={"data": "hi"}, headers=bearer(tokens["read_write"]))
        assert echoed.json() == "hi"
        # the caller is the request's user: an outsider cannot read the workspace's clients
        assert (await http.get(f"/{ws}/services/~/list_clients", params={"workspace": ws})).status_code == 403

"""A generated token grants what it was minted with, and no more: its maker's hub admin role is not
passed on (a token's rights never grow through what is derived from it). The attacker is a guest who
was handed a read-only token by an operator holding the admin role."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from hypha_rpc import connect_to_server
from hypha_rpc.rpc import RemoteException

from switchboard.clock import SystemClock
from switchboard.hub.identity.auth import TokenIssuer
from switchboard.hub.identity.users import ROOT, Permission
from switchboard.testing.hub import TEST_SECRET, RunningServer, running, settings_for_tests

pytestmark = pytest.mark.timeout(60)

LAB = "lab_guests"  # an operator's name


@pytest.fixture
async def hub() -> AsyncIterator[RunningServer]:
    async with running(settings_for_tests()) as srv:
        yield srv


async def client(hub: RunningServer, client_id: str, token: str, workspace: str | None = None) -> Any:
    config = {"server_url": hub.url, "client_id": client_id, "token": token}
    return await connect_to_server(config | ({"workspace": workspace} if workspace else {}))


async def test_a_read_token_minted_by_a_hub_admin_grants_read_and_no_admin_role(hub: RunningServer) -> None:
    root_token = TokenIssuer(TEST_SECRET, SystemClock()).issue(
        ROOT, workspace=LAB, permission=Permission.ADMIN, expires_in=600
    )
    operator = await client(hub, "operator", root_token, LAB)
    victim = await client(
        hub,
        "victim",
        TokenIssuer(TEST_SECRET, SystemClock()).issue(
            ROOT, workspace="lab_private", permission=Permission.ADMIN, expires_in=600
        ),
        "lab_private",
    )
    guest_token = await operator.generate_token({"workspace": LAB, "permission": "read"})
    guest = await client(hub, "guest", guest_token, LAB)
    try:
        assert "admin" not in guest.config["user"]["roles"]
        with pytest.raises(RemoteException, match="Only admin can generate token"):
            await guest.generate_token({"workspace": LAB, "permission": "admin"})
        with pytest.raises(RemoteException, match="Permission denied"):
            await guest.list_clients("lab_private")
        async with httpx.AsyncClient(base_url=hub.url, timeout=5) as http:
            response = await http.get("/lab_private/services", headers={"Authorization": f"Bearer {guest_token}"})
        seen = response.json() if response.status_code == 200 else []
        assert not [s for s in seen if s["id"].startswith("lab_private/")], "the guest sees another workspace's clients"
    finally:
        for c in (guest, victim, operator):
            await c.disconnect()

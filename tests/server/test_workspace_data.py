"""A workspace's environment, event log and service types, and tokens with extra scopes and an
email, with an unmodified hypha-rpc client; each refused to a member with a weaker token."""

from __future__ import annotations

import datetime

import pytest
from hypha_rpc.rpc import RemoteException

from switchboard.clock import SystemClock
from switchboard.hub.identity.auth import TokenIssuer
from switchboard.hub.identity.users import ROOT, Permission, User
from switchboard.hub.manager import event_log
from switchboard.testing.hub import TEST_SECRET

pytestmark = pytest.mark.timeout(60)


async def member(connect, owner, permission: str, client_id: str):
    token = await owner.generate_token({"permission": permission})
    return await connect(client_id=client_id, token=token)


async def test_env_is_set_and_read_by_read_write_members_and_refused_to_readers(connect):
    owner = await connect(client_id="owner")
    await owner.set_env("API_URL", "https://example.invalid")
    await owner.set_env("LIMITS", {"n": 3})
    writer = await member(connect, owner, "read_write", "writer")
    assert await writer.get_env("API_URL") == "https://example.invalid"
    assert await writer.get_env() == {"API_URL": "https://example.invalid", "LIMITS": {"n": 3}}
    await writer.set_env("API_URL", None)  # removes it
    with pytest.raises(RemoteException, match="Environment variable 'API_URL' not found"):
        await writer.get_env("API_URL")
    reader = await member(connect, owner, "read", "reader")
    with pytest.raises(RemoteException, match="Permission denied"):
        await reader.set_env("LIMITS", "mine")
    with pytest.raises(RemoteException, match="Permission denied"):
        await reader.get_env()
    assert await owner.get_env("LIMITS") == {"n": 3}
    types = [e["event_type"] for e in await owner.get_events()]
    assert types == ["env_set", "env_set"]  # the owner's own changes, as Hypha logs them


async def test_the_event_log_records_filters_and_counts_the_callers_events(connect):
    owner = await connect(client_id="owner")
    before = datetime.datetime.now(datetime.UTC).replace(tzinfo=None).isoformat()
    await owner.log_event("deploy", {"version": 2})
    await owner.log_event("deploy", {"version": 3})
    await owner.log_event("alert", None)
    await owner.log("hello from the app")
    events = await owner.get_events()
    assert [(e["event_type"], e["data"]) for e in events] == [
        ("deploy", {"version": 2}),
        ("deploy", {"version": 3}),
        ("alert", None),
        ("log", "hello from the app"),
    ]
    assert {e["workspace"] for e in events} == {owner.config["workspace"]}
    assert {e["user_id"] for e in events} == {owner.config["user"]["id"]}
    assert [e["data"] for e in await owner.get_events("deploy")] == [{"version": 2}, {"version": 3}]
    assert await owner.get_events(None, "2999-01-01T00:00:00") == []
    assert len(await owner.get_events(None, before)) == 4
    stats = {s["event_type"]: s["count"] for s in await owner.get_event_stats()}
    assert stats == {"deploy": 2, "alert": 1, "log": 1}
    with pytest.raises(RemoteException, match="no spaces"):
        await owner.log_event("two words")
    reader = await member(connect, owner, "read", "reader")
    with pytest.raises(RemoteException, match="Permission denied"):
        await reader.log_event("forged", {"by": "reader"})
    with pytest.raises(RemoteException, match="Permission denied"):
        await reader.log("forged")
    assert await reader.get_events() == []  # a reader reads back its own events: none
    assert "forged" not in {e["event_type"] for e in await owner.get_events()}


async def test_the_event_log_is_bounded(connect, monkeypatch):
    monkeypatch.setattr(event_log, "MAX_LOG_ENTRIES", 5)
    owner = await connect(client_id="owner")
    for i in range(12):
        await owner.log_event("tick", i)
    assert [e["data"] for e in await owner.get_events("tick")] == [7, 8, 9, 10, 11]
    with pytest.raises(RemoteException, match="event data too large"):
        await owner.log_event("big", "x" * (event_log.MAX_EVENT_DATA_BYTES + 1))


async def test_service_types_are_registered_once_and_read_by_members(connect):
    owner = await connect(client_id="owner")
    ws = owner.config["workspace"]
    calc = {"id": "calculator", "name": "Calculator", "definition": {"add": {"type": "function"}}}
    assert (await owner.register_service_type(calc))["id"] == "calculator"
    with pytest.raises(RemoteException, match="Service type already exists"):
        await owner.register_service_type({**calc, "name": "Other"})
    assert (await owner.get_service_type("calculator"))["id"] == f"{ws}/calculator"
    reader = await member(connect, owner, "read", "reader")
    assert (await reader.get_service_type(f"{ws}/calculator"))["name"] == "Calculator"
    assert [t["name"] for t in await reader.list_service_types()] == ["Calculator"]
    with pytest.raises(RemoteException, match="Permission denied"):
        await reader.register_service_type({"id": "mine", "name": "Mine", "definition": {}})
    outsider = await connect(client_id="outsider")
    with pytest.raises(RemoteException, match="Permission denied"):
        await outsider.get_service_type(f"{ws}/calculator")
    with pytest.raises(RemoteException, match="Permission denied"):
        await outsider.list_service_types(ws)
    await owner.register_service_type(
        {"id": "open", "name": "Open", "definition": {}, "config": {"visibility": "public"}}
    )
    assert (await outsider.get_service_type(f"{ws}/open"))["name"] == "Open"
    assert set((await owner.get_workspace_info())["service_types"]) == {"calculator", "open"}


def admin_token() -> str:
    """A token of a user with the hub's admin role (an operator's)."""
    issuer = TokenIssuer(TEST_SECRET, SystemClock())
    return issuer.issue(ROOT, workspace="ops_team", permission=Permission.ADMIN, expires_in=3600)


async def test_generated_tokens_carry_extra_scopes_and_email_which_parse_token_shows(connect):
    operator = await connect(client_id="operator", token=admin_token(), workspace="ops_team")
    token = await operator.generate_token({"extra_scopes": ["read:data", "quota.gold"], "email": "a@example.org"})
    parsed = await operator.parse_token(token)
    assert parsed["scope"]["extra_scopes"] == ["read:data", "quota.gold"]
    assert parsed["email"] == "a@example.org"
    holder = await connect(client_id="holder", token=token, workspace="ops_team")
    assert holder.config["user"]["scope"]["extra_scopes"] == ["read:data", "quota.gold"]


async def test_a_holder_of_extra_scopes_passes_on_only_those(connect):
    user = User(id="carol", roles=("user",), extra_scopes=("read:data",))
    issuer = TokenIssuer(TEST_SECRET, SystemClock())
    token = issuer.issue(user, workspace="ws-user-carol", permission=Permission.ADMIN, expires_in=3600)
    carol = await connect(client_id="carol", token=token)
    child = await carol.generate_token({"extra_scopes": ["read:data"]})
    assert (await carol.parse_token(child))["scope"]["extra_scopes"] == ["read:data"]
    with pytest.raises(RemoteException, match="does not carry: write:data"):
        await carol.generate_token({"extra_scopes": ["read:data", "write:data"]})


async def test_a_token_never_carries_more_extra_scopes_or_another_email_than_its_maker_may_give(connect):
    owner = await connect(client_id="owner")  # admin of its own workspace, no extra scopes, no admin role
    with pytest.raises(RemoteException, match="your own token does not carry: billing:admin"):
        await owner.generate_token({"extra_scopes": ["billing:admin"]})
    with pytest.raises(RemoteException, match="Only callers with the 'admin' role may set"):
        await owner.generate_token({"email": "ceo@example.org"})
    for bad in ("ws:other#a", "cid:x", "wid:other", "two words", "a#b", "x" * 200):
        with pytest.raises(RemoteException, match="invalid extra scope"):
            await owner.generate_token({"extra_scopes": [bad]})

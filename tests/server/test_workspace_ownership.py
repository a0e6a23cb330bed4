"""Who may own a workspace record (issue 37, items 2, 6 and 10), played by an attacker with an
unmodified hypha-rpc client against an in-process hub:

- a name operator tokens grant is not free for the taking: the CLI hands out no name any user may
  create, and only a caller holding ``admin`` for a name outside that grammar creates its record;
- overwriting a record never drops its owners, nor makes a time-limited admin an owner;
- a record names as owners only those who accepted; quotas count the accountable principal (the root
  of a token chain), not each minted id.
"""

from __future__ import annotations

import uuid

import jwt
import pytest
from click.testing import CliRunner
from hypha_rpc.rpc import RemoteException

from support.tokens import claims, credential
from switchboard.cli import main
from switchboard.clock import SystemClock
from switchboard.hub.identity.auth import AUDIENCE, ISSUER, TokenIssuer
from switchboard.hub.identity.users import ROOT, Permission
from switchboard.hub.manager import workspace_records
from switchboard.testing.hub import TEST_SECRET

pytestmark = pytest.mark.timeout(60)


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def operator_token(user: str, workspace: str, permission: str, expires_in: float = 600) -> str:
    """What ``switchboard token`` prints for this hub (same secret)."""
    args = ["token", "--user", user, "--workspace", workspace, "--permission", permission]
    result = CliRunner().invoke(main, [*args, "--expires-in", str(expires_in), "--jwt-secret", TEST_SECRET])
    assert result.exit_code == 0, result.output
    return result.output.strip()


def login_token(user_id: str) -> str:
    """A first-hand credential naming no current workspace (as an identity provider's login token)."""
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": user_id, "exp": 4_000_000_000, "scope": f"ws:ws-user-{user_id}#a"}
    return jwt.encode({**claims, "https://amun.ai/roles": []}, TEST_SECRET)


# -- item 2: a name tokens grant is not free for the taking -------------------------------------------


@pytest.mark.parametrize("name", ["team-x", "lab-shared-2"])
def test_the_cli_hands_out_no_name_that_any_user_may_create(name: str) -> None:
    result = CliRunner().invoke(main, ["token", "--user", "ci", "--workspace", name, "--jwt-secret", TEST_SECRET])
    assert result.exit_code != 0
    assert "any user may create" in result.output
    assert "Traceback" not in result.output


async def test_no_token_is_generated_for_a_name_any_user_may_create_before_its_record_exists(connect):
    """Not even by a hub admin: once its holders left, the first user to create the record would own
    the name and every token for it."""
    ws = fresh("team")
    root_grant = TokenIssuer(TEST_SECRET, SystemClock()).issue(
        ROOT, workspace="ws-user-root", permission=Permission.ADMIN, expires_in=600
    )
    operator = await connect(client_id="operator", token=root_grant)
    with pytest.raises(RemoteException, match=f"Cannot generate a token for workspace {ws}: it has no record"):
        await operator.generate_token({"workspace": ws, "permission": "read_write"})
    await operator.create_workspace({"id": ws})
    member_token = await operator.generate_token({"workspace": ws, "permission": "read_write"})
    await operator.disconnect()
    mallory = await connect(client_id="mallory", token=credential("mallory", 3600)[0])
    with pytest.raises(RemoteException, match="already exists"):
        await mallory.create_workspace({"id": ws})
    member = await connect(client_id="member", token=member_token, workspace=ws)
    assert member.config["workspace"] == ws


async def test_a_stranger_cannot_take_a_workspace_that_operator_tokens_grant(connect):
    ws = f"team_{uuid.uuid4().hex[:8]}"  # an operator's name: outside the grammar users create in
    member_token = operator_token("member", ws, "read_write")
    # nobody of ws is connected and it has no record: the stranger (any account) tries to take it
    mallory = await connect(client_id="mallory", token=credential("mallory", 3600)[0])
    with pytest.raises(RemoteException, match="needs admin"):
        await mallory.create_workspace({"id": ws})
    # a member with a weaker grant there cannot either
    member = await connect(client_id="member", token=member_token, workspace=ws)
    with pytest.raises(RemoteException, match="needs admin"):
        await member.create_workspace({"id": ws})
    await member.disconnect()
    # its admin (the grant the operator gave) creates the record
    admin = await connect(client_id="admin", token=operator_token("lead", ws, "admin"), workspace=ws)
    made = await admin.create_workspace({"id": ws, "description": "provisioned"})
    assert made["owners"] == [admin.config["user"]["id"]]
    with pytest.raises(RemoteException, match="Permission denied"):
        await mallory.get_workspace_info(ws)
    with pytest.raises(RemoteException, match="cannot overwrite"):
        await mallory.create_workspace({"id": ws}, overwrite=True)
    # an operator's workspace gets owners the way any does: invited, then accepting
    await admin.create_workspace({"id": ws, "owners": [admin.config["user"]["id"], "carol"]}, overwrite=True)
    carol = await connect(client_id="carol", token=credential("carol", 3600)[0])
    assert (await carol.create_workspace({"id": ws}, overwrite=True))["owners"][-1] == "carol"


async def test_a_user_still_creates_a_new_workspace_in_the_grammar_anyone_may_create(connect):
    alice = await connect(client_id="alice", token=credential("alice", 3600)[0])
    ws = fresh("lab")
    assert (await alice.create_workspace({"id": ws}))["owners"] == ["alice"]


# -- item 6: overwriting never drops owners, a time-limited admin grant never becomes ownership ----------


async def test_a_time_limited_admin_who_overwrites_keeps_the_owners_and_becomes_no_owner(connect):
    alice = await connect(client_id="alice", token=credential("alice", 3600)[0])
    ws = fresh("proj")
    await alice.create_workspace({"id": ws, "description": "alice's"})
    grant = await alice.generate_token({"workspace": ws, "permission": "admin", "expires_in": 60})
    mallory = await connect(client_id="mallory", token=grant, workspace=ws)
    with pytest.raises(RemoteException, match="only an owner changes"):
        await mallory.create_workspace({"id": ws, "owners": ["mallory"]}, overwrite=True)
    # an admin may change what the record says, not whom it names
    changed = await mallory.create_workspace({"id": ws, "description": "edited"}, overwrite=True)
    assert changed["owners"] == ["alice"]
    info = await alice.get_workspace_info(ws)
    assert (info["owners"], info["description"]) == (["alice"], "edited")
    # the grant's holder is nobody's owner once the grant is gone: its own login owns nothing
    holder = claims(grant)["sub"]
    assert holder not in info["owners"]
    outsider = await connect(client_id="mallory-login", token=login_token("mallory"))
    with pytest.raises(RemoteException, match="Permission denied"):
        await outsider.get_workspace_info(ws)


async def test_an_owner_may_drop_another_owner_and_not_itself(connect):
    alice = await connect(client_id="alice", token=credential("alice", 3600)[0])
    bob = await connect(client_id="bob", token=credential("bob", 3600)[0])
    ws = fresh("pair")
    await alice.create_workspace({"id": ws, "owners": ["alice", "bob"]})
    await bob.create_workspace({"id": ws}, overwrite=True)  # bob accepts the invitation
    assert (await alice.get_workspace_info(ws))["owners"] == ["alice", "bob"]
    kept = await alice.create_workspace({"id": ws, "owners": []}, overwrite=True)
    assert kept["owners"] == ["alice"]


# -- item 10: owners accept; quotas count the accountable principal -------------------------------------


async def test_a_record_names_as_owners_only_those_who_accepted(connect):
    mallory = await connect(client_id="mallory", token=credential("mallory", 3600)[0])
    victim = await connect(client_id="victim", token=credential("victim", 3600)[0])
    ws = fresh("bait")
    made = await mallory.create_workspace({"id": ws, "owners": ["victim"]})
    assert made["owners"] == ["mallory"]
    assert made["invited"] == ["victim"]
    with pytest.raises(RemoteException, match="Permission denied"):  # an invitation grants nothing
        await victim.get_workspace_info(ws)
    assert ws not in [w["id"] for w in await victim.list_workspaces()]
    accepted = await victim.create_workspace({"id": ws}, overwrite=True)
    assert (accepted["owners"], accepted["invited"]) == (["mallory", "victim"], [])


async def test_invitations_do_not_spend_the_invited_users_quota(connect, monkeypatch):
    monkeypatch.setattr(workspace_records, "MAX_WORKSPACES_PER_USER", 2)
    mallory = await connect(client_id="mallory", token=credential("mallory", 3600)[0])
    victim = await connect(client_id="victim", token=credential("victim", 3600)[0])
    await mallory.create_workspace({"id": fresh("bait"), "owners": ["victim"]})
    await mallory.create_workspace({"id": fresh("bait"), "owners": ["victim"]})
    await victim.create_workspace({"id": fresh("mine")})
    await victim.create_workspace({"id": fresh("mine")})


async def test_the_quota_counts_the_root_of_a_token_chain_not_each_minted_id(connect, monkeypatch):
    monkeypatch.setattr(workspace_records, "MAX_WORKSPACES_PER_USER", 2)
    alice = await connect(client_id="alice", token=credential("alice", 3600)[0])
    await alice.create_workspace({"id": fresh("mine")})
    minted = await alice.generate_token({"permission": "admin"})
    child = await connect(client_id="child", token=minted)
    await child.create_workspace({"id": fresh("mine")})
    grandchild = await connect(client_id="grandchild", token=await child.generate_token({"permission": "admin"}))
    with pytest.raises(RemoteException, match="Workspace quota exceeded: user alice"):
        await grandchild.create_workspace({"id": fresh("mine")})
    with pytest.raises(RemoteException, match="Workspace quota exceeded"):
        await alice.create_workspace({"id": fresh("mine")})

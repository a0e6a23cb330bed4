"""``create_workspace({"name": ...})`` without an ``id`` takes the id from the name, as Hypha does
(issue 38, item 1), with an unmodified hypha-rpc client.

The name is used as it is (not lowercased), so it is held to the same rules as an ``id``: a name
outside the grammar users create in is refused, and a name already taken stays its owner's.
"""

from __future__ import annotations

import uuid

import pytest
from hypha_rpc.rpc import RemoteException

from support.tokens import credential

pytestmark = pytest.mark.timeout(60)


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def token_of(user_id: str) -> str:
    return credential(user_id, 3600)[0]


async def test_a_workspace_created_by_its_name_alone_has_that_name_as_its_id(connect) -> None:
    alice = await connect(client_id="alice", token=token_of("alice"))
    ws = fresh("lab-by-name")
    made = await alice.create_workspace({"name": ws, "description": "named only"})
    assert (made["id"], made["name"], made["owners"]) == (ws, ws, ["alice"])
    info = await alice.get_workspace_info(ws)
    assert (info["id"], info["description"]) == (ws, "named only")
    # it is a workspace like any other: its owner mints a token for it and a member joins it
    token = await alice.generate_token({"workspace": ws, "permission": "read_write"})
    member = await connect(client_id="member", token=token, workspace=ws)
    assert member.config["workspace"] == ws


async def test_an_id_given_beside_the_name_is_the_id_and_the_name_is_its_display_name(connect) -> None:
    alice = await connect(client_id="alice", token=token_of("alice"))
    ws = fresh("lab-by-id")
    made = await alice.create_workspace({"id": ws, "name": "Our Lab"})
    assert (made["id"], made["name"]) == (ws, "Our Lab")


async def test_a_name_outside_the_grammar_is_refused_not_rewritten(connect) -> None:
    alice = await connect(client_id="alice", token=token_of("alice"))
    suffix = uuid.uuid4().hex[:8]
    for name in (f"Lab-{suffix}", f"lab_{suffix}", f"lab {suffix}", f"lab.{suffix}", "../escape", "nohyphen"):
        with pytest.raises(RemoteException, match="Invalid workspace name|invalid workspace"):
            await alice.create_workspace({"name": name, "description": "refused"})
    # the upper-case name was not lowercased into a workspace of its own
    assert f"lab-{suffix}" not in [w["id"] for w in await alice.list_workspaces()]


async def test_a_config_with_neither_id_nor_name_is_refused_with_hyphas_words(connect) -> None:
    alice = await connect(client_id="alice", token=token_of("alice"))
    for config in ({"description": "no id"}, {"name": 7}, {"id": None, "name": None}):
        with pytest.raises(RemoteException, match="Workspace id must be provided"):
            await alice.create_workspace(config)
    with pytest.raises(RemoteException, match="Workspace name must not be empty"):
        await alice.create_workspace({"name": ""})


async def test_a_name_taken_by_another_user_stays_its_owners(connect) -> None:
    alice = await connect(client_id="alice", token=token_of("alice"))
    mallory = await connect(client_id="mallory", token=token_of("mallory"))
    ws = fresh("lab-taken")
    await alice.create_workspace({"name": ws})
    with pytest.raises(RemoteException, match="Workspace already exists"):
        await mallory.create_workspace({"name": ws})
    with pytest.raises(RemoteException, match="cannot overwrite"):
        await mallory.create_workspace({"name": ws, "owners": ["mallory"]}, overwrite=True)
    assert (await alice.get_workspace_info(ws))["owners"] == ["alice"]
    anonymous = await connect(client_id="anonymous")
    with pytest.raises(RemoteException, match="Only registered user can create workspace"):
        await anonymous.create_workspace({"name": fresh("lab-anon")})

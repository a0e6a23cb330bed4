"""Who may create a workspace record and whom it names (hub/manager/ownership.py), decided synchronously."""

from __future__ import annotations

import pytest

from switchboard.errors import PermissionDenied, ProtocolError
from switchboard.hub.identity.users import Permission, User
from switchboard.hub.manager.ownership import anyone_may_create, check_may_create, naming_after, record_payer

ALICE = User(id="alice", roles=("user",), email="alice@example.org")
BOB = User(id="bob", roles=("user",))
ALICES_TOKEN = User(id="x1y2z3", roles=("user",), parent="alice", email="alice@example.org")


@pytest.mark.parametrize(
    ("name", "free"), [("team-x", True), ("team_x", False), ("TeamX", False), ("teamx", False), ("ws-user-bob", False)]
)
def test_only_lowercase_hyphenated_names_are_free_for_any_user(name: str, free: bool) -> None:
    assert anyone_may_create(name) is free


def test_an_operators_name_needs_admin_there() -> None:
    with pytest.raises(ProtocolError, match="needs admin"):
        check_may_create(BOB, "team_x", Permission.READ_WRITE)
    check_may_create(BOB, "team_x", Permission.ADMIN)
    check_may_create(BOB, "team-x", Permission.NONE)
    with pytest.raises(PermissionDenied, match="personal workspace of another user"):
        check_may_create(BOB, "ws-user-alice", Permission.ADMIN)


def test_at_creation_the_caller_is_the_only_owner_and_the_others_are_invited() -> None:
    made = naming_after(ALICE, ["alice@example.org", "bob", "bob"], None, admin=False)
    assert (made.owners, made.invited) == (["alice@example.org"], ["bob"])
    assert naming_after(ALICE, None, None, admin=False).owners == ["alice"]
    # a generated token inherits its maker's email, not the right to be named by it
    assert naming_after(ALICES_TOKEN, ["alice@example.org"], None, admin=True).owners == ["x1y2z3"]


def test_an_admin_by_grant_rewrites_a_record_but_never_whom_it_names() -> None:
    record = {"id": "w-1", "owners": ["alice"], "invited": ["carol"]}
    kept = naming_after(BOB, None, record, admin=True)
    assert (kept.owners, kept.invited, kept.accepting) == (["alice"], ["carol"], False)
    with pytest.raises(PermissionDenied, match="only an owner changes the owners"):
        naming_after(BOB, ["bob"], record, admin=True)
    with pytest.raises(PermissionDenied, match="cannot overwrite"):
        naming_after(BOB, None, record, admin=False)


def test_an_invited_user_accepts_and_an_owner_changes_the_list_but_never_drops_itself() -> None:
    record = {"id": "w-1", "owners": ["alice"], "invited": ["bob"]}
    accepted = naming_after(BOB, None, record, admin=False)
    assert (accepted.owners, accepted.invited, accepted.accepting) == (["alice", "bob"], [], True)
    both = {**record, "owners": ["alice", "bob"], "invited": []}
    alone = naming_after(ALICE, [], both, admin=True)
    assert (alone.owners, alone.invited) == (["alice"], [])


def test_a_record_is_counted_against_its_creators_principal() -> None:
    assert ALICES_TOKEN.accountable == "alice"
    assert record_payer({"created_by": "alice", "owners": ["x1y2z3"]}) == "alice"
    assert record_payer({"owners": ["bob", "alice"]}) == "bob"  # a record from before created_by

"""The one decision every door makes about a record's owner (``User.with_ownership``), synchronously."""

from __future__ import annotations

from switchboard.hub.identity.users import Permission, User, new_anonymous_user

RECORD = {"id": "team-x", "owners": ["alice", "carol@example.org"], "invited": ["bob"]}


def test_an_owner_named_by_id_is_admin_there_and_nowhere_else() -> None:
    alice = User(id="alice", roles=("user",)).with_ownership("team-x", RECORD)
    assert alice.permission("team-x") is Permission.ADMIN
    assert alice.permission("team-y") is Permission.NONE


def test_an_owner_named_by_email_is_admin_only_with_a_first_hand_credential() -> None:
    carol = User(id="carol", roles=("user",), email="carol@example.org")
    assert carol.with_ownership("team-x", RECORD).permission("team-x") is Permission.ADMIN
    minted = User(id="k9", roles=("user",), email="carol@example.org", parent="carol")
    assert minted.with_ownership("team-x", RECORD).permission("team-x") is Permission.NONE


def test_the_invited_the_strangers_and_the_anonymous_gain_nothing() -> None:
    for user in (User(id="bob", roles=("user",)), User(id="mallory", roles=("user",)), new_anonymous_user()):
        assert user.with_ownership("team-x", RECORD) is user
    anonymous = new_anonymous_user()
    assert anonymous.with_ownership("team-x", {"owners": [anonymous.id]}) is anonymous


def test_no_record_or_a_grant_already_admin_leaves_the_user_as_it_is() -> None:
    alice = User(id="alice", roles=("user",))
    assert alice.with_ownership("team-x", None) is alice
    admin = User(id="alice", roles=("user",), grants={"team-x": Permission.ADMIN})
    assert admin.with_ownership("team-x", RECORD) is admin

"""Whom a deletion or revocation notice reaches among the connections joining (hub/sessions/joins.py): each rule
driven synchronously, no hub, no I/O."""

from __future__ import annotations

from switchboard.hub.identity.users import User
from switchboard.hub.sessions.joins import Holders, Joins
from switchboard.hub.sessions.peer import Peer

MEMBER = User(id="mel", token_id="jti-member", chain=("jti-minter", "jti-root"))


def test_a_deletion_refuses_who_is_joining_that_workspace_and_nobody_else() -> None:
    joins = Joins()
    here, elsewhere, unread = joins.begin(), joins.begin(), joins.begin()
    here.expect(MEMBER, "team-a")
    elsewhere.expect(MEMBER, "team-b")
    joins.deleted("team-a")
    assert here.refusal == "Workspace team-a was deleted"
    assert elsewhere.refusal is None
    assert unread.refusal is None  # its admission reads the stores after this: it sees the tombstone there


def test_a_revocation_refuses_who_joins_with_that_credential_or_one_it_descends_from() -> None:
    joins = Joins()
    own, descendant, stranger = joins.begin(), joins.begin(), joins.begin()
    own.expect(User(id="mel", token_id="jti-root"), "team-a")
    descendant.expect(MEMBER, "team-a")
    stranger.expect(User(id="sam", token_id="jti-sam"), "team-a")
    joins.revoked("jti-root")
    assert own.refusal == descendant.refusal == "Authentication error: Token has been revoked"
    assert stranger.refusal is None


def test_the_first_notice_stands_and_a_joined_connection_is_no_longer_reached() -> None:
    joins = Joins()
    joining = joins.begin()
    joining.expect(MEMBER, "team-a")
    joins.revoked("jti-member")
    joins.deleted("team-a")
    assert joining.refusal == "Authentication error: Token has been revoked"
    joined = joins.begin()
    joined.expect(MEMBER, "team-b")
    joins.end(joined)
    joins.deleted("team-b")
    assert joined.refusal is None
    assert len(joins) == 1


def test_a_session_is_found_by_each_credential_it_stands_on_until_it_leaves() -> None:
    holders = Holders()
    mel = Peer(workspace="team-a", client_id="mel", user=MEMBER, transport=None, max_queue_bytes=1)  # type: ignore[arg-type]
    holders.add(mel)
    assert [holders.of(i) for i in ("jti-member", "jti-minter", "jti-root", "jti-other")] == [[mel], [mel], [mel], []]
    holders.discard(mel)
    assert holders.of("jti-root") == []
    assert len(holders) == 0

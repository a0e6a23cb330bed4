"""A connection's life, from joining to gone: how it ended, whether its client is coming back, what each step calls for.

Pure and clock-free: the hub's monotonic time is passed in, so each rule of
a client's transit is one synchronous line here.
"""

from __future__ import annotations

import pytest

from switchboard.hub.identity.users import User
from switchboard.hub.sessions.effects import Depart, Effect, RefuseJoin, Supersede
from switchboard.hub.sessions.life import FRESH_GOODBYE, GOODBYE_CODES, HANDED_OVER, Life, Stage, TransitionError

GRACE = 5.0


def ended(code: int, *, by_client: bool) -> Life:
    life = Life()
    assert life.end_by_client(code) if by_client else life.end(code, "closed by the hub")
    return life


# how it ended -> whether its client comes back from it
ENDINGS = [
    (1000, True, False),  # a goodbye
    (1001, True, False),  # a page closed
    (1006, True, True),  # a drop
    (4000, True, True),  # any other code of the client's
    (HANDED_OVER, False, True),  # a draining replica sent it to a sibling
    (1008, False, False),  # the hub closed it for cause (a slow consumer, a policy)
    (1011, False, False),  # an internal error
]


@pytest.mark.parametrize(("code", "by_client", "comes_back"), ENDINGS)
def test_a_client_comes_back_from_a_drop_or_a_hand_over_not_from_a_goodbye_or_the_hub_s_close(
    code: int, by_client: bool, comes_back: bool
) -> None:
    life = ended(code, by_client=by_client)
    assert life.may_return is comes_back
    assert life.expected_back(0.0, grace=GRACE) is comes_back
    assert life.goodbye is (by_client and code in GOODBYE_CODES)


def test_an_open_connection_or_one_without_a_grace_is_never_in_transit() -> None:
    assert not Life().expected_back(0.0, grace=GRACE)
    assert not ended(1006, by_client=True).expected_back(0.0, grace=0.0)


def test_the_first_end_stands() -> None:
    life = Life()
    assert life.end(HANDED_OVER, "handed over")
    assert not life.end_by_client(1000), "the client's close after the hand-over changes nothing"
    assert (life.code, life.reason, life.by_client, life.may_return) == (HANDED_OVER, "handed over", False, True)
    again = Life()
    assert again.end_by_client(1006)
    assert not again.end(1000, "superseded")
    assert again.may_return


def test_a_goodbye_fresh_from_transit_is_not_believed_for_a_second() -> None:
    """hypha-rpc may open two connections at once and close one with 1000 within 16 ms."""
    life = Life()
    life.arrived(100.0)
    life.back()
    assert life.end_by_client(1000)
    assert not life.may_return
    assert life.expected_back(100.0 + FRESH_GOODBYE - 0.01, grace=GRACE)
    assert not life.expected_back(100.0 + FRESH_GOODBYE, grace=GRACE)


def test_only_a_return_from_transit_makes_a_connection_fresh() -> None:
    resumed = Life()
    resumed.arrived(100.0)  # a reconnection that found no transit (another replica's notice was late)
    assert not resumed.fresh(100.1)
    assert resumed.just_arrived(100.1), "but a second copy of its client elsewhere may be its own twin"
    assert not resumed.just_arrived(100.0 + FRESH_GOODBYE)
    assert not Life().just_arrived(0.5), "a first connection never just arrived"
    resumed.back()
    assert resumed.fresh(100.1)
    assert not resumed.fresh(100.0 + FRESH_GOODBYE)


# -- the machine: from joining to gone, each transition's next stage and effects ------------------------------------

ADDRESS, WORKSPACE = "team-a/mel", "team-a"
MEL = User(id="mel", token_id="jti-mel")


def words(effects: list[Effect]) -> list[str]:
    """Effects as the table reads them: the kind, lower case."""
    return [type(effect).__name__.lower() for effect in effects]


def live(*, arrived: bool = False) -> Life:
    life = Life(Stage.JOINING)
    life.expect(MEL, WORKSPACE)
    life.admitted()
    life.join(ADDRESS, WORKSPACE, first_in_workspace=False, took_over=False, resume=arrived)
    life.attached()
    return life


def joined(first: bool, took_over: bool, resume: bool, replaced: bool) -> list[str]:
    life = Life(Stage.JOINING)
    life.expect(MEL, WORKSPACE)
    life.admitted()
    return words(
        life.join(ADDRESS, WORKSPACE, first_in_workspace=first, took_over=took_over, resume=resume, replaced=replaced)
    )


# the join: (first of its workspace here, the id held elsewhere, a resume, a live connection here replaced)
# -> what makes it reachable
JOINS = [
    ((False, False, False, False), ["listen"]),
    ((True, False, False, False), ["listen", "joinworkspace"]),
    ((False, True, False, False), ["listen", "takeover"]),
    ((False, False, True, False), ["listen", "resume"]),
    ((False, False, True, True), ["supersede", "listen", "resume"]),
    ((False, False, False, True), ["supersede", "listen"]),
    ((True, True, True, False), ["listen", "joinworkspace", "takeover", "resume"]),
]


@pytest.mark.parametrize(("facts", "effects"), JOINS)
def test_a_join_supersedes_listens_joins_its_workspace_takes_over_and_resumes_as_the_facts_say(
    facts: tuple[bool, bool, bool, bool], effects: list[str]
) -> None:
    assert joined(*facts) == effects


def test_what_a_superseded_connection_had_goes_to_a_resume_and_fails_for_a_new_session() -> None:
    life = Life()
    effects = life.join(ADDRESS, WORKSPACE, first_in_workspace=False, took_over=False, resume=True, replaced=True)
    assert effects[0] == Supersede(ADDRESS, resume=True)
    fresh = Life().join(ADDRESS, WORKSPACE, first_in_workspace=False, took_over=False, resume=False, replaced=True)
    assert fresh[0] == Supersede(ADDRESS, resume=False)


def test_a_notice_while_joining_refuses_the_join_and_nothing_else_follows() -> None:
    life = Life(Stage.JOINING)
    life.expect(MEL, WORKSPACE)
    life.refuse("Workspace team-a was deleted")
    life.refuse("Authentication error: Token has been revoked")  # the first reason stands
    life.admitted()
    effects = life.join(ADDRESS, WORKSPACE, first_in_workspace=True, took_over=True, resume=True, replaced=True)
    assert effects == [Supersede(ADDRESS, resume=True), RefuseJoin("Workspace team-a was deleted")]


def test_a_notice_after_the_attach_refuses_nothing_notices_reach_it_as_a_member_then() -> None:
    life = live()
    life.refuse("Workspace team-a was deleted")
    assert life.refusal is None


def test_what_notices_concerned_while_joining_is_not_kept_once_attached() -> None:
    """Thousands of idle connections keep no copy of their credential ids."""
    life = Life(Stage.JOINING)
    life.expect(MEL, WORKSPACE)
    assert (life.workspace, set(life.ids)) == (WORKSPACE, {"jti-mel"})
    life.admitted()
    life.join(ADDRESS, WORKSPACE, first_in_workspace=False, took_over=False, resume=False)
    life.attached()
    assert (life.workspace, tuple(life.ids)) == (None, ())


def test_the_stages_go_one_way_joining_admitted_live_ended() -> None:
    life = Life(Stage.JOINING)
    assert life.stage is Stage.JOINING
    assert not life.was_live
    life.admitted()
    assert life.stage is Stage.ADMITTED
    life.join(ADDRESS, WORKSPACE, first_in_workspace=False, took_over=False, resume=False)
    life.attached()
    assert (life.stage, life.was_live) == (Stage.LIVE, True)
    life.end_by_client(1006)
    assert life.stage is Stage.ENDED
    with pytest.raises(TransitionError):
        life.admitted()
    with pytest.raises(TransitionError):
        Life(Stage.JOINING).join(ADDRESS, WORKSPACE, first_in_workspace=False, took_over=False, resume=False)


def test_a_connection_ended_during_its_attach_still_joins_and_counts_as_attached_but_stays_ended() -> None:
    life = Life()
    life.end(1000, "superseded")
    assert words(life.join(ADDRESS, WORKSPACE, first_in_workspace=False, took_over=False, resume=False)) == ["listen"]
    life.attached()
    assert (life.stage, life.was_live) == (Stage.ENDED, True)


def test_a_live_connection_is_not_let_go_before_it_ended() -> None:
    with pytest.raises(TransitionError):
        live().detached(ADDRESS, current=True, workspace_empty=False)


# letting go: (its client's live connection, the last of its workspace here, a newer connection came meanwhile,
# the registry's answer to the transit mark) -> the effects, each step's in turn, and the stage it ends in
LET_GO = [
    ("a drop, the registry marks it", 1006, True, False, False, True, ["expect", "unlisten", "depart", "salvage"], Stage.IN_TRANSIT),
    ("a drop, the last of its workspace", 1006, True, True, False, True, ["expect", "unlisten", "leaveworkspace", "depart", "salvage"], Stage.IN_TRANSIT),
    ("a goodbye: it left", 1000, True, False, False, False, ["expect", "unlisten", "depart", "purge"], Stage.GONE),
    ("a drop the registry refused (back elsewhere)", 1006, True, False, False, False, ["expect", "unlisten", "depart", "purge"], Stage.GONE),
    ("a newer connection came while the counts were asked", 1006, True, False, True, None, ["expect", "handon"], Stage.GONE),
    ("superseded: a newer connection replaced it", 1000, False, False, True, None, [], Stage.GONE),
]  # fmt: skip


@pytest.mark.parametrize(
    ("story", "code", "current", "empty", "newer", "marked", "effects", "stage"), LET_GO, ids=[row[0] for row in LET_GO]
)
def test_letting_go_a_connection_says_what_follows_at_each_step(
    story: str,
    code: int,
    current: bool,
    empty: bool,
    newer: bool,
    marked: bool | None,
    effects: list[str],
    stage: Stage,
) -> None:
    life = live()
    life.end_by_client(code)
    seen = words(life.detached(ADDRESS, current=current, workspace_empty=empty))
    after_count = life.counted_out(ADDRESS, WORKSPACE, newer_here=newer)
    seen += words(after_count)
    if any(isinstance(effect, Depart) for effect in after_count):
        assert marked is not None
        if marked:
            life.left_in_transit(until=105.0)  # what the registry's mark does, through the transit steps
        seen += words(life.departed(ADDRESS, WORKSPACE, "mel", in_transit=marked))
    assert (seen, life.stage) == (effects, stage)


def test_a_client_the_drain_put_in_transit_stays_in_transit_when_its_connection_is_let_go() -> None:
    life = live()
    life.end(HANDED_OVER, "handed over")
    life.left_in_transit(until=105.0)  # the drain departs it before the door lets it go
    life.left_in_transit(until=107.0)  # the door's own departure: the first mark stands
    assert words(life.detached(ADDRESS, current=True, workspace_empty=False)) == ["expect"]
    assert words(life.counted_out(ADDRESS, WORKSPACE, newer_here=False)) == ["unlisten", "depart"]
    assert words(life.departed(ADDRESS, WORKSPACE, "mel", in_transit=True)) == ["salvage"]
    assert (life.stage, life.until) == (Stage.IN_TRANSIT, 105.0)


def test_a_connection_let_go_twice_stays_gone_and_asks_nothing_more() -> None:
    life = live()
    life.end_by_client(1000)
    life.detached(ADDRESS, current=True, workspace_empty=False)
    life.counted_out(ADDRESS, WORKSPACE, newer_here=False)
    life.departed(ADDRESS, WORKSPACE, "mel", in_transit=False)
    assert words(life.detached(ADDRESS, current=False, workspace_empty=False)) == []
    assert words(life.counted_out(ADDRESS, WORKSPACE, newer_here=False)) == []
    assert life.stage is Stage.GONE

"""Who may have a client id (``admission.take_over``), as a table: synchronous, no I/O.

A client id belongs to the user that first connected with it. Only that user
takes it, whatever a ping would answer; only a connection with the client's
reconnection token gets what was held for it.
"""

from __future__ import annotations

import pytest

from switchboard.hub.gate.admission import Takeover, take_over

CLIENT = "W/victim"


def decide(
    *,
    user: str = "alice",
    holder: str | None = "alice",
    resuming: bool = False,
    live_here: bool = False,
    registered: bool = False,
    in_transit: bool = False,
) -> Takeover:
    return take_over(
        client=CLIENT,
        user=user,
        resuming=resuming,
        holder=holder,
        live_here=live_here,
        registered=registered,
        in_transit=in_transit,
    )


@pytest.mark.parametrize("resuming", [False, True])
@pytest.mark.parametrize(
    ("live_here", "registered", "in_transit"),
    [(False, False, False), (True, True, False), (False, True, True), (False, False, True), (True, False, False)],
)
def test_another_user_never_takes_the_id(resuming: bool, live_here: bool, registered: bool, in_transit: bool) -> None:
    plan = decide(user="mallory", resuming=resuming, live_here=live_here, registered=registered, in_transit=in_transit)
    assert plan.refusal is not None
    assert f"{CLIENT} belongs to another user" in plan.refusal
    assert (plan.resume, plan.probe, plan.replace) == (False, False, False), "a refusal does nothing else"


def test_a_free_id_is_taken_by_whoever_comes_first() -> None:
    assert decide(user="mallory", holder=None) == Takeover()


def test_the_reconnection_token_resumes_the_client_without_a_ping() -> None:
    for live_here, in_transit in ((True, False), (False, True)):
        assert decide(resuming=True, live_here=live_here, registered=True, in_transit=in_transit) == Takeover(
            resume=True
        )


def test_the_same_user_without_the_token_supersedes_a_copy_here_that_does_not_answer() -> None:
    assert decide(live_here=True, registered=True) == Takeover(probe=True)


def test_the_same_user_without_the_token_starts_a_new_session_of_a_client_in_transit() -> None:
    """What was held for the earlier session fails: it goes only to the reconnection token."""
    assert decide(registered=True, in_transit=True) == Takeover(probe=True, replace=True)
    assert decide(in_transit=True) == Takeover(replace=True)


def test_the_same_user_replaces_registrations_left_by_a_copy_elsewhere() -> None:
    assert decide(registered=True) == Takeover(probe=True, replace=True)

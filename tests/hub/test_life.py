"""A connection's life: how it ended, and whether its client is coming back.

Pure and clock-free: the hub's monotonic time is passed in, so each rule of
a client's transit is one synchronous line here.
"""

from __future__ import annotations

import pytest

from switchboard.hub.sessions.life import FRESH_GOODBYE, GOODBYE_CODES, HANDED_OVER, Life

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

"""What a frame becomes after the I/O: the router's fallback table, as values.

A publish that reached nobody, a frame the bus delivered to a connection that
had just ended, a connection here that refused a frame, and the registry's
answer to "does some replica claim this client?" each come back to the router
as a fact; it answers with the next action, which the dispatch only carries
out. Synchronous but for the rows where frames already wait for the target
(the retry window's queue runs on the event loop).
"""

from __future__ import annotations

from typing import Any

import pytest

from support.wire import Wire
from switchboard.hub.actions import Fail, Hold, RetryIfClaimed, RetryLater
from switchboard.hub.metrics import HubMetrics
from switchboard.hub.peer import Peer
from switchboard.hub.retry import RetryWindow
from switchboard.hub.router import Router
from switchboard.hub.transit import Transit
from switchboard.hub.undelivered import Undelivered
from switchboard.hub.users import Permission, User
from switchboard.testing.clock import FakeClock
from switchboard.testing.hub import settings_for_tests

WS = "ws-1"
MOVING = f"{WS}/moving"  # in transit between connections
AWAY = f"{WS}/away"  # not here, not moving: another replica's, or nobody's
CALLER = f"{WS}/caller"
ITEM = Undelivered(b"frame", "s1", CALLER)


async def _unreached(*_: Any) -> bool:
    return False


def router(*, window: float) -> tuple[Router, RetryWindow]:
    clock = FakeClock()
    settings = settings_for_tests()
    transit: Transit[Undelivered] = Transit(clock=clock, grace=5.0)
    transit.left(MOVING)
    retry = RetryWindow(clock=clock, window=window, interval=0.1, publish=_unreached, give_up=lambda *_: None)
    return (
        Router(
            settings=settings,
            clock=clock,
            metrics=HubMetrics(settings.replica_id),
            peers={},
            aliases=set(),
            transit=transit,
            retry=retry,
        ),
        retry,
    )


def shape(action: Any) -> Any:
    """An action as the types it is made of: ``Hold`` with what it falls back to."""
    if type(action) is Hold:
        return (Hold, shape(action.otherwise))
    return type(action)


# target × retry window × frames already waiting for it → what a publish that reached nobody becomes
REACHED_NOBODY = [
    (MOVING, 6.0, (Hold, RetryIfClaimed)),
    (MOVING, 0.0, (Hold, Fail)),
    (AWAY, 6.0, RetryIfClaimed),
    (AWAY, 0.0, Fail),
]


@pytest.mark.parametrize(("target", "window", "expected"), REACHED_NOBODY)
def test_a_publish_that_reached_nobody_waits_for_a_moving_client_else_for_a_claimed_one_else_fails(
    target: str, window: float, expected: Any
) -> None:
    r, _ = router(window=window)
    assert shape(r.reached_nobody(target, ITEM)) == expected


# retry window × frames already waiting → what a frame lost after delivery becomes (always held
# first: its client's connection ended, so it may be moving; the hold says whether it is)
LOST = [
    (6.0, False, (Hold, RetryIfClaimed)),
    (0.0, False, (Hold, Fail)),
    (6.0, True, (Hold, RetryLater)),
    (0.0, True, (Hold, RetryLater)),
]


@pytest.mark.parametrize(("window", "waiting", "expected"), LOST)
async def test_a_frame_lost_after_delivery_is_held_else_queued_behind_others_else_claimed_else_failed(
    window: float, waiting: bool, expected: Any
) -> None:
    r, retry = router(window=window)
    if waiting:
        retry.add(AWAY, Undelivered(b"earlier", None, CALLER))
    try:
        assert shape(r.lost(AWAY, ITEM)) == expected
    finally:
        await retry.close()


def test_a_frame_a_connection_here_refused_waits_for_its_client_else_fails() -> None:
    r, _ = router(window=6.0)
    peer = Peer(
        workspace=WS,
        client_id="gone",
        user=User(id="u", grants={WS: Permission.READ_WRITE}),
        transport=Wire(),
        max_queue_bytes=1 << 20,
    )
    done = r.refused(peer, ITEM)
    assert shape(done) == (Hold, Fail)
    assert done.target == peer.id


@pytest.mark.parametrize(("claimed", "expected"), [(True, RetryLater), (False, Fail)])
def test_a_client_some_replica_claims_is_retried_and_one_nobody_claims_fails(claimed: bool, expected: Any) -> None:
    r, _ = router(window=6.0)
    done = r.claim_read(AWAY, ITEM, claimed=claimed)
    assert type(done) is expected
    assert (done.target, done.item) == (AWAY, ITEM)

"""A frame a lost link left unacked is delivered at most once, whichever path brings it first (issue 37).

Decisions of ``protocol/link/link_arrivals.py``, driven synchronously with a made-up
clock; the paths themselves (a real link through a host on the path, real
Redis) are in ``tests/security/test_link_tampering.py``.
"""

from __future__ import annotations

from switchboard.protocol.link import link_wire as wire
from switchboard.protocol.link import replica_wire
from switchboard.protocol.link.link_arrivals import Arrivals

D = "0123456789abcdef01234567"  # a direction's id


def test_a_replay_of_a_frame_the_link_delivered_is_not_delivered_again() -> None:
    arrivals = Arrivals()
    arrivals.opened(D)
    assert [arrivals.from_link(D, n) for n in (1, 2, 3)] == [True, True, True]
    arrivals.lost(D, now=10.0)
    assert [arrivals.from_replay(D, n, now=10.5) for n in (2, 3, 4)] == [False, False, True]


def test_a_replay_of_a_frame_sent_back_is_its_first_arrival() -> None:
    arrivals = Arrivals()
    arrivals.opened(D)
    assert arrivals.from_link(D, 1)
    arrivals.sent_back(D, 1)  # its client was not here: the link did not deliver it
    assert arrivals.from_replay(D, 1, now=0.0)
    assert not arrivals.from_replay(D, 1, now=0.0), "a second replay of it"


def test_the_link_does_not_deliver_what_a_replay_delivered_first() -> None:
    arrivals = Arrivals()
    arrivals.opened(D)
    assert arrivals.from_replay(D, 1, now=0.0)  # the host held the link's copy back
    assert not arrivals.from_link(D, 1)
    assert arrivals.from_link(D, 2)


def test_a_replay_that_comes_before_its_link_opened_here_still_counts() -> None:
    arrivals = Arrivals()
    assert arrivals.from_replay(D, 1, now=0.0)
    arrivals.opened(D)  # the host released the handshake afterwards
    assert not arrivals.from_link(D, 1)


def test_a_lost_links_record_is_kept_a_while_then_forgotten() -> None:
    arrivals = Arrivals(keep_for=60.0)
    arrivals.opened(D)
    arrivals.from_link(D, 1)
    arrivals.lost(D, now=0.0)
    assert not arrivals.from_replay(D, 1, now=59.0)
    arrivals.lost("other", now=61.0)  # any later event sweeps
    assert len(arrivals) == 0


def test_records_of_lost_links_are_bounded_and_open_links_keep_theirs() -> None:
    arrivals = Arrivals(max_directions=3)
    arrivals.opened("open")
    arrivals.from_link("open", 1)
    for i in range(10):
        arrivals.from_replay(f"lost-{i}", 1, now=float(i))
    assert len(arrivals) == 4
    assert not arrivals.from_replay("open", 1, now=10.0)


def test_past_its_bound_a_replay_is_dropped_rather_than_risk_a_second_copy() -> None:
    arrivals = Arrivals(max_early=2)
    arrivals.opened(D)
    assert [arrivals.from_replay(D, n, now=0.0) for n in (1, 2, 3)] == [True, True, False]


def test_a_replay_mark_rides_the_origin_tag_and_old_readers_see_no_link_address() -> None:
    tagged = replica_wire.tag("r1@10.0.0.1:4000", b"frame", replay=(D, 7))
    origin, data = replica_wire.untag(tagged)
    assert data == b"frame"
    assert replica_wire.split_replay(origin) == ("r1@10.0.0.1:4000", (D, 7))
    assert wire.parse_origin(origin) is None, "a replica without the mark would dial a made-up port"
    assert replica_wire.split_replay("r1@10.0.0.1:4000") == ("r1@10.0.0.1:4000", None)
    long = "r" * 250 + "@h:1"
    assert replica_wire.split_replay(replica_wire.untag(replica_wire.tag(long, b"x", replay=(D, 1)))[0]) == ("", (D, 1))


def test_both_ends_name_each_direction_alike_and_the_two_directions_apart() -> None:
    up, down = wire.session_keys(b"k" * 32, b"n" * 32, "dialler", "listener", b"m" * 32)
    assert wire.direction_id(up) != wire.direction_id(down)
    assert wire.direction_id(up) == wire.direction_id(bytes(up))

"""A lost link's unacked call is sent again only while its caller still waits for the reply."""

from __future__ import annotations

from switchboard.hub.routing.inflight import InFlight
from switchboard.hub.routing.replays import worth_replaying
from switchboard.protocol.hypha import envelope
from switchboard.protocol.hypha.chunks import MESSAGE_CACHE
from switchboard.protocol.link import replica_wire
from switchboard.server.app import build_hub
from switchboard.testing.hub import settings_for_tests

CALLER, TARGET, MANAGER = "ws-1/caller", "ws-1/provider", "*/manager-s"


def call(session: str, method: str = "services.svc.f", caller: str = CALLER) -> bytes:
    return envelope.encode({"type": "method", "from": caller, "to": TARGET, "method": method, "session": session})


def test_a_call_waiting_for_its_reply_is_sent_again() -> None:
    calls = InFlight()
    calls.opened(CALLER, "s1", TARGET, set())
    assert worth_replaying(call("s1"), calls)


def test_a_call_whose_reply_came_back_is_not_sent_again() -> None:
    calls = InFlight()
    calls.opened(CALLER, "s1", TARGET, set())
    calls.closed(CALLER, "s1")  # the reply passed through this replica
    assert not worth_replaying(call("s1"), calls)


def test_a_manager_call_carried_with_its_origin_is_judged_the_same_way() -> None:
    calls = InFlight()
    frame = call("s2", "services.built-in.get_service", caller=MANAGER)
    wrapped = replica_wire.wrap_manager_call("r1", "s2", frame)
    calls.opened(MANAGER, "s2", TARGET, set())
    assert worth_replaying(wrapped, calls)
    calls.closed(MANAGER, "s2")
    assert not worth_replaying(wrapped, calls)


def test_replies_chunks_and_other_frames_are_always_sent_again() -> None:
    calls = InFlight()  # nothing open: a call in it would not be replayed
    reply = envelope.encode({"type": "method", "from": TARGET, "to": CALLER, "method": "s1.resolve", "session": ""})
    assert worth_replaying(reply, calls)  # a duplicate reply is ignored by its caller
    assert worth_replaying(call("s3", MESSAGE_CACHE + "append"), calls)  # plumbing, not a call
    assert worth_replaying(b"\xc1 not msgpack", calls)  # not ours to judge
    assert not worth_replaying(call("s3"), calls)


def test_the_hub_judges_a_lost_links_frames_by_its_own_calls_in_flight() -> None:
    """The hub's unicast asks the router's calls in flight (not a copy) whether a call may be replayed."""
    hub = build_hub(settings_for_tests())
    hub.inflight.opened(CALLER, "s4", TARGET, set())
    assert hub.unicast.worth_replaying(call("s4"))
    hub.inflight.closed(CALLER, "s4")  # the reply passed through this replica
    assert not hub.unicast.worth_replaying(call("s4"))

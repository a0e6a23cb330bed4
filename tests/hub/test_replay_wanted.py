"""A lost link's unacked call is sent again only while its caller still waits for the reply."""

from __future__ import annotations

from switchboard.hub.remote import CLIENT_CHANNEL
from switchboard.protocol import envelope, relay
from switchboard.server.app import build_hub
from switchboard.testing.hub import settings_for_tests

CALLER, TARGET = "ws-1/caller", "ws-1/provider"


def call(session: str, method: str = "services.svc.f") -> bytes:
    return envelope.encode({"type": "method", "from": CALLER, "to": TARGET, "method": method, "session": session})


def test_a_call_waiting_for_its_reply_is_sent_again() -> None:
    hub = build_hub(settings_for_tests())
    hub.inflight.opened(CALLER, "s1", TARGET, set())
    assert hub.bus.replay_wanted(CLIENT_CHANNEL + TARGET, call("s1"))


def test_a_call_whose_reply_came_back_is_not_sent_again() -> None:
    hub = build_hub(settings_for_tests())
    hub.inflight.opened(CALLER, "s1", TARGET, set())
    hub.inflight.closed(CALLER, "s1")  # the reply passed through this replica
    assert not hub.bus.replay_wanted(CLIENT_CHANNEL + TARGET, call("s1"))


def test_a_manager_call_carried_with_its_origin_is_judged_the_same_way() -> None:
    hub = build_hub(settings_for_tests())
    frame = envelope.encode(
        {
            "type": "method",
            "from": hub.manager_address,
            "to": TARGET,
            "method": "services.built-in.get_service",
            "session": "s2",
        }
    )
    wrapped = relay.wrap_manager_call(hub.replica_id, "s2", frame)
    hub.inflight.opened(hub.manager_address, "s2", TARGET, set())
    assert hub.bus.replay_wanted(CLIENT_CHANNEL + TARGET, wrapped)
    hub.inflight.closed(hub.manager_address, "s2")
    assert not hub.bus.replay_wanted(CLIENT_CHANNEL + TARGET, wrapped)


def test_replies_and_other_frames_are_always_sent_again() -> None:
    hub = build_hub(settings_for_tests())
    reply = envelope.encode({"type": "method", "from": TARGET, "to": CALLER, "method": "s1.resolve", "session": ""})
    assert hub.bus.replay_wanted(CLIENT_CHANNEL + CALLER, reply)  # a duplicate reply is ignored by its caller
    assert hub.bus.replay_wanted(CLIENT_CHANNEL + TARGET, b"\xc1 not msgpack")  # not ours to judge
    assert hub.bus.replay_wanted("sb:replica:r1", call("s1"))  # only client channels carry calls over links

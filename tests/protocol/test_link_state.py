"""One link's state machine, driven by hand: bytes in, frames out, on an explicit clock (no I/O)."""

from __future__ import annotations

import pytest

from switchboard.errors import ProtocolError
from switchboard.protocol.link import link_seal
from switchboard.protocol.link import link_wire as wire
from switchboard.protocol.link.link_state import (
    ACK_DELAY,
    DEAD_AFTER,
    HEARTBEAT,
    WRITE_HIGH_WATER,
    Delivered,
    Hinted,
    LinkState,
    Opened,
    SentBack,
)

KEY = wire.link_key("state-test-secret")


def pair(now: float = 0.0, listener_nonce: bytes = b"L" * wire.NONCE_SIZE) -> tuple[LinkState, LinkState]:
    """A dialler and a listener that have completed their handshake at ``now``."""
    listener = LinkState(wire.Accept(KEY, "listener", listener_nonce), now=now, max_frame=1 << 20)
    dialler = LinkState(wire.Dial(KEY, "dialler", "listener", b"D" * wire.NONCE_SIZE), now=now, max_frame=1 << 20)
    assert exchange(listener, dialler, now) == []  # CHALLENGE -> HELLO
    assert exchange(dialler, listener, now) == [Opened("dialler")]
    assert exchange(listener, dialler, now) == [Opened("listener")]  # WELCOME
    return dialler, listener


def exchange(src: LinkState, dst: LinkState, now: float) -> list[object]:
    """Everything ``src`` has to send, received by ``dst``."""
    return list(dst.receive_data(b"".join(src.data_to_send(now)), now))


def kinds(state: LinkState, now: float) -> list[int]:
    return [kind for kind, _ in wire.Decoder(1 << 20).feed(b"".join(state.data_to_send(now)))]


def test_the_handshake_proves_both_ids_and_opens_full_size_frames() -> None:
    dialler, listener = pair()
    assert (dialler.peer, listener.peer) == ("listener", "dialler")
    big = b"x" * (wire.HANDSHAKE_MAX_FRAME * 4)
    assert dialler.deliver("ch", big)
    assert exchange(dialler, listener, 0.0) == [Delivered("ch", big)]


def test_nothing_but_the_handshake_is_accepted_before_it() -> None:
    listener = LinkState(wire.Accept(KEY, "listener", b"L" * wire.NONCE_SIZE), now=0.0, max_frame=1 << 20)
    with pytest.raises(ProtocolError, match="before the link was authenticated"):
        listener.receive_data(wire.deliver("ch", b"forged"), 0.0)


def test_a_delivered_frame_stays_unacked_until_the_ack_comes_back() -> None:
    dialler, listener = pair()
    assert dialler.deliver("ch", b"one")
    assert dialler.deliver("ch", b"two")
    assert exchange(dialler, listener, 0.0) == [Delivered("ch", b"one"), Delivered("ch", b"two")]
    assert [data for _, data in dialler.unacked] == [b"one", b"two"]
    assert listener.ack_pending  # nothing to send: the owner acks within ACK_DELAY
    ack = b"".join(listener.data_to_send(ACK_DELAY))
    assert [kind for kind, _ in wire.Decoder(1 << 20).feed(ack)] == [wire.ACK]
    assert not listener.ack_pending

    assert listener.data_to_send(ACK_DELAY) == []  # nothing more
    dialler.receive_data(ack, ACK_DELAY)
    assert not dialler.unacked
    assert dialler.unacked_bytes == 0


def test_the_ack_rides_on_the_next_frame_the_receiver_sends() -> None:
    dialler, listener = pair()
    dialler.deliver("call", b"request")
    exchange(dialler, listener, 0.0)
    listener.deliver("reply", b"response")
    assert not listener.ack_pending
    reply = b"".join(listener.data_to_send(0.0))
    assert [kind for kind, _ in wire.Decoder(1 << 20).feed(reply)] == [wire.DELIVER]  # the ack is in it
    assert dialler.receive_data(reply, 0.0) == [Delivered("reply", b"response")]
    assert not dialler.unacked


def test_a_lost_link_hands_back_exactly_what_was_not_acked() -> None:
    dialler, listener = pair()
    dialler.deliver("ch", b"a")
    exchange(dialler, listener, 0.0)
    exchange(listener, dialler, 0.0)  # the ack of the first
    for data in (b"b", b"c"):
        dialler.deliver("ch", data)
    exchange(dialler, listener, 0.0)
    assert list(dialler.take_unacked()) == [("ch", b"b"), ("ch", b"c")]
    assert not dialler.unacked


def test_a_link_with_too_much_unacked_takes_no_more_frames() -> None:
    dialler, _ = pair()
    assert dialler.deliver("ch", b"x" * (WRITE_HIGH_WATER + 1))
    assert not dialler.deliver("ch", b"one more")  # through Redis instead
    assert len(dialler.unacked) == 1


def test_hints_and_sent_back_frames_reach_the_other_side_as_events() -> None:
    dialler, listener = pair()
    listener.hint("ch")
    listener.send_back("gone", b"frame")
    assert exchange(listener, dialler, 0.0) == [Hinted("ch"), SentBack("gone", b"frame")]


def test_a_quiet_side_pings_every_heartbeat_and_a_silent_one_is_dead() -> None:
    dialler, listener = pair()
    assert dialler.tick(HEARTBEAT / 2) is None
    assert not dialler.has_output
    assert dialler.tick(HEARTBEAT) is None
    assert kinds(dialler, HEARTBEAT) == [wire.PING]
    assert dialler.tick(HEARTBEAT * 1.5) is None
    assert not dialler.has_output

    assert listener.tick(DEAD_AFTER) is None  # silent exactly DEAD_AFTER: not yet
    assert listener.tick(DEAD_AFTER + 0.1) == "silent for 3.1 s"


def test_traffic_moves_the_deadline() -> None:
    dialler, listener = pair()
    dialler.deliver("ch", b"x")
    exchange(dialler, listener, 2.5)
    assert listener.tick(DEAD_AFTER + 1.0) is None  # heard from 1.5 s ago


def test_a_connection_that_never_authenticates_is_dead_after_the_deadline() -> None:
    listener = LinkState(wire.Accept(KEY, "listener", b"L" * wire.NONCE_SIZE), now=10.0, max_frame=1 << 20)
    listener.receive_data(b"\x00", 12.0)  # a trickle of bytes is no handshake
    assert listener.tick(10.0 + DEAD_AFTER) is None
    assert listener.tick(10.0 + DEAD_AFTER + 0.1) == f"no handshake within {DEAD_AFTER:g} s"
    assert kinds(listener, 12.0) == [wire.CHALLENGE]  # its challenge, never a PING


# -- every frame after the handshake is sealed: nothing on the path can add, change or repeat one ------


def sealed(state: LinkState, now: float = 0.0) -> list[bytes]:
    """What ``state`` writes, one sealed frame per item (as a host on the path sees them)."""
    data = b"".join(state.data_to_send(now))
    return [wire.encode(kind, body) for kind, body in wire.Decoder(1 << 20).feed(data)]


def test_every_frame_after_the_handshake_carries_a_number_and_a_mac() -> None:
    dialler, listener = pair()
    dialler.deliver("ch", b"data")
    [frame] = sealed(dialler)
    [(kind, body)] = wire.Decoder(1 << 20).feed(frame)
    assert kind == wire.DELIVER
    assert body[:16] == bytes(16)  # the first frame of this direction: number 0, and nothing to ack
    assert len(body) == 16 + len(wire.channel_head("ch")) + len(b"data") + link_seal.TAG_SIZE
    assert listener.receive_data(frame, 0.0) == [Delivered("ch", b"data")]


@pytest.mark.parametrize(
    "frame",
    [
        pytest.param(lambda: wire.deliver("ch", b"forged"), id="unsealed"),
        pytest.param(lambda: wire.encode(wire.DELIVER, bytes(16) + wire.channel_head("ch") + b"x" * 16), id="zero-mac"),
        pytest.param(lambda: wire.encode(wire.ACK, (99).to_bytes(8, "big")), id="unsealed-ack"),
        pytest.param(lambda: wire.encode(wire.PING, b""), id="unsealed-ping"),
    ],
)
def test_a_frame_not_sealed_by_the_other_side_is_refused(frame) -> None:
    dialler, listener = pair()
    with pytest.raises(ProtocolError, match="failed its MAC|too short to be sealed"):
        listener.receive_data(frame(), 0.0)
    assert listener.forged


def test_a_frame_changed_on_the_way_fails_its_mac() -> None:
    dialler, listener = pair()
    dialler.deliver("ch", b"pay 100")
    [frame] = sealed(dialler)
    for changed in (frame.replace(b"pay 100", b"pay 999"), frame[:-1] + bytes([frame[-1] ^ 1])):
        _, fresh = pair()
        with pytest.raises(ProtocolError, match="link frame 0 failed its MAC"):
            fresh.receive_data(changed, 0.0)
        assert fresh.forged == "link frame 0 failed its MAC: injected or altered on the way"


def test_a_frame_sent_again_is_refused_by_its_number() -> None:
    dialler, listener = pair()
    dialler.deliver("ch", b"transfer 1")
    [first] = sealed(dialler)
    assert listener.receive_data(first, 0.0) == [Delivered("ch", b"transfer 1")]
    with pytest.raises(ProtocolError, match="numbered 0 where 1 was due: replayed"):
        listener.receive_data(first, 0.0)


def test_frames_out_of_order_or_one_left_out_are_refused() -> None:
    dialler, listener = pair()
    for data in (b"one", b"two"):
        dialler.deliver("ch", data)
    _, two = sealed(dialler)
    with pytest.raises(ProtocolError, match="numbered 1 where 0 was due"):
        listener.receive_data(two, 0.0)  # the first held back (or dropped): the second is out of turn


def test_a_frame_sealed_on_another_link_or_sent_back_to_its_sender_fails_its_mac() -> None:
    dialler, listener = pair()
    other, _ = pair(listener_nonce=b"M" * wire.NONCE_SIZE)  # the same two replicas and secret, another link
    other.deliver("ch", b"from another link")  # number 0, as this link's first frame would be
    with pytest.raises(ProtocolError, match="failed its MAC"):
        listener.receive_data(b"".join(sealed(other)), 0.0)

    dialler.deliver("ch", b"reflected")
    with pytest.raises(ProtocolError, match="failed its MAC"):
        dialler.receive_data(b"".join(sealed(dialler)), 0.0)  # the dialler's own frame, back to it


def test_the_two_directions_and_two_links_have_four_different_keys() -> None:
    def keys(listener_nonce: bytes) -> tuple[bytes, bytes]:
        accept = wire.Accept(KEY, "listener", listener_nonce)
        dial = wire.Dial(KEY, "dialler", "listener", b"D" * wire.NONCE_SIZE)
        hello, _ = dial.step(wire.CHALLENGE, listener_nonce)
        [(kind, body)] = wire.Decoder(4096).feed(hello)
        welcome, _ = accept.step(kind, body)
        [(kind, body)] = wire.Decoder(4096).feed(welcome)
        dial.step(kind, body)
        assert accept.keys is not None
        assert dial.keys is not None
        assert accept.keys == (dial.keys[1], dial.keys[0])  # what one sends with, the other opens with
        return dial.keys

    first, second = keys(b"L" * wire.NONCE_SIZE), keys(b"M" * wire.NONCE_SIZE)
    assert len({*first, *second}) == 4
    assert KEY not in {*first, *second}


def test_each_deliver_is_numbered_as_its_replay_would_name_it() -> None:
    dialler, listener = pair()
    assert (dialler.send_id, dialler.receive_id) == (listener.receive_id, listener.send_id)
    assert dialler.send_id != dialler.receive_id
    for data in (b"a", b"b", b"c"):
        dialler.deliver("ch", data)
    assert [e.number for e in exchange(dialler, listener, 0.0) if isinstance(e, Delivered)] == [1, 2, 3]
    exchange(listener, dialler, 0.0)  # acks the three
    dialler.deliver("ch", b"d")
    dialler.deliver("ch", b"e")
    assert [e.number for e in exchange(dialler, listener, 0.0) if isinstance(e, Delivered)] == [4, 5]
    assert dialler.acked == 3  # the ack of the last two is still on its way
    assert [data for _, data in dialler.take_unacked()] == [b"d", b"e"], "the first unacked is number acked + 1"

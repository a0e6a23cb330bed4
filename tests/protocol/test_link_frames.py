"""Link frames between replicas: framing, the signed handshake, and the origin tag (no I/O)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from switchboard.errors import ProtocolError
from switchboard.protocol import link

SECRET = "s3cret"


def test_frames_survive_any_split_of_the_byte_stream() -> None:
    stream = (
        link.deliver("sb:client:ws/a", b"x" * 1000)
        + link.hint("sb:client:ws/b")
        + link.nack("c", b"")
    )
    for cut in range(1, len(stream)):
        decoder = link.Decoder(max_frame=4096)
        frames = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:])
        assert [kind for kind, _ in frames] == [link.DELIVER, link.HINT, link.NACK]
        assert link.split_channel(frames[0][1]) == ("sb:client:ws/a", b"x" * 1000)
        assert frames[1][1] == b"sb:client:ws/b"
        assert link.split_channel(frames[2][1]) == ("c", b"")


@given(st.text(max_size=50), st.binary(max_size=300))
def test_deliver_round_trips(channel: str, data: bytes) -> None:
    [(kind, body)] = link.Decoder(max_frame=1 << 20).feed(link.deliver(channel, data))
    assert kind == link.DELIVER
    assert link.split_channel(body) == (channel, data)


def test_a_frame_above_the_limit_is_refused_before_it_is_buffered() -> None:
    decoder = link.Decoder(max_frame=100)
    with pytest.raises(ProtocolError, match="at most 100"):
        decoder.feed(link.deliver("c", b"x" * 200)[:10])


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ProtocolError, match="unknown link frame kind 99"):
        link.Decoder(max_frame=100).feed(link.encode(99, b""))


def test_a_channel_length_beyond_the_body_is_refused() -> None:
    with pytest.raises(ProtocolError, match="shorter than its channel"):
        link.split_channel(b"\x00\x10abc")


# -- the handshake -----------------------------------------------------------------


def body_of(frame: bytes) -> bytes:
    [(_, body)] = link.Decoder(max_frame=1 << 20).feed(frame)
    return body


def test_a_hello_signed_with_the_shared_secret_names_its_replica() -> None:
    hello = body_of(link.hello(SECRET, "replica-a", 1000.0, "n1"))
    assert link.check_hello(SECRET, hello, now=1010.0).replica == "replica-a"


def test_a_hello_signed_with_another_secret_is_refused() -> None:
    hello = body_of(link.hello("guess", "replica-a", 1000.0, "n1"))
    with pytest.raises(ProtocolError, match="not signed"):
        link.check_hello(SECRET, hello, now=1000.0)


def test_a_hello_whose_replica_was_changed_is_refused() -> None:
    hello = body_of(link.hello(SECRET, "replica-a", 1000.0, "n1")).replace(
        b"replica-a", b"replica-b"
    )
    with pytest.raises(ProtocolError, match="not signed"):
        link.check_hello(SECRET, hello, now=1000.0)


def test_an_old_hello_cannot_be_replayed() -> None:
    hello = body_of(link.hello(SECRET, "replica-a", 1000.0, "n1"))
    with pytest.raises(ProtocolError, match="off this replica's clock"):
        link.check_hello(SECRET, hello, now=1000.0 + link.HELLO_MAX_SKEW + 1)


@pytest.mark.parametrize(
    "body",
    [b"", b"{", b"[]", b'{"replica": "a"}', b'{"replica":"a","ts":"x","nonce":"n","mac":"m"}'],
)
def test_a_malformed_hello_is_refused_with_a_clear_error(body: bytes) -> None:
    with pytest.raises(ProtocolError, match="malformed link HELLO"):
        link.check_hello(SECRET, body, now=0.0)


def test_the_welcome_is_bound_to_the_dialler_nonce() -> None:
    welcome = body_of(link.welcome(SECRET, "replica-b", "n1"))
    assert link.check_welcome(SECRET, welcome, "n1") == "replica-b"
    with pytest.raises(ProtocolError, match="not signed"):
        link.check_welcome(SECRET, welcome, "n2")  # a WELCOME recorded for another dial


# -- the origin tag on Redis messages ------------------------------------------------


def test_tag_and_untag_round_trip_even_without_an_origin() -> None:
    assert link.untag(link.tag("r1@10.0.0.1:4000", b"\x81frame")) == (
        "r1@10.0.0.1:4000",
        b"\x81frame",
    )
    assert link.untag(link.tag("", b"\x81frame")) == ("", b"\x81frame")


def test_a_truncated_tag_is_refused() -> None:
    with pytest.raises(ProtocolError):
        link.untag(b"\x20short")
    with pytest.raises(ProtocolError):
        link.untag(b"")


@pytest.mark.parametrize(
    ("origin", "parsed"),
    [
        ("r1@10.0.0.1:4000", ("r1", "10.0.0.1", 4000)),
        ("host-1-2@x@[::1]:9", ("host-1-2@x", "::1", 9)),
        ("", None),
        ("r1@10.0.0.1", None),
        ("@10.0.0.1:4000", None),
        ("r1@h:port", None),
    ],
)
def test_parse_origin(origin: str, parsed: tuple[str, str, int] | None) -> None:
    assert link.parse_origin(origin) == parsed

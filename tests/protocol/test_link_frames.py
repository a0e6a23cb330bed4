"""Link frames between replicas: framing, the signed handshake, and the origin tag (no I/O)."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from switchboard.errors import ProtocolError
from switchboard.protocol.link import link_wire as link
from switchboard.protocol.link import replica_wire

SECRET = "s3cret"


def test_frames_survive_any_split_of_the_byte_stream() -> None:
    stream = link.deliver("sb:client:ws/a", b"x" * 1000) + link.hint("sb:client:ws/b") + link.nack("c", b"")
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
#
# Driven by hand: a listener ``Accept`` and a dialler ``Dial`` pass frames to each
# other, as two replicas' sockets would. Replica a dials replica b.

KEY = link.link_key(SECRET)
NONCE_B, NONCE_A, NONCE_B2, NONCE_A2 = (bytes([i]) * link.NONCE_SIZE for i in range(1, 5))


def frame(data: bytes) -> tuple[int, bytes]:
    [(kind, body)] = link.Decoder(max_frame=link.HANDSHAKE_MAX_FRAME).feed(data)
    return kind, body


def listener(nonce: bytes = NONCE_B, replica: str = "replica-b", key: bytes = KEY) -> link.Accept:
    return link.Accept(key, replica, nonce)


def recorded_hello(dials: str = "replica-b", key: bytes = KEY) -> tuple[int, bytes]:
    """The HELLO replica a sent on one connection to ``dials``, as an eavesdropper saw it."""
    hello, peer = link.Dial(key, "replica-a", dials, NONCE_A).step(*frame(listener().first))
    assert peer is None
    return frame(hello)


def test_a_handshake_proves_each_side_to_the_other() -> None:
    accept, dial = listener(), link.Dial(KEY, "replica-a", "replica-b", NONCE_A)
    assert dial.first == b""  # the listener speaks first
    kind, body = frame(accept.first)
    assert (kind, body) == (link.CHALLENGE, NONCE_B)

    hello, peer = dial.step(kind, body)
    assert peer is None
    welcome, dialler = accept.step(*frame(hello))
    assert dialler == "replica-a"
    assert dial.step(*frame(welcome)) == (b"", "replica-b")


def test_a_hello_replayed_on_another_connection_is_refused() -> None:
    hello = recorded_hello()
    with pytest.raises(ProtocolError, match="does not answer this connection's challenge"):
        listener(NONCE_B2).step(*hello)  # the same listener, a new connection: a new challenge


def test_a_connection_gets_one_hello() -> None:
    accept, dial = listener(), link.Dial(KEY, "intruder", "replica-b", NONCE_A)
    wrong, _ = dial.step(*frame(accept.first))
    with pytest.raises(ProtocolError):
        accept.step(*frame(wrong[:-1] + b"x"))
    with pytest.raises(ProtocolError, match="HELLO before the link was authenticated"):
        accept.step(*recorded_hello())  # no second try on the same challenge


def test_a_hello_meant_for_another_replica_is_refused() -> None:
    accept_c = listener(replica="replica-c")  # c now listens where the route said b was
    hello, _ = link.Dial(KEY, "replica-a", "replica-b", NONCE_A).step(*frame(accept_c.first))
    with pytest.raises(ProtocolError, match="does not answer"):
        accept_c.step(*frame(hello))


def old_scheme_hello() -> tuple[int, bytes]:
    """A HELLO as replicas signed it before: JSON, an HMAC with the raw secret, a timestamp."""
    ts, nonce = 1000.0, "n1"
    msg = "|".join(("switchboard-link", "hello", "replica-a", repr(ts), nonce)).encode()
    mac = hmac.new(SECRET.encode(), msg, hashlib.sha256).hexdigest()
    body = json.dumps({"replica": "replica-a", "ts": ts, "nonce": nonce, "mac": mac}).encode()
    return link.HELLO, body


@pytest.mark.parametrize(
    "hello",
    [
        pytest.param(lambda: recorded_hello(key=SECRET.encode()), id="raw-secret-as-key"),
        pytest.param(old_scheme_hello, id="old-json-hello"),
        pytest.param(lambda: recorded_hello(key=link.link_key("guess")), id="another-secret"),
    ],
)
def test_a_hello_not_signed_with_the_derived_key_is_refused(hello) -> None:
    with pytest.raises(ProtocolError, match="HELLO"):
        listener().step(*hello())


def test_a_hello_whose_replica_was_changed_is_refused() -> None:
    kind, body = recorded_hello()
    with pytest.raises(ProtocolError, match="does not answer"):
        listener().step(kind, body.replace(b"replica-a", b"replica-z"))


@pytest.mark.parametrize("body", [b"", b"x" * 64, b"x" * 64 + b"\xff\xfe"])
def test_a_malformed_hello_is_refused_with_a_clear_error(body: bytes) -> None:
    with pytest.raises(ProtocolError, match="malformed link HELLO"):
        listener().step(link.HELLO, body)


@pytest.mark.parametrize("kind", [link.DELIVER, link.HINT, link.WELCOME, link.CHALLENGE, link.PING])
def test_the_listener_takes_nothing_but_a_hello_first(kind: int) -> None:
    with pytest.raises(ProtocolError, match="before the link was authenticated"):
        listener().step(kind, b"")


def test_the_welcome_proves_the_listener_holds_the_key_for_this_dial() -> None:
    def dial() -> tuple[link.Dial, bytes]:
        d = link.Dial(KEY, "replica-a", "replica-b", NONCE_A2)
        hello, _ = d.step(link.CHALLENGE, NONCE_B)
        return d, hello

    d, hello = dial()
    welcome, _ = listener().step(*frame(hello))
    assert d.step(*frame(welcome)) == (b"", "replica-b")

    recorded = frame(link.welcome(KEY, NONCE_B, "replica-a", "replica-b", NONCE_A))  # another dial's
    forged = frame(link.welcome(link.link_key("guess"), NONCE_B, "replica-a", "replica-b", NONCE_A2))
    from_c = frame(link.welcome(KEY, NONCE_B, "replica-a", "replica-c", NONCE_A2))  # not whom we dialled
    reflected = (link.WELCOME, frame(hello)[1])  # our own HELLO sent back
    for bad in (recorded, forged, from_c, reflected):
        with pytest.raises(ProtocolError, match="WELCOME not signed"):
            dial()[0].step(*bad)


@pytest.mark.parametrize(
    ("kind", "body"),
    [(link.WELCOME, b"x" * 32), (link.DELIVER, b""), (link.CHALLENGE, b"short")],
)
def test_the_dialler_takes_a_challenge_then_a_welcome_and_nothing_else(kind: int, body: bytes) -> None:
    with pytest.raises(ProtocolError, match="before the link was authenticated|malformed link CHALLENGE"):
        link.Dial(KEY, "replica-a", "replica-b", NONCE_A).step(kind, body)


@pytest.mark.parametrize(
    ("ikm", "salt", "info", "okm"),
    [
        (  # RFC 5869, A.1
            bytes([0x0B] * 22),
            bytes(range(0x0D)),
            bytes(range(0xF0, 0xFA)),
            "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865",
        ),
        (  # RFC 5869, A.2: longer inputs, an output of three blocks
            bytes(range(0x00, 0x50)),
            bytes(range(0x60, 0xB0)),
            bytes(range(0xB0, 0x100)),
            "b11e398dc80327a1c8e7f78c596a49344f012eda2d4efad8a050cc4c19afa97c59045a99cac7827271cb41c65e590e09da3275600c2f09b8367793a9aca3db71cc30c58179ec3e87c14c01d5c1f3434f1d87",
        ),
        (  # RFC 5869, A.3: no salt, no info
            bytes([0x0B] * 22),
            b"",
            b"",
            "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8",
        ),
    ],
)
def test_hkdf_matches_rfc_5869(ikm: bytes, salt: bytes, info: bytes, okm: str) -> None:
    assert link.hkdf_sha256(ikm, info, len(okm) // 2, salt).hex() == okm


def test_the_link_key_is_derived_from_the_secret_not_the_secret_itself() -> None:
    assert link.hkdf_sha256(SECRET.encode(), b"switchboard link v3") == KEY
    assert KEY not in (SECRET.encode(), link.link_key("another secret"))


def test_the_link_key_of_a_secret_is_the_same_bytes_in_every_release() -> None:
    """Replicas of two releases share links during a rolling upgrade only if they derive the same key:
    pinned here (HKDF-SHA256 of the secret, no salt, info ``switchboard link v3``)."""
    assert link.link_key(SECRET).hex() == "2bafbbaeea09a78fa0a2218e5f92f901a49afbf73a60239629caee007ac0e091"
    up, down = link.session_keys(KEY, NONCE_B, "replica-a", "replica-b", NONCE_A)
    assert up.hex() == "e7fa15b8e2b7e7f550acd8b12b1ae4171c3aebc58f8a03c9ef894ead8952c8a3"
    assert down != up


# -- the origin tag on Redis messages ------------------------------------------------


def test_tag_and_untag_round_trip_even_without_an_origin() -> None:
    assert replica_wire.untag(replica_wire.tag("r1@10.0.0.1:4000", b"\x81frame")) == (
        "r1@10.0.0.1:4000",
        b"\x81frame",
    )
    assert replica_wire.untag(replica_wire.tag("", b"\x81frame")) == ("", b"\x81frame")


def test_a_truncated_tag_is_refused() -> None:
    with pytest.raises(ProtocolError):
        replica_wire.untag(b"\x20short")
    with pytest.raises(ProtocolError):
        replica_wire.untag(b"")


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

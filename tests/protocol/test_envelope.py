"""The binary envelope (protocol §3.1, §3.2, §3.5): decode, stamp, route, reject.

Pure functions, driven synchronously: bytes in, values or ``ProtocolError`` out.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from switchboard.errors import EncryptedPayload, ProtocolError
from switchboard.protocol.hypha.envelope import (
    Envelope,
    Route,
    decode,
    encode,
    identity,
    reject_frame,
    route,
    stamp,
)

MANAGER = "manager-X"
WS = "ws1"


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpack_all(frame: bytes) -> list[Any]:
    """Every msgpack object in ``frame``, the way a hypha-rpc client reads it."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=True)
    unpacker.feed(frame)
    return list(unpacker)


HEADER = {"type": "method", "to": "ws1/cB", "method": "services.svc.fn", "session": "s1"}
PAYLOAD = pack({"args": [b"\x00\xff" * 100, {"x": 1}], "promise": "*", "t": 15.0})


# -- decode ------------------------------------------------------------------


class TestDecode:
    def test_splits_header_and_payload(self) -> None:
        env = decode(pack(HEADER) + PAYLOAD)

        assert env.main == HEADER
        assert env.type == "method"
        assert env.session == "s1"

    def test_payload_bytes_are_identical(self) -> None:
        env = decode(pack(HEADER) + PAYLOAD)

        assert bytes(env.rest) == PAYLOAD

    def test_payload_is_not_decoded(self) -> None:
        # The router never looks inside ``extra``: even bytes that are not
        # msgpack at all pass through untouched.
        garbage = b"\xc1\xc1not msgpack\x00"
        env = decode(pack(HEADER) + garbage)

        assert bytes(env.rest) == garbage

    def test_header_only_frame_has_empty_payload(self) -> None:
        env = decode(pack({"type": "ping"}))

        assert bytes(env.rest) == b""
        assert env.session is None

    def test_empty_session_counts_as_none(self) -> None:
        env = decode(pack({"type": "method", "session": ""}))

        assert env.session is None

    def test_accepts_a_large_payload(self) -> None:
        payload = pack({"args": [b"\x07" * (10 * 1024 * 1024)]})
        env = decode(pack(HEADER) + payload)

        assert bytes(env.rest) == payload


class TestDecodeErrors:
    @pytest.mark.parametrize(
        ("frame", "message"),
        [
            pytest.param(b"", "empty binary frame", id="empty"),
            pytest.param(pack(HEADER)[:-3], "truncated msgpack frame", id="truncated"),
            pytest.param(b"\x81", "truncated msgpack frame", id="truncated-map"),
            pytest.param(b"\xc1", "not valid msgpack", id="never-used-byte"),
            pytest.param(b"\x91" * 5000, "not valid msgpack", id="too-deep"),
            pytest.param(b"\xd4\xff\x00", "not valid msgpack", id="bad-timestamp"),
            pytest.param(pack([1, 2]), "header must be a map, got list", id="array-header"),
            pytest.param(pack("method"), "header must be a map, got str", id="str-header"),
            pytest.param(pack(None), "header must be a map, got NoneType", id="nil-header"),
            pytest.param(pack({"to": "ws1/cB"}), "no 'type' string", id="missing-type"),
            pytest.param(pack({"type": ""}), "no 'type' string", id="empty-type"),
            pytest.param(pack({"type": 1}), "no 'type' string", id="int-type"),
            pytest.param(pack({"type": "method", "to": 3}), "'to' must be a string, got int", id="int-to"),
            pytest.param(
                pack({"type": "method", "to": ["a"]}),
                "'to' must be a string, got list",
                id="list-to",
            ),
            pytest.param(
                pack({"type": "method", "session": b"s"}),
                "'session' must be a string, got bytes",
                id="bin-session",
            ),
            pytest.param(pack({"type": "method", 1: "x"}), "int is not allowed for map key", id="int-key"),
            pytest.param(
                pack({"type": "method", "nested": {2: "x"}}),
                "int is not allowed for map key",
                id="int-key-nested",
            ),
        ],
    )
    def test_refuses_with_a_clear_message(self, frame: bytes, message: str) -> None:
        with pytest.raises(ProtocolError, match=message):
            decode(frame)

    def test_non_msgpack_bytes(self) -> None:
        with pytest.raises(ProtocolError, match="not valid msgpack"):
            decode(b"\xc1GET / HTTP/1.1\r\n")

    def test_bytes_map_key_is_refused(self) -> None:
        with pytest.raises(ProtocolError):
            decode(pack({"type": "method", b"to": "ws1/cB"}))


# -- stamp -------------------------------------------------------------------


class TestStamp:
    USER = {"id": "u1", "roles": [], "is_anonymous": False}

    def stamped(self, main: dict[str, Any], rest: bytes = b"") -> list[Any]:
        env = decode(encode(main, rest))
        frame = stamp(env, identity=identity("ws1/cA", "ws1", self.USER), to="ws1/cB")
        return unpack_all(frame)

    def test_overwrites_forged_trusted_fields(self) -> None:
        forged = {
            "type": "method",
            "from": "*/manager-X",
            "ws": "admin-ws",
            "user": {"id": "root", "roles": ["admin"]},
            "to": "cB",
            "method": "services.svc.fn",
        }
        [main] = self.stamped(forged)

        assert main["from"] == "ws1/cA"
        assert main["ws"] == "ws1"
        assert main["user"] == self.USER
        assert main["to"] == "ws1/cB"

    def test_adds_trusted_fields_when_absent(self) -> None:
        [main] = self.stamped({"type": "method", "to": "cB"})

        assert (main["from"], main["ws"], main["user"], main["to"]) == (
            "ws1/cA",
            "ws1",
            self.USER,
            "ws1/cB",
        )

    def test_keeps_other_header_fields(self) -> None:
        [main] = self.stamped({**HEADER, "parent": "p0"})

        assert main["method"] == "services.svc.fn"
        assert main["session"] == "s1"
        assert main["parent"] == "p0"

    def test_appends_payload_bytes_unchanged(self) -> None:
        env = decode(pack(HEADER) + PAYLOAD)
        frame = stamp(env, identity=identity("ws1/cA", "ws1", self.USER), to="ws1/cB")

        assert frame.endswith(PAYLOAD)
        head = decode(frame)
        assert bytes(head.rest) == PAYLOAD
        assert frame[: len(frame) - len(PAYLOAD)] == pack(head.main)

    def test_header_only_message_stays_one_object(self) -> None:
        assert len(self.stamped({"type": "method", "to": "cB"})) == 1

    @pytest.mark.parametrize("where", ["header", "payload"])
    def test_a_sealed_message_is_refused_unless_encrypted_payloads_are_allowed(self, where: str) -> None:
        """hypha-rpc opens ``{"_enc", "data"}`` found in either object and merges what is inside over the
        message, context included: the hub cannot read it, so by default it does not pass."""
        box = {"_enc": {"v": 2, "pub": b"k" * 32, "nonce": b"n" * 24}, "data": b"sealed"}
        main = {"type": "method", "to": "cB", **(box if where == "header" else {})}
        rest = pack({"args": [], **(box if where == "payload" else {})})
        who = identity("ws1/cA", "ws1", self.USER)

        with pytest.raises(EncryptedPayload, match="--allow-encrypted-payloads"):
            stamp(decode(encode(main, rest)), identity=who, to="ws1/cB")
        frame = stamp(decode(encode(main, rest)), identity=who, to="ws1/cB", allow_encrypted=True)
        assert "_enc" in unpack_all(frame)[0 if where == "header" else 1]


# -- route (§3.5 rule 2) -------------------------------------------------------


class TestRoute:
    @pytest.mark.parametrize(
        ("to", "expected"),
        [
            pytest.param("*", Route("broadcast", "ws1/*", "ws1"), id="star-is-broadcast-in-own-ws"),
            pytest.param("cB", Route("client", "ws1/cB", "ws1"), id="bare-cid-is-own-ws"),
            pytest.param("ws1/cB", Route("client", "ws1/cB", "ws1"), id="ws-cid-same-ws"),
            pytest.param("ws2/cB", Route("client", "ws2/cB", "ws2"), id="ws-cid-other-ws"),
            pytest.param("*/manager-X", Route("manager", "*/manager-X", "*"), id="manager"),
            pytest.param("*/manager-old", Route("nowhere", "*/manager-old", "*"), id="stale-manager"),
            pytest.param("*/x", Route("nowhere", "*/x", "*"), id="star-is-no-workspace-of-a-client"),
            pytest.param("ws2/manager-X", Route("manager", "ws2/manager-X", "ws2"), id="manager-named-in-a-workspace"),
            pytest.param("ws1/*", Route("broadcast", "ws1/*", "ws1"), id="ws-star-own"),
            pytest.param("ws2/*", Route("broadcast", "ws2/*", "ws2"), id="ws-star-other"),
        ],
    )
    def test_normalisation(self, to: str, expected: Route) -> None:
        assert route(to, sender_workspace=WS, manager_id=MANAGER) == expected

    def test_manager_id_is_the_one_given(self) -> None:
        assert route("*/m2", sender_workspace=WS, manager_id="m2").kind == "manager"
        assert route("*/m2", sender_workspace=WS, manager_id=MANAGER).kind == "nowhere"

    @pytest.mark.parametrize(
        ("to", "message"),
        [
            pytest.param(None, "no 'to' target", id="none"),
            pytest.param("", "no 'to' target", id="empty"),
            pytest.param("/x", "expected '<workspace>/<client_id>'", id="no-ws"),
            pytest.param("ws/", "expected '<workspace>/<client_id>'", id="no-cid"),
            pytest.param("/", "expected '<workspace>/<client_id>'", id="slash"),
            pytest.param("a/b/c", "expected '<workspace>/<client_id>'", id="two-slashes"),
            pytest.param("a:b", "client ids are letters", id="colon"),
            pytest.param("*/x*", "ids are letters", id="glob-after-star"),
            pytest.param("ws-*/x", "ids are letters", id="glob-workspace"),
        ],
    )
    def test_malformed_targets(self, to: str | None, message: str) -> None:
        with pytest.raises(ProtocolError, match=message):
            route(to, sender_workspace=WS, manager_id=MANAGER)

    def test_error_names_the_target(self) -> None:
        with pytest.raises(ProtocolError, match="'a/b/c'"):
            route("a/b/c", sender_workspace=WS, manager_id=MANAGER)


# -- reject_frame (§3.5 "Unknown or dead target") -----------------------------


class TestRejectFrame:
    def test_is_a_session_reject_with_an_error_arg(self) -> None:
        target = route("cGone", sender_workspace=WS, manager_id=MANAGER).target
        frame = reject_frame(
            session="sess-1",
            target=target,
            caller="ws1/cA",
            message="Target peer ws1/cGone is not connected",
        )

        main, extra = unpack_all(frame)
        assert main["type"] == "method"
        assert main["method"] == "sess-1.reject"
        assert main["to"] == "ws1/cA"
        assert main["ws"] == "ws1"
        assert "/" in main["from"]
        assert main["from"] == "ws1/cGone"
        assert "session" not in main  # a reply is fire-and-forget
        [error] = extra["args"]
        assert error["_rtype"] == "error"
        assert error["_rvalue"] == "Target peer ws1/cGone is not connected"

    def test_is_itself_a_valid_envelope(self) -> None:
        frame = reject_frame(session="s.child", target="ws2/cB", caller="ws1/cA", message="gone")

        env = decode(frame)
        assert env.type == "method"
        assert env.main["method"] == "s.child.reject"
        assert msgpack.unpackb(bytes(env.rest))["args"][0]["_rvalue"] == "gone"

    def test_manager_caller(self) -> None:
        main, _ = unpack_all(reject_frame(session="s", target="ws1/cB", caller="*/manager-X", message="gone"))

        assert main["to"] == "*/manager-X"
        assert main["from"] == "ws1/cB"


# -- properties ------------------------------------------------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_RESERVED = {"type", "to", "session"}


@st.composite
def headers(draw: st.DrawFn) -> dict[str, Any]:
    main = draw(st.dictionaries(st.text(max_size=10).filter(lambda k: k not in _RESERVED), _values, max_size=6))
    main["type"] = draw(st.text(min_size=1, max_size=20))
    for key in ("to", "session"):
        value = draw(st.none() | st.text(max_size=30))
        if value is not None:
            main[key] = value
    return main


@st.composite
def mangled_frames(draw: st.DrawFn) -> bytes:
    """A valid frame, then truncated, extended or with a few bytes overwritten."""
    frame = bytearray(encode(draw(headers()), draw(st.binary(max_size=40))))
    cut = draw(st.integers(min_value=0, max_value=len(frame)))
    frame = frame[:cut] + draw(st.binary(max_size=8))
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        if frame:
            frame[draw(st.integers(0, len(frame) - 1))] = draw(st.integers(0, 255))
    return bytes(frame)


@settings(max_examples=300, deadline=None)
@given(frame=st.binary(max_size=200) | mangled_frames())
def test_decode_returns_an_envelope_or_raises_protocol_error(frame: bytes) -> None:
    try:
        env = decode(frame)
    except ProtocolError:
        return
    assert isinstance(env, Envelope)
    assert isinstance(env.main, dict)
    assert isinstance(env.type, str)
    assert env.type
    assert frame.endswith(bytes(env.rest))


@settings(max_examples=300, deadline=None)
@given(main=headers(), rest=st.binary(max_size=300))
def test_decode_inverts_encode(main: dict[str, Any], rest: bytes) -> None:
    env = decode(encode(main, rest))

    assert env.main == main
    assert bytes(env.rest) == rest


@pytest.mark.parametrize("fields", [0, 12, 13, 16, 300])
def test_a_stamped_header_of_any_size_reads_back_with_the_identity_and_every_field(fields: int) -> None:
    """The identity's packed entries are spliced after the sender's own: the map's count covers
    them whether the header is a fixmap, a map16 or grows from one into the other."""
    main = {"type": "method", "to": "cB", **{f"f{i}": i for i in range(fields)}, "from": "forged"}
    env = decode(encode(main, PAYLOAD))
    frame = stamp(env, identity=identity("ws1/cA", "ws1", {"id": "u1"}), to="ws1/cB")
    head = decode(frame)
    assert head.main == {
        "type": "method",
        "to": "ws1/cB",
        **{f"f{i}": i for i in range(fields)},
        "from": "ws1/cA",
        "ws": "ws1",
        "user": {"id": "u1"},
    }
    assert bytes(head.rest) == PAYLOAD
    assert env.main == head.main  # left holding the stamped fields, as the manager's chunk assembly reads them


def test_a_forged_identity_does_not_travel_at_all_not_even_shadowed() -> None:
    """The sender's own ``from``/``ws``/``user`` are dropped, not merely followed by the hub's: a
    decoder that keeps the first of two equal keys must read the hub's identity too."""
    forged = {"type": "method", "to": "cB", "from": "ws9/forged", "ws": "ws9", "user": {"id": "forged"}}
    frame = stamp(decode(encode(forged, PAYLOAD)), identity=identity("ws1/cA", "ws1", {"id": "u1"}), to="ws1/cB")
    assert b"forged" not in frame
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(frame)
    keys = []
    for _ in range(unpacker.read_map_header()):
        keys.append(unpacker.unpack())
        unpacker.skip()
    assert sorted(keys) == ["from", "to", "type", "user", "ws"]  # each once

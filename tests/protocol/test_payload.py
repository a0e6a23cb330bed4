"""The payload check: a message's second object may not set what the hub stamps.

hypha-rpc reads a message as ``main.update(extra)``, so every property here
is stated against msgpack's own unpacker as the oracle: whatever the walk
says about a stream, the real decoder must agree.
"""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from switchboard.errors import EncryptedPayload, PermissionDenied, ProtocolError
from switchboard.protocol.hypha.payload import ENCRYPTED, RESERVED, SMALL_PAYLOAD, Scanner, check_extra

KEYS = st.sampled_from(sorted(RESERVED) + ["args", "with_kwargs", "t", "_enc", "data", "x" * 20])
LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=40),
    st.binary(max_size=300),
    st.just(b"b" * 70_000),
)
VALUES = st.recursive(
    LEAVES,
    lambda inner: st.lists(inner, max_size=8) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=20,
)
PAYLOADS = st.dictionaries(KEYS, VALUES, max_size=6)
CALLBACK = st.fixed_dictionaries(
    {
        "_rtype": st.just("method"),
        "_rtarget": st.text(max_size=30),
        "_rmethod": st.text(max_size=30),
    }
)
PROMISES = st.one_of(
    st.just("*"),
    st.none(),
    st.dictionaries(st.sampled_from(["resolve", "reject", "heartbeat", "interval"]), CALLBACK),
)


def pack(obj: object) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def cut(data: bytes, sizes: list[int]) -> list[bytes]:
    pieces, pos = [], 0
    for size in sizes:
        pieces.append(data[pos : pos + size])
        pos += size
    pieces.append(data[pos:])
    return pieces


class TestOneFrame:
    @settings(max_examples=200, deadline=None)
    @given(payload=PAYLOADS)
    def test_a_payload_passes_exactly_when_it_sets_no_header_key_and_is_not_sealed(self, payload: dict) -> None:
        if RESERVED & set(payload):
            with pytest.raises(ProtocolError, match="the hub sets who sent a message"):
                check_extra(memoryview(pack(payload)), sender="W/alice", allow_encrypted=True)
        elif ENCRYPTED in payload:
            with pytest.raises(EncryptedPayload, match="--allow-encrypted-payloads"):
                check_extra(memoryview(pack(payload)), sender="W/alice")
            check_extra(memoryview(pack(payload)), sender="W/alice", allow_encrypted=True)
        else:
            check_extra(memoryview(pack(payload)), sender="W/alice")

    @pytest.mark.parametrize("bulk", [0, SMALL_PAYLOAD, 1 << 20], ids=["small", "medium", "large"])
    @pytest.mark.parametrize("many", [False, True], ids=["bytes", "many-values"])
    def test_an_encrypted_payload_is_refused_unless_allowed_behind_any_amount_of_payload(
        self, bulk: int, many: bool
    ) -> None:
        """hypha-rpc's sealed payload: its callee merges the box's fields, ctx included, over the message."""
        args = [0] * (bulk // 8) if many else [b"x" * bulk]
        payload = pack({"args": args, "_enc": {"v": 2, "pub": b"k" * 32, "nonce": b"n" * 24}, "data": b"box"})

        with pytest.raises(EncryptedPayload, match="--allow-encrypted-payloads"):
            check_extra(memoryview(payload), sender="W/alice")
        check_extra(memoryview(payload), sender="W/alice", allow_encrypted=True)

    @pytest.mark.parametrize("key", sorted(RESERVED))
    @pytest.mark.parametrize("bulk", [0, SMALL_PAYLOAD, 1 << 20], ids=["small", "medium", "large"])
    def test_each_header_key_is_refused_behind_any_amount_of_payload(self, key: str, bulk: int) -> None:
        payload = pack({"args": [b"x" * bulk], key: "W/victim"})

        with pytest.raises(ProtocolError, match=key):
            check_extra(memoryview(payload), sender="W/alice")

    @pytest.mark.parametrize(
        ("rest", "reason"),
        [
            (pack([["from", "W/victim"]]), "must be a msgpack map"),  # dict.update takes pairs too
            (pack({"args": []}) + pack({"from": "W/victim"}), "unexpected data after"),
            (pack({"args": [b"x" * 5000]})[:-10], "truncated"),
            (b"\xc1", "not valid msgpack"),
        ],
        ids=["list-of-pairs", "third-object", "truncated", "never-used-byte"],
    )
    def test_anything_but_one_map_is_refused(self, rest: bytes, reason: str) -> None:
        with pytest.raises(ProtocolError, match=reason):
            check_extra(memoryview(rest), sender="W/alice")

    def test_a_payload_of_a_million_tiny_values_is_checked_at_c_speed(self) -> None:
        check_extra(memoryview(pack({"args": [None] * 1_000_000})), sender="W/alice")
        with pytest.raises(ProtocolError, match="ctx"):
            check_extra(memoryview(pack({"args": [None] * 1_000_000, "ctx": {}})), sender="W/alice")

    @pytest.mark.parametrize("bulk", [0, SMALL_PAYLOAD, 1 << 20], ids=["small", "medium", "large"])
    @pytest.mark.parametrize("many", [False, True], ids=["walked", "c-unpacker"])
    def test_a_promise_may_send_the_answer_only_to_the_caller(self, bulk: int, many: bool) -> None:
        args = [None] * 10_000 if many else [b"x" * bulk]
        own = {"_rtype": "method", "_rtarget": "W/alice", "_rmethod": "s1.resolve"}
        third = {"_rtype": "method", "_rtarget": "W/provider", "_rmethod": "services.prot.act"}
        check_extra(
            memoryview(pack({"args": args, "promise": {"resolve": own, "reject": own}})),
            sender="W/alice",
        )

        with pytest.raises(PermissionDenied, match="only to its caller W/alice, not W/provider"):
            check_extra(
                memoryview(pack({"args": args, "promise": {"resolve": own, "reject": third}})),
                sender="W/alice",
            )

    def test_values_that_look_like_keys_are_only_values(self) -> None:
        check_extra(
            memoryview(pack({"args": ["from", {"from": "W/x", "ctx": 1}], "promise": "*"})),
            sender="W/alice",
        )


class TestStream:
    @settings(max_examples=200, deadline=None)
    @given(
        header=st.dictionaries(KEYS, VALUES, max_size=4),
        payload=PAYLOADS,
        sizes=st.lists(st.integers(1, 3000), max_size=12),
    )
    def test_cut_anywhere_the_walk_finds_the_same_keys(self, header: dict, payload: dict, sizes: list[int]) -> None:
        scanner = Scanner(objects=2, payload=1)
        for piece in cut(pack(header) + pack(payload), sizes):
            scanner.feed(piece)

        assert scanner.complete
        assert scanner.found == (RESERVED & set(payload)) | ({ENCRYPTED} & (set(header) | set(payload)))

    @settings(max_examples=200, deadline=None)
    @given(
        before=PAYLOADS,
        promise=PROMISES,
        after=PAYLOADS,
        sizes=st.lists(st.integers(1, 200), max_size=30),
    )
    def test_cut_anywhere_the_promise_comes_out_whole(
        self, before: dict, promise: object, after: dict, sizes: list[int]
    ) -> None:
        payload = {
            **before,
            "promise": promise,
            **{k: v for k, v in after.items() if k != "promise"},
        }
        scanner = Scanner(objects=2, payload=1)
        for piece in cut(pack({"type": "method", "promise": "header's"}) + pack(payload), sizes):
            scanner.feed(piece)

        assert scanner.complete
        assert scanner.promise == pack(promise)

    def test_a_promise_too_large_to_be_one_is_refused(self) -> None:
        scanner = Scanner(objects=1, payload=0)
        with pytest.raises(ProtocolError, match="promise may take at most"):
            scanner.feed(pack({"promise": {"resolve": "x" * 70_000}}))

    def test_keys_of_the_header_are_not_the_payloads(self) -> None:
        scanner = Scanner(objects=2, payload=1)
        scanner.feed(pack({"type": "method", "from": "a/b"}) + pack({"args": []}))

        assert scanner.complete
        assert scanner.found == set()

    def test_a_sealed_header_is_found_too_since_hypha_rpc_merges_both(self) -> None:
        scanner = Scanner(objects=2, payload=1)
        scanner.feed(pack({"type": "method", "_enc": {"v": 2}, "data": b"box"}) + pack({"args": []}))

        assert scanner.found == {ENCRYPTED}

    def test_a_message_without_payload_is_complete_after_its_header(self) -> None:
        scanner = Scanner(objects=2, payload=1)
        scanner.feed(pack({"type": "method"}))

        assert scanner.complete

    def test_half_a_message_is_not_complete(self) -> None:
        scanner = Scanner(objects=2, payload=1)
        scanner.feed((pack({"type": "method"}) + pack({"args": [b"x" * 1000]}))[:-5])

        assert not scanner.complete

    def test_nesting_deeper_than_msgpack_allows_is_refused(self) -> None:
        scanner = Scanner(objects=1, payload=0)
        with pytest.raises(ProtocolError, match="nested deeper"):
            scanner.feed(b"\x81\xa1a" + b"\x91" * 1000 + b"\xc0")

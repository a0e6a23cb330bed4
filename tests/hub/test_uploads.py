"""Chunked messages on their way to one receiver: owned, bounded, walked in order, forgotten.

A stranger must not write into, take over, fill or outlast another sender's
message, and a message whose payload would set who sent it never completes.
Time is a FakeClock: the idle expiry is exact and nothing really waits.
"""

from __future__ import annotations

import msgpack
import pytest

from switchboard.errors import LimitExceeded, PermissionDenied, ProtocolError
from switchboard.hub.routing.uploads import Receivers, Uploads
from switchboard.protocol.hypha.chunks import parse_cache_call
from switchboard.protocol.hypha.payload import foreign_targets
from switchboard.testing import FakeClock

ALICE, MALLORY = "W/alice", "X/mallory"


def message(extra: dict, size: int = 0) -> bytes:
    main = msgpack.packb({"type": "method", "to": "W/bob", "method": "services.s.f"})
    return main + msgpack.packb({**extra, "args": [b"x" * size]})


def pieces(data: bytes, n: int) -> list[bytes]:
    step = -(-len(data) // n)
    return [data[i : i + step] for i in range(0, len(data), step)]


def uploads(clock: FakeClock | None = None, *, keep: bool = False, max_bytes: int = 1 << 20) -> Uploads:
    return Uploads(clock=clock or FakeClock(), keep=keep, max_bytes=max_bytes, max_uploads=4, idle_timeout=60)


class TestOneSender:
    def test_pieces_in_order_complete_a_clean_message(self) -> None:
        ups = uploads(keep=True)
        data = message({"with_kwargs": False}, 10_000)
        ups.create(ALICE, "k")
        for piece in pieces(data, 5):
            ups.add(ALICE, "k", None, piece)

        assert ups.finish(ALICE, "k") == data
        assert len(ups) == 0
        assert ups.held_bytes == 0

    def test_pieces_out_of_order_are_held_until_their_turn(self) -> None:
        ups = uploads()
        parts = pieces(message({}, 10_000), 4)
        ups.create(ALICE, "k")
        for index in (2, 3, 1):
            ups.add(ALICE, "k", index, parts[index])
        assert ups.held_bytes == sum(len(p) for p in parts[1:])

        ups.add(ALICE, "k", 0, parts[0])

        assert ups.held_bytes == 0
        assert ups.finish(ALICE, "k") is None  # not kept: the receiver joins them itself

    @pytest.mark.parametrize("key", ["from", "ctx", "ws", "user"])
    def test_a_payload_that_sets_identity_never_completes(self, key: str) -> None:
        ups = uploads()
        ups.create(ALICE, "k")
        for piece in pieces(message({key: "W/victim"}, 5000), 3):
            ups.add(ALICE, "k", None, piece)

        with pytest.raises(ProtocolError, match=key):
            ups.finish(ALICE, "k")
        assert len(ups) == 0

    def test_a_missing_piece_leaves_the_message_incomplete(self) -> None:
        ups = uploads()
        parts = pieces(message({}, 5000), 3)
        ups.create(ALICE, "k")
        ups.add(ALICE, "k", 0, parts[0])
        ups.add(ALICE, "k", 2, parts[2])

        with pytest.raises(ProtocolError, match="incomplete"):
            ups.finish(ALICE, "k")

    def test_a_piece_sent_twice_is_refused(self) -> None:
        ups = uploads()
        ups.create(ALICE, "k")
        ups.add(ALICE, "k", 0, b"\x80")

        with pytest.raises(ProtocolError, match="came twice"):
            ups.add(ALICE, "k", 0, b"\x80")


class TestTheJoinedHeader:
    """The header inside a joined message passes the rules of any header: hypha-rpc fires its ``type``."""

    @staticmethod
    def joined(main: bytes, extra: dict, *, cut: int) -> None:
        ups = uploads()
        ups.create(ALICE, "k")
        data = main + msgpack.packb({**extra, "args": [b"x" * 100]})
        for start in range(0, len(data), cut):
            ups.add(ALICE, "k", None, data[start : start + cut])
        ups.finish(ALICE, "k")

    @pytest.mark.parametrize("event", ["peer_not_found", "client_disconnected", "force-exit"])
    @pytest.mark.parametrize("cut", [1, 3, 1000], ids=["byte-by-byte", "3-byte-pieces", "one-piece"])
    def test_a_server_event_type_never_completes_wherever_the_pieces_cut_it(self, event: str, cut: int) -> None:
        main = msgpack.packb({"to": "W/bob", "type": event, "peer_id": "W/prov"})
        with pytest.raises(ProtocolError, match="reserved for the server"):
            self.joined(main, {}, cut=cut)

    def test_a_server_event_type_behind_an_honest_one_in_the_same_map_never_completes(self) -> None:
        # msgpack lets a map repeat a key; the decoder keeps the last one
        main = b"\x82" + msgpack.packb("type") + msgpack.packb("method") + msgpack.packb("type")
        main += msgpack.packb("peer_not_found")
        with pytest.raises(ProtocolError, match="reserved for the server"):
            self.joined(main, {}, cut=2)

    @pytest.mark.parametrize(
        "main",
        [{"to": "W/bob"}, {"type": b"peer_not_found"}, {"type": ""}, {"type": 7}, {"type": ["peer_not_found"]}],
        ids=["none", "bytes", "empty", "int", "list"],
    )
    def test_a_header_without_a_type_string_never_completes(self, main: dict) -> None:
        with pytest.raises(ProtocolError, match="no 'type' string"):
            self.joined(msgpack.packb(main), {}, cut=4)

    def test_a_header_that_sets_ctx_never_completes(self) -> None:
        main = msgpack.packb({"type": "method", "ctx": {"from": "W/owner"}, "method": "services.s.f"})
        with pytest.raises(ProtocolError, match="ctx"):
            self.joined(main, {}, cut=5)

    @pytest.mark.parametrize("kind", ["method", "my-event", "e" * 300])
    def test_an_honest_type_and_identity_fields_complete(self, kind: str) -> None:
        # hypha-rpc writes its own from/to in the header; the receiver sets them from the stamped ``process``
        main = msgpack.packb({"type": kind, "from": "W/alice", "to": "W/bob", "method": "services.s.f"})
        self.joined(main, {"with_kwargs": False}, cut=3)


class TestStrangers:
    def test_another_sender_cannot_touch_a_message(self) -> None:
        ups = uploads()
        ups.create(ALICE, "k")

        for attempt in (
            lambda: ups.create(MALLORY, "k", overwrite=True),
            lambda: ups.add(MALLORY, "k", None, b"\x80"),
            lambda: ups.remove(MALLORY, "k"),
            lambda: ups.finish(MALLORY, "k"),
        ):
            with pytest.raises(PermissionDenied, match="in use by another sender"):
                attempt()
        assert len(ups) == 1

    def test_one_sender_cannot_hold_more_than_its_bound(self) -> None:
        ups = uploads(keep=True, max_bytes=100_000)
        first, second, _ = pieces(message({}, 180_000), 3)
        ups.create(MALLORY, "k")
        ups.add(MALLORY, "k", None, first)

        with pytest.raises(LimitExceeded, match="at most 100000 bytes"):
            ups.add(MALLORY, "k", None, second)
        assert ups.held_bytes == 0, "the message that passed the bound is dropped whole"

    def test_one_sender_cannot_open_more_than_its_share(self) -> None:
        ups = uploads()
        for i in range(4):
            ups.create(MALLORY, f"k{i}")

        with pytest.raises(LimitExceeded, match="at most 4 open"):
            ups.create(MALLORY, "k4")
        ups.create(ALICE, "mine")  # others are not affected

    def test_a_sender_that_leaves_takes_its_messages_along(self) -> None:
        ups = uploads(keep=True)
        ups.create(MALLORY, "k")
        ups.add(MALLORY, "k", None, message({}, 5000)[:1000])
        ups.create(ALICE, "a")

        ups.forget(MALLORY)

        assert ups.held_bytes == 0
        assert len(ups) == 1

    def test_an_abandoned_message_expires_after_the_idle_timeout(self) -> None:
        clock = FakeClock()
        ups = uploads(clock, keep=True)
        ups.create(MALLORY, "k")
        ups.add(MALLORY, "k", None, message({}, 5000)[:1000])
        clock.advance(59.9)
        ups.create(ALICE, "a")
        assert len(ups) == 2

        clock.advance(0.2)
        ups.create(ALICE, "b")

        assert len(ups) == 2
        assert ups.held_bytes == 0


class TestCacheCalls:
    @pytest.mark.parametrize(
        ("op", "args", "expected"),
        [
            ("create", ["k", True], ("k", None, b"", False)),
            ("create", ["k", False, True], ("k", None, b"", True)),
            ("append", ["k", b"data", True], ("k", None, b"data", False)),
            ("set", ["k", 3, b"data", True], ("k", 3, b"data", False)),
            ("process", ["k", True], ("k", None, b"", False)),
            ("remove", ["k"], ("k", None, b"", False)),
        ],
    )
    def test_the_arguments_hypha_rpc_sends(self, op: str, args: list, expected: tuple) -> None:
        call = parse_cache_call(op, {"args": args, "promise": "*"})

        assert (call.key, call.index, call.data, call.overwrite) == expected

    @pytest.mark.parametrize(
        ("op", "args"),
        [
            ("set", ["k", -1, b"x"]),
            ("set", ["k", True, b"x"]),
            ("append", ["k", "text"]),
            ("create", [""]),
            ("create", [["k"]]),
            ("remove", ["k", 1]),
        ],
    )
    def test_bad_arguments_are_refused(self, op: str, args: list) -> None:
        with pytest.raises(ProtocolError):
            parse_cache_call(op, {"args": args})


class TestPromiseTargets:
    @pytest.mark.parametrize(
        "promise",
        [
            None,
            "*",
            {"resolve": {"_rtype": "method", "_rtarget": "W/alice"}},
            {"reject": {"_rtarget": "alice"}, "interval": 5},
        ],
    )
    def test_a_promise_to_the_sender_is_fine(self, promise: object) -> None:
        assert foreign_targets(promise, "W/alice") == []

    @pytest.mark.parametrize("target", ["W/provider", "provider", "X/alice", "W/alice ", ["W/alice"]])
    def test_a_promise_to_anyone_else_is_named(self, target: object) -> None:
        promise = {
            "resolve": {"_rtype": "method", "_rtarget": "W/alice"},
            "reject": {"_rtype": "method", "_rtarget": target, "_rmethod": "services.prot.act"},
        }

        assert foreign_targets(promise, "W/alice")


class TestEachReceiver:
    """A replica's walks by receiver (``Receivers``): one per client, kept while it is alive."""

    def test_a_receivers_walk_outlives_its_connection_while_it_is_alive_and_goes_after(self) -> None:
        alive = {"W/bob"}
        walks = Receivers(clock=FakeClock(), max_bytes=1 << 20, alive=alive.__contains__)
        walks.of("W/bob").take(ALICE, parse_cache_call("create", {"args": ["k"]}))
        walks.forget("W/bob")
        assert "W/bob" in walks, "connected or in transit: its message cache is still there"
        with pytest.raises(PermissionDenied):
            walks.of("W/bob").take(MALLORY, parse_cache_call("append", {"args": ["k", b"x"]}))
        alive.clear()
        walks.forget("W/bob")
        assert "W/bob" not in walks

    def test_walks_of_clients_that_left_unnoticed_go_when_another_begins(self) -> None:
        alive = {"W/bob"}
        walks = Receivers(clock=FakeClock(), max_bytes=1 << 20, alive=alive.__contains__)
        walks.of("W/bob")
        alive.clear()
        walks.of("W/carol")
        assert "W/bob" not in walks
        assert len(walks) == 1

    def test_take_does_what_each_call_says_and_returns_a_kept_message(self) -> None:
        ups = uploads(keep=True)
        data = message({"with_kwargs": False})
        assert ups.take(ALICE, parse_cache_call("create", {"args": ["k"]})) is None
        assert ups.take(ALICE, parse_cache_call("set", {"args": ["k", 0, data]})) is None
        assert ups.take(ALICE, parse_cache_call("process", {"args": ["k"]})) == data
        ups.take(ALICE, parse_cache_call("create", {"args": ["k"]}))
        assert ups.take(ALICE, parse_cache_call("remove", {"args": ["k"]})) is None
        assert len(ups) == 0

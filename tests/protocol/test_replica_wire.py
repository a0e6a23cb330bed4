"""What one replica says to another: every kind round-trips, every malformed body is a clear
ProtocolError, and replicas of this release and of the one before (main 8600616) read each other.

Synchronous, no I/O. The previous release's writers and readers are reproduced below from its
code (``protocol/link/link_wire.py``'s tag, ``protocol/link/relay.py``'s wrapping, the broadcast prefix
in ``hub/dispatch.py``, ``hub/transit/moves.py``'s notices, ``hub/from_replicas.py``'s kick and
``replicas/dataplane/inbound.py``'s text notices), as a replica of that release runs them.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import msgpack
import pytest

from switchboard.errors import ProtocolError
from switchboard.protocol.link import replica_wire as rw
from switchboard.protocol.link.peer_versions import PeerVersions
from switchboard.protocol.link.replica_wire import (
    BalancedCall,
    BouncedCall,
    ClientFrame,
    ClientKicked,
    CredentialRevoked,
    ManagerCall,
    ManagerReply,
    Message,
    TransitNotice,
    WorkspaceDeleted,
    WorkspaceEvent,
)

FRAME = b"\x83\xa4type\xa6method\xa2to\xa4ws/c\xa4from\xa4ws/p"  # a hypha-rpc frame's first map
D = "0123456789abcdef01234567"  # a link direction's id
CALL = ManagerCall("ws/c", "r1", "s1", rw.wrap_manager_call("r1", "s1", FRAME), sender="r1@10.0.0.1:4000")

MESSAGES: list[Message] = [
    ClientFrame("ws/c", FRAME),
    ClientFrame("ws/c", FRAME, origin="r1@10.0.0.1:4000"),
    ClientFrame("ws/c", FRAME, origin="r1@10.0.0.1:4000", replay=(D, 7)),
    ClientFrame("ws/c", b""),
    CALL,
    ManagerReply("r2", FRAME),
    WorkspaceEvent("ws", "r1", FRAME),
    WorkspaceEvent("ws", "r1", b"a\nframe with\nnewlines"),
    TransitNotice("left", "ws/c", "r1", grace=30.0),
    TransitNotice("left", "ws/c", "r1"),
    TransitNotice("back", "ws/c", "r1"),
    TransitNotice("gone", "ws/c", "r1"),
    TransitNotice("abandoned", "ws/c", "r1"),
    TransitNotice("taken", "ws/c", "r1"),
    WorkspaceDeleted("ws-1"),
    CredentialRevoked("jti-1"),
    ClientKicked("ws", "c", 4000, "Kicked by the root user"),
    ClientKicked("ws", None, 1000, "every client\nof it"),
]


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_kind_reads_back_as_the_value_written(message: Message, version: int) -> None:
    data = rw.encode(message, version=version)
    assert rw.decode(rw.channel_of(message), data) == message
    if version == 2:
        assert data[:2] == b"\xff\x02", "a later version says so in its first two bytes"


@pytest.mark.parametrize("message", [ClientFrame("ws/c", FRAME), CALL])
def test_over_a_link_a_clients_frame_travels_without_an_origin(message: Message) -> None:
    data = rw.encode(message, linked=True)
    assert data == (message.wrapped if isinstance(message, ManagerCall) else message.frame)  # type: ignore[union-attr]
    got = rw.decode(rw.channel_of(message), data, linked=True)
    assert isinstance(got, ClientFrame | ManagerCall)
    assert (got.address, got.frame) == (message.address, message.frame)  # type: ignore[union-attr]


def test_a_linked_frame_is_handed_on_without_a_copy() -> None:
    """The hot path: a client's frame over a link is the very bytes the link read."""
    got = rw.decode("sb:client:ws/c", FRAME, linked=True)
    assert isinstance(got, ClientFrame)
    assert got.frame is FRAME


def test_a_manager_call_is_read_at_the_edge_with_where_its_reply_goes() -> None:
    got = rw.decode("sb:client:ws/c", rw.tag("r1@h:1", rw.wrap_manager_call("r1", "s1", FRAME)))
    assert isinstance(got, ManagerCall)
    assert (got.origin, got.session, got.frame, got.sender) == ("r1", "s1", FRAME, "r1@h:1")
    assert rw.unwrap(got.wrapped) == ("r1", "s1", FRAME)
    assert rw.unwrap(FRAME) == (None, None, FRAME)


MALFORMED: list[tuple[str, bytes, str]] = [
    ("sb:client:ws/c", b"", "empty"),
    ("sb:client:ws/c", b"\x20short", "shorter than its origin tag"),
    ("sb:client:ws/c", b"\x02\xff\xfe" + FRAME, "origin is not UTF-8"),
    ("sb:client:ws/c", b"\x00\x00no newline at all", "malformed relayed manager call"),
    ("sb:client:ws/c", b"\x00\x00r1\nno second newline", "malformed relayed manager call"),
    ("sb:client:ws/c", b"\x00\x00\xff\ns\n" + FRAME, "origin is not UTF-8"),
    ("sb:client:ws/c", b"\xff\x02", "empty"),
    ("sb:client:ws/c", b"\xff\x03\x00" + FRAME, "wire version 3"),
    ("sb:client:ws/c", b"\xff\x01\x00" + FRAME, "wire version 1"),
    ("sb:ws:ws", b"\xff\x1f", "wire version 31"),
    ("sb:replica:r", b"", "empty manager reply"),
    ("sb:ws:ws", b"no newline", "without its origin and frame"),
    ("sb:ws:ws", b"r1\n", "without its origin and frame"),
    ("sb:ws:ws", b"\xfe\n" + FRAME, "origin is not UTF-8"),
    ("sb:transit", b"not json", "not JSON"),
    ("sb:transit", b"\xfe{}", "not JSON"),
    ("sb:transit", b"[1, 2]", "without its sender"),
    ("sb:transit", b'{"left": "ws/c"}', "without its sender"),
    ("sb:transit", b'{"left": "ws/c", "from": 7}', "without its sender"),
    ("sb:transit", b'{"arrived": "ws/c", "from": "r1"}', "no kind"),
    ("sb:transit", b'{"left": 7, "from": "r1"}', "no kind"),
    ("sb:deleted", b"", "empty"),
    ("sb:deleted", b"ws\xff", "not UTF-8"),
    ("sb:revoked", b"", "empty"),
    ("sb:revoked", b"\xc3", "not UTF-8"),
    ("sb:kick", b"ws/c\n1000", "without its client, code and reason"),
    ("sb:kick", b"ws\n1000\nbye", "without its client, code and reason"),
    ("sb:kick", b"ws/c\nsoon\nbye", "close code is not a number"),
    ("sb:kick", b"ws/c\n-1\nbye", "close code is not a number"),
    ("sb:kick", b"ws/c\n99999999999\nbye", "close code is not a number"),
    ("sb:kick", b"ws/c\n\xff\nbye", "not UTF-8"),
    ("sb:client:ws/c", rw.tag("r1@h:1", b"\x02ws/balance|round_robin|s\n" + FRAME), "the hub's own wrapping"),
    ("sb:client:ws/c", rw.tag("r1@h:1", b"\x01ws/p\n" + FRAME), "the hub's own wrapping"),
    ("sb:client:ws/c", rw.tag("r1@h:1 balanced:;", FRAME), "a balanced call without its handle"),
    ("sb:client:ws/c", rw.tag("r1@h:1 bounced:p;", FRAME), "a bounced call without its callee"),
    ("sb:client:ws/c", b"\x13r1@h:1 bounced:\xff/p;" + FRAME, "origin is not UTF-8"),
    ("sb:elsewhere", b"?", "no message travels on channel"),
    ("sb:client", b"\x00" + FRAME, "no message travels on channel"),
]


@pytest.mark.parametrize(("channel", "data", "why"), MALFORMED)
def test_a_malformed_message_is_a_clear_protocol_error(channel: str, data: bytes, why: str) -> None:
    with pytest.raises(ProtocolError, match=why):
        rw.decode(channel, data)


def test_a_transit_notices_odd_grace_is_no_grace() -> None:
    for grace in ("30", True, None, [1]):
        body = json.dumps({"left": "ws/c", "from": "r1", "grace": grace}).encode()
        assert rw.decode("sb:transit", body) == TransitNotice("left", "ws/c", "r1")
    assert rw.decode("sb:transit", b'{"left": "ws/c", "from": "r1", "grace": 1e999}') == TransitNotice(
        "left", "ws/c", "r1"
    )


def test_no_version_is_written_but_those_this_replica_reads() -> None:
    for version in (0, rw.VERSION + 1):
        with pytest.raises(ValueError, match="writes versions"):
            rw.encode(WorkspaceDeleted("ws"), version=version)


def test_this_release_writes_the_layout_the_previous_one_reads() -> None:
    assert rw.SENDS == 1 < rw.VERSION, "the next release may write version 2: this one reads it"


def test_a_real_origin_of_255_bytes_is_not_taken_for_a_version() -> None:
    origin = "r" * 250 + "@h:12"  # the longest a tag carries; its first byte is printable
    got = rw.decode("sb:client:ws/c", rw.tag(origin, FRAME))
    assert isinstance(got, ClientFrame)
    assert (got.origin, got.frame) == (origin, FRAME)


# -- the previous release (main 8600616), as it reads and writes ------------------------------


def old_tag(origin: str, data: bytes, replay: tuple[str, int] | None = None) -> bytes:
    name = origin.encode()
    if replay is not None:
        mark = f" {replay[0]}.{replay[1]}".encode()
        name = name + mark if len(name) + len(mark) <= 255 else mark
    if len(name) > 255:
        raise ProtocolError("link origin too long")
    return bytes((len(name),)) + name + data


def old_untag(data: bytes) -> tuple[str, bytes]:
    if not data:
        raise ProtocolError("empty unicast message")
    n = data[0]
    if len(data) < 1 + n:
        raise ProtocolError("unicast message shorter than its origin tag")
    return data[1 : 1 + n].decode("utf-8", "replace"), data[1 + n :]


def old_split_replay(origin: str) -> tuple[str, tuple[str, int] | None]:
    origin, space, mark = origin.partition(" ")
    direction, dot, number = mark.partition(".")
    if not space or not dot or not direction or not (number.isascii() and number.isdigit()):
        return origin, None
    return origin, (direction, int(number))


def old_wrap(origin: str, session: str, frame: bytes) -> bytes:
    return b"".join((b"\x00", origin.encode(), b"\n", session.encode(), b"\n", frame))


def old_unwrap(data: bytes) -> tuple[str | None, str | None, bytes]:
    if not data.startswith(b"\x00"):
        return None, None, data
    try:
        origin, session, frame = data[1:].split(b"\n", 2)
        return origin.decode(), session.decode(), frame
    except ValueError:
        raise ProtocolError("malformed relayed manager call") from None


def old_write(message: Message) -> tuple[str, bytes]:
    """What a replica of the previous release publishes (over a link: the frame alone)."""
    channel = rw.channel_of(message)
    if isinstance(message, ClientFrame):
        return channel, old_tag(message.origin, message.frame, message.replay)
    if isinstance(message, ManagerCall):
        return channel, old_tag(message.sender, old_wrap(message.origin, message.session, message.frame))
    if isinstance(message, ManagerReply):
        return channel, message.frame
    if isinstance(message, WorkspaceEvent):
        return channel, message.origin.encode() + b"\n" + message.frame
    if isinstance(message, TransitNotice):
        extra = {} if message.grace is None else {"grace": message.grace}
        return channel, json.dumps({message.kind: message.client, "from": message.origin, **extra}).encode()
    if isinstance(message, WorkspaceDeleted):
        return channel, message.workspace.encode()
    if isinstance(message, CredentialRevoked):
        return channel, message.token_id.encode()
    assert isinstance(message, ClientKicked)
    return channel, f"{message.workspace}/{message.client_id or '*'}\n{message.code}\n{message.reason}".encode()


def old_read(channel: str, data: bytes) -> Any:
    """What a replica of the previous release makes of a message, in the terms of a value."""
    if channel.startswith("sb:client:"):
        tagged, rest = old_untag(data)
        origin, replay = old_split_replay(tagged)
        call_origin, session, frame = old_unwrap(rest)
        if call_origin is not None:
            return ("call", channel.removeprefix("sb:client:"), call_origin, session, frame, origin)
        return ClientFrame(channel.removeprefix("sb:client:"), frame, origin, replay)
    if channel.startswith("sb:replica:"):
        return ManagerReply(channel.removeprefix("sb:replica:"), data)
    if channel.startswith("sb:ws:"):
        origin, _, frame = data.partition(b"\n")
        return WorkspaceEvent(channel.removeprefix("sb:ws:"), origin.decode(), frame)
    if channel == "sb:transit":
        notice = json.loads(data)
        for kind in ("left", "back", "gone", "abandoned", "taken"):
            if isinstance(client := notice.get(kind), str):
                grace = notice.get("grace")
                return TransitNotice(kind, client, notice["from"], float(grace) if grace is not None else None)  # type: ignore[arg-type]
    if channel == "sb:deleted":
        return WorkspaceDeleted(data.decode(errors="replace"))
    if channel == "sb:revoked":
        return CredentialRevoked(data.decode(errors="replace"))
    if channel == "sb:kick":
        address, code_text, reason = data.decode().split("\n", 2)
        workspace, _, client_id = address.partition("/")
        return ClientKicked(workspace, None if client_id == "*" else client_id, int(code_text), reason)
    raise AssertionError(channel)


def as_old_reads(message: Message) -> Any:
    if isinstance(message, ManagerCall):
        return ("call", message.address, message.origin, message.session, message.frame, message.sender)
    return message


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_what_this_release_sends_a_replica_of_the_previous_one_reads(message: Message) -> None:
    assert old_read(rw.channel_of(message), rw.encode(message)) == as_old_reads(message)


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_what_a_replica_of_the_previous_release_sends_this_one_reads(message: Message) -> None:
    channel, data = old_write(message)
    assert rw.decode(channel, data) == message


def test_over_a_link_both_releases_read_each_others_frames() -> None:
    """A link carries a client's frame as it is (its DELIVER names the channel): unchanged."""
    for frame in (FRAME, old_wrap("r1", "s1", FRAME)):
        assert rw.encode(rw.decode("sb:client:ws/c", frame, linked=True), linked=True) == frame


# -- a balanced call and a bounced one (issue 41), as both releases read them ------------------------

HANDLE = "ws/balance|round_robin|calc"
REJECT = b"\x85\xa4type\xa6method\xa4from\xa4ws/p\xa2to\xa4ws/c\xa6method\xa8s1.reject"  # its first map
MARKED: list[BalancedCall | BouncedCall] = [
    BalancedCall("ws/p", HANDLE, FRAME, origin="r1@10.0.0.1:4000"),
    BalancedCall("ws/p", HANDLE, FRAME),
    BalancedCall("ws/p", "ws/balance|least_busy|calc.v2.5", FRAME, origin="r1@h:1"),  # ".5": no replay mark
    BalancedCall("ws/p", "ws/balance|round_robin|a calc; with spaces;", FRAME, origin="r1@h:1"),
    BouncedCall("ws/c", "ws/p", REJECT, origin="r1@10.0.0.1:4000"),
    BouncedCall("ws/c", "ws/p.7", REJECT, origin="r1@h:1"),
    # sent again through the bus after a lost link: the link's number beside the mark
    BalancedCall("ws/p", HANDLE, FRAME, origin="r1@10.0.0.1:4000", replay=(D, 7)),
    BalancedCall("ws/p", HANDLE, FRAME, replay=(D, 1)),
    BalancedCall("ws/p", "ws/balance|round_robin|a calc.3 with; spaces.4;", FRAME, origin="r1@h:1", replay=(D, 12)),
    BouncedCall("ws/c", "ws/p.7", REJECT, origin="r1@h:1", replay=(D, 3)),
]


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("message", MARKED, ids=repr)
def test_a_balanced_or_bounced_call_reads_back_as_the_value_written(message: Message, version: int) -> None:
    assert rw.decode(rw.channel_of(message), rw.encode(message, version=version)) == message


@pytest.mark.parametrize("message", MARKED, ids=repr)
def test_a_replica_of_the_previous_release_reads_a_balanced_call_as_the_call_and_a_bounced_one_as_its_reject(
    message: BalancedCall | BouncedCall,
) -> None:
    """What 8600616 makes of them is what it made of such a call before issue 41: the instance gets
    the call (its answer relabelled by the caller's replica), the caller the reject at once. One sent
    again after a lost link is read so too, not known there as a replay (delivered as it comes)."""
    assert old_read(rw.channel_of(message), rw.encode(message)) == ClientFrame(
        message.address, message.frame, message.origin
    )


@pytest.mark.parametrize("message", MARKED, ids=repr)
def test_a_balanced_or_bounced_call_never_travels_over_a_link(message: Message) -> None:
    with pytest.raises(ValueError, match="through the bus only"):
        rw.encode(message, linked=True)


def test_a_lost_links_balanced_call_carries_its_number_then_its_mark() -> None:
    call = BalancedCall("ws/p", HANDLE, FRAME, origin="r1@h:1", replay=(D, 7))
    assert rw.encode(call) == rw.tag(f"r1@h:1 {D}.7 balanced:{HANDLE};", FRAME)
    assert rw.encode(call) == rw.tag("r1@h:1", FRAME, (D, 7), mark=f"balanced:{HANDLE};")


def test_a_mark_too_long_beside_a_replays_number_is_left_out_and_the_number_kept() -> None:
    """Without its number the call could run twice; without its mark it is what a replica without marks reads."""
    long = BalancedCall("ws/p", "ws/balance|round_robin|" + "c" * 210, FRAME, origin="r1@h:1", replay=(D, 7))
    assert rw.decode("sb:client:ws/p", rw.encode(long)) == ClientFrame("ws/p", FRAME, "r1@h:1", (D, 7))
    short = BalancedCall("ws/p", "ws/balance|round_robin|" + "c" * 180, FRAME, origin="r" * 60 + "@h:1", replay=(D, 7))
    assert rw.decode("sb:client:ws/p", rw.encode(short)) == BalancedCall("ws/p", short.handle, FRAME, replay=(D, 7))


def test_a_mark_too_long_for_the_origin_tag_leaves_what_a_replica_without_marks_reads() -> None:
    long = BalancedCall("ws/p", "ws/balance|round_robin|" + "c" * 250, FRAME, origin="r1@h:1")
    assert rw.decode("sb:client:ws/p", rw.encode(long)) == ClientFrame("ws/p", FRAME, "r1@h:1")
    short = BalancedCall("ws/p", "ws/balance|round_robin|" + "c" * 200, FRAME, origin="r" * 60 + "@h:1")
    assert rw.decode("sb:client:ws/p", rw.encode(short)) == BalancedCall("ws/p", short.handle, FRAME)  # origin left out


@pytest.mark.parametrize(
    ("frame", "sent", "bus_only"),
    [
        (FRAME, ClientFrame("ws/p", FRAME, "r1@h:1"), False),
        (
            rw.wrap_manager_call("r1", "s1", FRAME),
            ClientFrame("ws/p", rw.wrap_manager_call("r1", "s1", FRAME), "r1@h:1"),
            False,
        ),
        (rw.wrap_balanced(HANDLE, FRAME), BalancedCall("ws/p", HANDLE, FRAME, "r1@h:1"), True),
        (rw.wrap_bounced("ws/q", REJECT), BouncedCall("ws/p", "ws/q", REJECT, "r1@h:1"), True),
    ],
)
def test_what_the_router_hands_on_is_sent_as(frame: bytes, sent: Message, bus_only: bool) -> None:
    """The sender's decision: a frame the router wrapped with a handle or as bounced takes the bus,
    its mark in the origin tag; any other frame takes a link if one is open."""
    assert rw.outgoing("ws/p", frame, "r1@h:1") == sent
    assert rw.outgoing("ws/p", frame, "r1@h:1", (D, 2)) == dataclasses.replace(sent, replay=(D, 2))  # type: ignore[type-var]
    assert rw.bus_only(frame) is bus_only


@pytest.mark.parametrize(
    ("data", "why"),
    [(b"\x02" + FRAME, "malformed balanced call"), (b"\x02\n" + FRAME, "malformed balanced call")],
)
def test_a_malformed_wrapped_balanced_call_is_a_clear_protocol_error(data: bytes, why: str) -> None:
    with pytest.raises(ProtocolError, match=why):
        rw.unwrap_balanced(data)


@pytest.mark.parametrize(("data", "why"), [(b"\x01ws/p", "malformed bounced call"), (b"\x01\n" + REJECT, "malformed")])
def test_a_malformed_wrapped_bounced_call_is_a_clear_protocol_error(data: bytes, why: str) -> None:
    with pytest.raises(ProtocolError, match=why):
        rw.unwrap_bounced(data)


def test_the_wrapped_forms_read_back() -> None:
    assert rw.unwrap_balanced(rw.wrap_balanced(HANDLE, FRAME)) == (HANDLE, FRAME)
    assert rw.unwrap_balanced(FRAME) == (None, FRAME)
    assert rw.unwrap_bounced(rw.wrap_bounced("ws/p", REJECT)) == ("ws/p", REJECT)


@pytest.mark.parametrize("prefix", [b"\x01", b"\x02"])
def test_no_frame_from_a_link_passes_for_the_hubs_own_wrapping(prefix: bytes) -> None:
    """Only a replica's origin tag marks a balanced or bounced call: a frame that looks wrapped is refused."""
    with pytest.raises(ProtocolError, match="the hub's own wrapping"):
        rw.decode("sb:client:ws/p", prefix + HANDLE.encode() + b"\n" + FRAME, linked=True)


# -- a balanced call and a bounced one over a link, to a replica that reads them ---------------------


@pytest.mark.parametrize(
    ("frame", "reads", "body"),
    [
        (FRAME, 1, FRAME),  # a plain frame: any link, as it is
        (FRAME, 2, FRAME),
        (rw.wrap_manager_call("r1", "s1", FRAME), 1, rw.wrap_manager_call("r1", "s1", FRAME)),
        (rw.wrap_balanced(HANDLE, FRAME), 1, None),  # a replica of 8600616 (or unknown): the bus, marked
        (rw.wrap_bounced("ws/q", REJECT), 1, None),
        (rw.wrap_balanced(HANDLE, FRAME), 2, b"\xff\x02" + rw.wrap_balanced(HANDLE, FRAME)),
        (rw.wrap_bounced("ws/q", REJECT), 2, b"\xff\x02" + rw.wrap_bounced("ws/q", REJECT)),
        (rw.wrap_balanced(HANDLE, FRAME), 7, b"\xff\x02" + rw.wrap_balanced(HANDLE, FRAME)),  # a later release
    ],
)
def test_a_link_carries_a_balanced_or_bounced_call_only_to_a_replica_that_reads_it(
    frame: bytes, reads: int, body: bytes | None
) -> None:
    assert rw.over_link(frame, reads) == body
    if body is not None:
        assert rw.handed_on(body) == frame  # given back by the link: the router's frame again


@pytest.mark.parametrize("message", MARKED, ids=repr)
def test_a_balanced_or_bounced_call_over_a_link_reads_back_without_its_origin(
    message: BalancedCall | BouncedCall,
) -> None:
    """Nor a replay's number: a link numbers its own frames."""
    data = rw.encode(message, linked=True, version=2)
    if isinstance(message, BalancedCall):
        wrapped = rw.wrap_balanced(message.handle, message.frame)
    else:
        wrapped = rw.wrap_bounced(message.callee, message.frame)
    assert data == rw.over_link(wrapped, 2)
    assert rw.decode(rw.channel_of(message), data, linked=True) == dataclasses.replace(message, origin="", replay=None)


@pytest.mark.parametrize(
    ("record", "reads"),
    [
        ({"id": "r1"}, 1),  # a replica of 8600616: no field
        ({"id": "r1", "reads": "2"}, 2),  # as Redis gives it back
        ({"id": "r1", "reads": 2}, 2),
        ({"id": "r1", "reads": "x"}, 1),
        ({"id": "r1", "reads": "0"}, 1),
        ({"id": "r1", "reads": "99999"}, 1),
        ({"id": "r1", "reads": True}, 1),
    ],
)
def test_a_replica_reads_the_version_its_presence_record_names_else_version_1(
    record: dict[str, Any], reads: int
) -> None:
    versions = PeerVersions()
    versions.learn([record, {"id": "r9", "reads": "2"}])
    assert versions.reads("r1") == reads
    assert versions.reads("unknown") == 1


def test_a_replica_gone_from_the_records_is_read_as_version_1_again() -> None:
    versions = PeerVersions()
    versions.learn([{"id": "r1", "reads": "2"}])
    versions.learn([{"id": "r1"}])  # back as a replica of the previous release
    assert versions.reads("r1") == 1
    versions.learn([{"id": "r2", "reads": "2"}])
    versions.learn([])
    assert versions.reads("r2") == 1


def test_one_byte_tells_every_wrapping_from_a_clients_plain_frame() -> None:
    """The router reads :func:`plain` before any unwrapping, for every frame relayed."""
    frame = msgpack.packb({"type": "method", "to": "ws/a", "method": "services.s.f"})
    wrapped = [
        rw.wrap_manager_call("replica-a", "s1", frame),
        rw.wrap_bounced("ws/gone", frame),
        rw.wrap_balanced("ws/balance|rr|svc", frame),
    ]
    assert [rw.plain(data) for data in wrapped] == [False, False, False]
    assert rw.plain(frame)
    assert rw.plain(msgpack.packb({f"k{i}": i for i in range(20)})), "a map of 16 keys or more (0xde) too"

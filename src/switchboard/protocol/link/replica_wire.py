"""What one replica says to another, as typed values: one :func:`encode`, one :func:`decode`.

Every message crosses on a channel (of the bus, or named in a link's ``DELIVER``)
and its kind is the channel's::

    sb:client:<ws>/<cid>   ClientFrame, or ManagerCall (a call another replica's manager made),
                           BalancedCall (with its handle), BouncedCall (a call whose callee left)
    sb:replica:<id>        ManagerReply   (a reply to a call this replica's manager made)
    sb:ws:<ws>             WorkspaceEvent
    sb:transit             TransitNotice  (a client left, is back, gone, abandoned, taken)
    sb:deleted             WorkspaceDeleted
    sb:revoked             CredentialRevoked
    sb:kick                ClientKicked

:func:`decode` is the one place their bytes are read: the bus's listener and
the links decode at the edge and hand values on (``replicas/dataplane/inbound.py``); a
message it cannot read is a :class:`~switchboard.errors.ProtocolError`, never
a crash of the reader. The bodies::

    client, through the bus   u8 n | origin (n bytes) | frame     the origin: "replica@host:port[ <direction>.<n>]"
    client, over a link       frame                             (the link knows who sent it)
    balanced call             as a client's, its origin "<origin> balanced:<handle>;"
                              (a lost link's: "<origin> <direction>.<n> balanced:<handle>;";
                              over a link: version 2, see below)
    bounced call              as a client's, its origin "<origin> bounced:<callee>;",
                              its frame the caller's reject "Target peer <callee> is not connected"
    manager call              0x00 | origin \\n session \\n frame  (as a client frame's frame)
    manager reply             frame
    broadcast                 origin \\n frame
    transit notice            JSON {"<kind>": "<ws>/<cid>", "from": origin, "grace": seconds?}
    deleted, revoked          the workspace, the credential's id (UTF-8)
    kick                      "<ws>/<cid|*>\\n<code>\\n<reason>"

**Versions.** Those bodies are version 1, the layout of every replica before
the version field. A later version starts its body with ``0xFF`` and its
number (2 to 31), which no version-1 body does (no UTF-8 text, JSON, hypha-rpc
frame or origin length of a real origin starts ``0xFF`` followed by a control
byte). A replica reads every version up to :data:`VERSION` and refuses a newer
one as malformed; it writes :data:`SENDS`. During a rolling upgrade replicas
of two releases run side by side, so a release writes what the release before
it reads: this one writes version 1 (readable by replicas without the field)
and reads both; the next may write version 2, which this one reads.

A balanced call and a bounced one are version 1 too, written so that a replica
without them reads them as it did before they existed: their mark rides after
a space in a bus message's origin tag, which such a replica ignores (it reads
only a replay's ``<direction>.<n>`` there, and a mark ends with ``;``), and
their frame is what it then delivers as it is: the call without its handle,
and the reject that fails the caller at once. Only replicas write an origin
tag, so no client can forge a mark. One a lost link left unacked is sent
again with its replay's number before its mark, and is delivered once, as a
client's frame is; a replica without marks reads that tag as the origin
alone (no replay), so there it is delivered as it comes.

Over a link, which carries no origin, a balanced or bounced call travels as a
version-2 body: ``0xFF 0x02`` then the router's wrapping (``0x02 handle \\n call``,
``0x01 callee \\n reject``), and only to a replica that reads it. A replica
announces the newest version it reads in its presence record (``reads``); one
that announces none reads version 1 and gets such a call through the bus,
marked (:func:`over_link`, ``protocol/link/peer_versions.py``). Only
replicas write to a link, and a client's frame is a msgpack map, never the
wrapping, so a version-1 body shaped as the wrapping is refused.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Final, Literal

from switchboard.errors import ProtocolError
from switchboard.protocol.hypha.ids import CLIENT_CHANNEL

VERSION: Final = 2  # the newest version this replica reads
SENDS: Final = 1  # the version it writes: the one the previous release reads
LINKED_CALLS: Final = 2  # the first version whose reader takes a balanced or bounced call over a link
_MARK: Final = 0xFF  # a versioned body starts with it, then the version's number
_MAX_VERSION: Final = 0x1F

REPLICA_CHANNEL: Final = "sb:replica:"  # + replica id: replies to calls its manager made
WORKSPACE_CHANNEL: Final = "sb:ws:"  # + workspace: broadcasts, heard by every replica with members there
DELETED_CHANNEL: Final = "sb:deleted"  # which workspace was deleted
REVOKED_CHANNEL: Final = "sb:revoked"  # which credential (jti) was revoked
KICK_CHANNEL: Final = "sb:kick"  # which client (or every client of a workspace) the root user closed
TRANSIT_CHANNEL: Final = "sb:transit"  # clients in transit

_MANAGER_CALL: Final = b"\x00"  # a hypha-rpc frame (a msgpack map) never starts with it
# Within the hub (never on the wire): a frame for a client wrapped as a BouncedCall or a
# BalancedCall, as the router hands it on (:func:`wrap_bounced`, :func:`wrap_balanced`).
_BOUNCED: Final = b"\x01"
_BALANCED: Final = b"\x02"
_LAST_WRAP: Final = 2  # the wrappings' first bytes are 0 to this
_BALANCED_MARK: Final = "balanced:"  # in the origin tag, after a space; a mark ends with _MARK_END
_BOUNCED_MARK: Final = "bounced:"
_MARK_END: Final = ";"
_CLIENT_AT: Final = len(CLIENT_CHANNEL)
TRANSITS: Final = ("left", "back", "gone", "abandoned", "taken")
TransitKind = Literal["left", "back", "gone", "abandoned", "taken"]


@dataclass(frozen=True, slots=True)
class ClientFrame:
    """A frame for the client (or HTTP caller) ``address`` (``<ws>/<cid>``), as the hub routes it.

    ``origin``: the sender's link address, through the bus only; ``replay``: a
    lost link's frame sent again through the bus, ``(direction id, number)``
    (``protocol/link/link_arrivals.py``). Written as it is: a frame the router
    wrapped for a manager call travels as one and is read as a :class:`ManagerCall`.
    """

    address: str
    frame: bytes
    origin: str = ""
    replay: tuple[str, int] | None = None


@dataclass(frozen=True, slots=True)
class ManagerCall:
    """A call another replica's manager made (itself, or for an HTTP caller) to the client
    ``address``: its reply goes back to ``origin``, the session ``session`` (``protocol/link/relay.py``).

    ``wrapped`` is the body as it travelled (the router reads it so), :attr:`frame` the call.
    """

    address: str
    origin: str
    session: str
    wrapped: bytes
    sender: str = ""  # the sending replica's link address, through the bus only
    replay: tuple[str, int] | None = None

    @property
    def frame(self) -> bytes:
        """The call, after ``0x00 origin \\n session \\n``."""
        return self.wrapped[3 + len(self.origin.encode()) + len(self.session.encode()) :]


@dataclass(frozen=True, slots=True)
class BalancedCall:
    """A call made through the balanced handle ``handle``, for its instance ``address`` on the
    replica that reads it (``hub/routing/served.py``): ``origin`` its sender's, through the bus only;
    ``replay``: as a :class:`ClientFrame`'s (a lost link's call sent again through the bus)."""

    address: str
    handle: str
    frame: bytes
    origin: str = ""
    replay: tuple[str, int] | None = None


@dataclass(frozen=True, slots=True)
class BouncedCall:
    """A call of the client ``address`` that reached its callee ``callee``'s replica as the callee
    left, back to the caller's replica undelivered (a balanced one goes to another instance):
    ``frame`` is the reject that fails it otherwise; ``origin`` its sender's, through the bus only;
    ``replay``: as a :class:`ClientFrame`'s."""

    address: str
    callee: str
    frame: bytes
    origin: str = ""
    replay: tuple[str, int] | None = None


@dataclass(frozen=True, slots=True)
class ManagerReply:
    """A reply to a call the manager of ``replica`` made, through the provider's replica."""

    replica: str
    frame: bytes


@dataclass(frozen=True, slots=True)
class WorkspaceEvent:
    """A workspace event ``origin`` published for every replica with members in ``workspace``."""

    workspace: str
    origin: str
    frame: bytes


@dataclass(frozen=True, slots=True)
class TransitNotice:
    """What ``origin`` says of a client in transit (``hub/transit/moves.py``); ``grace``: of a ``left``."""

    kind: TransitKind
    client: str
    origin: str
    grace: float | None = None


@dataclass(frozen=True, slots=True)
class WorkspaceDeleted:
    workspace: str


@dataclass(frozen=True, slots=True)
class CredentialRevoked:
    token_id: str


@dataclass(frozen=True, slots=True)
class ClientKicked:
    """The root user closed ``client_id`` of ``workspace`` (``None``: every client there)."""

    workspace: str
    client_id: str | None
    code: int
    reason: str


Message = (
    ClientFrame
    | ManagerCall
    | BalancedCall
    | BouncedCall
    | ManagerReply
    | WorkspaceEvent
    | TransitNotice
    | WorkspaceDeleted
    | CredentialRevoked
    | ClientKicked
)


# -- writing -------------------------------------------------------------------


def channel_of(message: Message) -> str:
    """The channel ``message`` travels on."""
    if isinstance(message, ClientFrame | ManagerCall | BalancedCall | BouncedCall):
        return CLIENT_CHANNEL + message.address
    if isinstance(message, ManagerReply):
        return REPLICA_CHANNEL + message.replica
    if isinstance(message, WorkspaceEvent):
        return WORKSPACE_CHANNEL + message.workspace
    return _FIXED_CHANNELS[type(message)]


def encode(message: Message, *, linked: bool = False, version: int = SENDS) -> bytes:
    """The body of ``message`` on its channel (:func:`channel_of`); ``linked``: over a link, where
    a client's frame carries no origin. ``version``: :data:`SENDS` unless a test says otherwise."""
    if not 1 <= version <= VERSION:
        raise ValueError(f"this replica writes versions 1 to {VERSION}, not {version}")
    body = _body(message, linked, version)
    return body if version == 1 else b"".join((bytes((_MARK, version)), body))


def _body(message: Message, linked: bool, version: int) -> bytes:
    if type(message) is ClientFrame:
        return message.frame if linked else tag(message.origin, message.frame, message.replay)
    if type(message) is ManagerCall:
        return message.wrapped if linked else tag(message.sender, message.wrapped, message.replay)
    if type(message) is BalancedCall or type(message) is BouncedCall:
        if linked:
            if version < LINKED_CALLS:
                raise ValueError("a balanced or bounced call travels through the bus only, as version 1")
            if isinstance(message, BalancedCall):
                return wrap_balanced(message.handle, message.frame)
            return wrap_bounced(message.callee, message.frame)
        mark = _mark(message)
        if mark is None:  # too long to mark: what a replica without marks reads
            return tag(message.origin, message.frame, message.replay)
        return tag(message.origin, message.frame, message.replay, mark=mark)
    if type(message) is ManagerReply:
        return message.frame
    if type(message) is WorkspaceEvent:
        return b"".join((message.origin.encode(), b"\n", message.frame))
    if type(message) is TransitNotice:
        notice: dict[str, object] = {message.kind: message.client, "from": message.origin}
        if message.grace is not None:
            notice["grace"] = message.grace
        return json.dumps(notice).encode()
    if type(message) is WorkspaceDeleted:
        return message.workspace.encode()
    if type(message) is CredentialRevoked:
        return message.token_id.encode()
    if type(message) is ClientKicked:
        return f"{message.workspace}/{message.client_id or '*'}\n{message.code}\n{message.reason}".encode()
    raise TypeError(f"not a message between replicas: {message!r}")


def _mark(message: BalancedCall | BouncedCall) -> str | None:
    """The mark, ``None`` if it does not fit the origin tag beside the replay's number (which stays:
    without the mark the call is what a replica without marks reads, without the number it may run twice)."""
    if isinstance(message, BalancedCall):
        mark = f"{_BALANCED_MARK}{message.handle}{_MARK_END}"
    else:
        mark = f"{_BOUNCED_MARK}{message.callee}{_MARK_END}"
    room = 254 if message.replay is None else 253 - len(_replay_text(message.replay).encode())
    return mark if len(mark.encode()) <= room else None


def outgoing(
    address: str, frame: bytes, origin: str = "", replay: tuple[str, int] | None = None
) -> ClientFrame | BalancedCall | BouncedCall:
    """The message a frame the router hands on for the client ``address`` is (a plain frame,
    a manager call, or one it wrapped with :func:`wrap_balanced` or :func:`wrap_bounced`);
    ``replay``: a lost link's, sent again through the bus."""
    if frame[:1] == _BALANCED:
        handle, _, call = frame[1:].partition(b"\n")
        return BalancedCall(address, _text(handle, "a balanced call's handle"), call, origin, replay)
    if frame[:1] == _BOUNCED:
        callee, _, reject = frame[1:].partition(b"\n")
        return BouncedCall(address, _text(callee, "a bounced call's callee"), reject, origin, replay)
    return ClientFrame(address, frame, origin, replay)


def bus_only(frame: bytes) -> bool:
    """Whether a frame the router hands on is a balanced or bounced call, which a link carries only to
    a replica that reads it (:func:`over_link`), else the bus (:func:`outgoing`)."""
    return frame[:1] == _BALANCED or frame[:1] == _BOUNCED


def over_link(frame: bytes, reads: int) -> bytes | None:
    """What a link to a replica that reads wire versions up to ``reads`` carries of a frame the
    router hands on: a plain frame or a manager call as it is (version 1), a balanced or bounced
    call as a version-2 body; ``None``: the bus, marked in the origin tag (a replica that reads
    no such body, as one that announced no version)."""
    if not bus_only(frame):
        return frame
    if reads < LINKED_CALLS:
        return None
    return b"".join((bytes((_MARK, LINKED_CALLS)), frame))


def handed_on(body: bytes) -> bytes:
    """The frame the router handed on, of a link's body :func:`over_link` wrote (one a link gave back)."""
    if len(body) > 2 and body[0] == _MARK and body[1] == LINKED_CALLS and body[2] in (1, 2):
        return body[2:]
    return body


def plain(data: bytes) -> bool:
    """Whether ``data`` is a hypha-rpc frame as a client sent it, not one the replicas wrapped (a
    manager call, a bounced or a balanced call): a msgpack map never starts with a byte below 3.
    One compare, read for every frame relayed, before any unwrapping."""
    return not data or data[0] > _LAST_WRAP


def wrap_balanced(handle: str, frame: bytes) -> bytes:
    """A call made through the balanced handle ``handle``, as the router hands it on (:class:`BalancedCall`)."""
    return b"".join((_BALANCED, handle.encode(), b"\n", frame))


def unwrap_balanced(data: bytes) -> tuple[str | None, bytes]:
    """``(handle, frame)`` of :func:`wrap_balanced`; ``(None, data)`` for any other frame."""
    if data[:1] != _BALANCED:
        return None, data
    handle, sep, frame = data[1:].partition(b"\n")
    if not sep or not handle:
        raise ProtocolError("malformed balanced call")
    return _text(handle, "a balanced call's handle"), frame


def wrap_bounced(callee: str, reject: bytes) -> bytes:
    """A call for ``callee`` that never reached it, as the router hands it on back to its caller's
    replica (:class:`BouncedCall`): ``reject`` fails the call unless another instance takes it."""
    return b"".join((_BOUNCED, callee.encode(), b"\n", reject))


def is_bounced(data: bytes) -> bool:
    return data[:1] == _BOUNCED


def unwrap_bounced(data: bytes) -> tuple[str, bytes]:
    """``(callee, reject)`` of :func:`wrap_bounced`."""
    callee, sep, reject = data[1:].partition(b"\n")
    if not sep or not callee:
        raise ProtocolError("malformed bounced call")
    return _text(callee, "a bounced call's callee"), reject


def wrap_manager_call(origin: str, session: str, frame: bytes) -> bytes:
    """A manager's call as it travels to another replica: with where its reply goes."""
    return b"".join((_MANAGER_CALL, origin.encode(), b"\n", session.encode(), b"\n", frame))


def is_manager_call(data: bytes) -> bool:
    """Whether a client frame's frame is a manager's call wrapped with its origin (:func:`wrap_manager_call`)."""
    return data[:1] == _MANAGER_CALL


def tag(origin: str, data: bytes, replay: tuple[str, int] | None = None, *, mark: str = "") -> bytes:
    """``data`` for a client channel through the bus, prefixed with its sender's ``replica@host:port``.

    ``replay``: a DELIVER a lost link left unacked, ``(direction id, number)``, written
    after the origin and a space (a replica that does not know it reads no link address
    in such an origin, and offers no link). An origin too long to fit with it is left
    out: the replay's mark matters, the offer of a link does not. So is a balanced or bounced
    call's ``mark``, after the replay's number when it has one (``<origin> <direction>.<n> <mark>``,
    which a replica without marks reads as the origin alone: the call, not known as a replay).
    """
    name = origin.encode()
    words = " ".join(word for word in (_replay_text(replay) if replay is not None else "", mark) if word)
    if words:
        after = f" {words}".encode()
        name = name + after if len(name) + len(after) <= 255 else after
    if len(name) > 255:
        raise ProtocolError("link origin too long")
    return b"".join((bytes((len(name),)), name, data))


# -- reading -------------------------------------------------------------------


def decode(channel: str, data: bytes, *, linked: bool = False) -> Message:
    """The message ``data`` on ``channel`` is; :class:`ProtocolError` if it is none (malformed, of an
    unknown channel, or of a newer version). ``linked``: it came over a link (no origin tag)."""
    start = 0
    if len(data) > 1 and data[0] == _MARK and data[1] <= _MAX_VERSION:
        if not 2 <= data[1] <= VERSION:
            raise ProtocolError(f"a message of wire version {data[1]}: this replica reads 1 to {VERSION}")
        start = 2
    if channel.startswith(CLIENT_CHANNEL):  # the path of every frame: no call it can do without
        address = channel[_CLIENT_AT:]
        if linked:
            frame = data[start:] if start else data
            if start and frame[:1] in (_BALANCED, _BOUNCED):
                return _linked_call(address, frame)
            origin, replay = "", None
        else:
            origin, frame = untag(data, start)
            if origin.endswith(_MARK_END) and " " in origin:
                marked = _marked(address, origin, frame)
                if marked is not None:
                    return marked
            origin, replay = split_replay(origin)
        if frame and frame[0] <= 2:
            if frame[0] == 0:
                return _manager_call(address, frame, origin, replay)
            raise ProtocolError("a client's frame that starts as only the hub's own wrapping does")
        return ClientFrame(address, frame, origin, replay)
    if start:
        data = data[start:]  # not a client's frame: small, copied once
    if channel.startswith(REPLICA_CHANNEL):
        if not data:
            raise ProtocolError("an empty manager reply")
        return ManagerReply(channel[len(REPLICA_CHANNEL) :], data)
    if channel.startswith(WORKSPACE_CHANNEL):
        sender, newline, event = data.partition(b"\n")
        if not newline or not event:
            raise ProtocolError("a broadcast without its origin and frame")
        return WorkspaceEvent(channel[len(WORKSPACE_CHANNEL) :], _text(sender, "a broadcast's origin"), event)
    if channel == TRANSIT_CHANNEL:
        return _transit(data)
    if channel == DELETED_CHANNEL:
        return WorkspaceDeleted(_text(data, "a deleted workspace", empty=False))
    if channel == REVOKED_CHANNEL:
        return CredentialRevoked(_text(data, "a revoked credential", empty=False))
    if channel == KICK_CHANNEL:
        return _kick(data)
    raise ProtocolError(f"no message travels on channel {channel[:80]!r}")


def _manager_call(address: str, frame: bytes, sender: str, replay: tuple[str, int] | None) -> ManagerCall:
    first = frame.find(b"\n", 1)
    second = frame.find(b"\n", first + 1) if first > 0 else -1
    if second < 0:
        raise ProtocolError("malformed relayed manager call")
    origin = _text(frame[1:first], "a manager call's origin")
    return ManagerCall(
        address, origin, _text(frame[first + 1 : second], "a manager call's session"), frame, sender, replay
    )


def _linked_call(address: str, frame: bytes) -> BalancedCall | BouncedCall:
    if frame[:1] == _BALANCED:
        handle, call = unwrap_balanced(frame)
        return BalancedCall(address, handle or "", call)
    callee, reject = unwrap_bounced(frame)
    if "/" not in callee:
        raise ProtocolError("a bounced call without its callee")
    return BouncedCall(address, callee, reject)


def _marked(address: str, origin: str, frame: bytes) -> BalancedCall | BouncedCall | None:
    sender, _, mark = origin.partition(" ")
    replay = None
    if not mark.startswith((_BALANCED_MARK, _BOUNCED_MARK)):  # "<direction>.<n> <mark>", or no mark
        number, _, mark = mark.partition(" ")
        replay = _replay(number)
        if replay is None:
            return None
    name = mark[: -len(_MARK_END)]
    if name.startswith(_BALANCED_MARK):
        handle = name[len(_BALANCED_MARK) :]
        if not handle:
            raise ProtocolError("a balanced call without its handle")
        return BalancedCall(address, handle, frame, sender, replay)
    if name.startswith(_BOUNCED_MARK):
        callee = name[len(_BOUNCED_MARK) :]
        if "/" not in callee:
            raise ProtocolError("a bounced call without its callee")
        return BouncedCall(address, callee, frame, sender, replay)
    return None


def untag(data: bytes, start: int = 0) -> tuple[str, bytes]:
    """``(origin as tagged, frame)`` of a client's message through the bus (:func:`tag`), from ``start``."""
    if len(data) <= start:
        raise ProtocolError("an empty message for a client")
    n = data[start]
    if len(data) < start + 1 + n:
        raise ProtocolError("a message for a client shorter than its origin tag")
    return _text(data[start + 1 : start + 1 + n], "a message's origin"), data[start + 1 + n :]


def unwrap(data: bytes) -> tuple[str | None, str | None, bytes]:
    """``(origin, session, frame)`` of a client frame's frame; ``None, None`` for a plain one."""
    if not data.startswith(_MANAGER_CALL):
        return None, None, data
    call = _manager_call("", data, "", None)
    return call.origin, call.session, call.frame


def split_replay(origin: str) -> tuple[str, tuple[str, int] | None]:
    """``(origin, (direction id, number))`` of an origin :func:`tag` marked as a replay, else ``(origin, None)``."""
    if " " not in origin:  # nearly always
        return origin, None
    origin, _, mark = origin.partition(" ")
    return origin, _replay(mark)


def _replay(mark: str) -> tuple[str, int] | None:
    direction, dot, number = mark.partition(".")
    if not dot or not direction or not (number.isascii() and number.isdigit()):
        return None
    return direction, int(number)


def _replay_text(replay: tuple[str, int]) -> str:
    return f"{replay[0]}.{replay[1]}"


def _transit(data: bytes) -> TransitNotice:
    try:
        notice = json.loads(data)
    except ValueError:  # UnicodeDecodeError too
        raise ProtocolError("a transit notice that is not JSON") from None
    if not isinstance(notice, dict) or not isinstance(origin := notice.get("from"), str):
        raise ProtocolError("a transit notice without its sender")
    for kind in TRANSITS:
        if isinstance(client := notice.get(kind), str):
            grace = notice.get("grace")
            if isinstance(grace, bool) or not isinstance(grace, int | float) or not math.isfinite(grace):
                grace = None
            return TransitNotice(kind, client, origin, float(grace) if grace is not None else None)
    raise ProtocolError("a transit notice of no kind this replica knows")


def _kick(data: bytes) -> ClientKicked:
    parts = _text(data, "a kick").split("\n", 2)
    if len(parts) != 3 or "/" not in parts[0]:
        raise ProtocolError("a kick without its client, code and reason")
    address, code, reason = parts
    workspace, _, client_id = address.partition("/")
    if not (code.isascii() and code.isdigit()) or len(code) > 4:
        raise ProtocolError("a kick's close code is not a number")
    return ClientKicked(workspace, None if client_id == "*" else client_id, int(code), reason)


def _text(data: bytes, what: str, *, empty: bool = True) -> str:
    if not data and not empty:
        raise ProtocolError(f"{what} is empty")
    try:
        return str(data, "utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(f"{what} is not UTF-8") from None


_FIXED_CHANNELS: Final[dict[type, str]] = {
    TransitNotice: TRANSIT_CHANNEL,
    WorkspaceDeleted: DELETED_CHANNEL,
    CredentialRevoked: REVOKED_CHANNEL,
    ClientKicked: KICK_CHANNEL,
}

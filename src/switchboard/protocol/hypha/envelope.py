"""Binary RPC frames: ``msgpack(main) [+ msgpack(extra)]``.

The router only ever decodes ``main`` (the routing header). ``extra`` holds the
payload and is forwarded as the very same bytes, never decoded or copied more
than once: that is what keeps a 10 MiB call as cheap as the kernel allows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgpack

from switchboard.errors import EncryptedPayload, ProtocolError
from switchboard.protocol.hypha import ids, payload

# Deep nesting is legal msgpack but no honest routing header needs it; the C
# unpacker recurses, so a hostile header could otherwise cost stack and time.
MAX_HEADER_BYTES = 64 * 1024

# Event types only the hub sends (protocol §7.2, §3.5, §7.4). hypha-rpc acts on
# some of them without looking at the sender: on ``client_disconnected`` or
# ``peer_not_found`` it fails every call waiting on the peer they name. A
# client that could send one could cancel other clients' calls, in any
# workspace, so the router refuses them from clients.
SERVER_EVENT_TYPES = frozenset(
    {
        "service_added",
        "service_removed",
        "service_updated",
        "client_connected",
        "client_disconnected",
        "client_updated",
        "workspace_loaded",
        "workspace_deleted",
        "workspace_changed",
        "workspace_ready",
        "workspace_unloaded",
        "workspace_status_changed",
        "peer_not_found",
        "force-exit",
    }
)


@dataclass(slots=True)
class Envelope:
    """A decoded routing header and the untouched payload bytes behind it."""

    main: dict[str, Any]
    rest: bytes | memoryview

    @property
    def type(self) -> str:
        kind: str = self.main["type"]  # checked by decode()
        return kind

    @property
    def session(self) -> str | None:
        s = self.main.get("session")
        return s if isinstance(s, str) and s else None


_is_str = str.__instancecheck__  # for all(map(...)) over a header's keys: no generator per frame


def decode(frame: bytes) -> Envelope:
    """Split a frame into its header map and payload bytes, validating the header."""
    if not frame:
        raise ProtocolError("empty binary frame")
    unpacker = msgpack.Unpacker(
        max_buffer_size=len(frame),
        max_bin_len=MAX_HEADER_BYTES,
        max_str_len=MAX_HEADER_BYTES,
        max_array_len=4096,
        max_map_len=4096,
        strict_map_key=True,
    )
    unpacker.feed(frame)
    try:
        main = unpacker.unpack()
    except msgpack.OutOfData:
        raise ProtocolError("truncated msgpack frame") from None
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ProtocolError(f"binary frame is not valid msgpack: {str(exc) or type(exc).__name__}") from None
    offset = unpacker.tell()
    if not isinstance(main, dict):
        raise ProtocolError(f"message header must be a map, got {type(main).__name__}")
    if not all(map(_is_str, main)):
        raise ProtocolError("message header keys must be strings")
    msg_type = main.get("type")
    if not isinstance(msg_type, str) or not msg_type:
        raise ProtocolError("message header has no 'type' string")
    to = main.get("to")
    if to is not None and not isinstance(to, str):
        raise ProtocolError(f"'to' must be a string, got {type(to).__name__}")
    session = main.get("session")
    if session is not None and not isinstance(session, str):
        raise ProtocolError(f"'session' must be a string, got {type(session).__name__}")
    return Envelope(main=main, rest=memoryview(frame)[offset:])


def encode(main: dict[str, Any], rest: bytes | memoryview = b"") -> bytes:
    """Pack a header and append the payload bytes unchanged."""
    head: bytes = msgpack.packb(main, use_bin_type=True)
    return head + rest if rest else head


@dataclass(frozen=True, slots=True)
class Identity:
    """Who sent a message, as the hub stamps it: ``from``, ``ws`` and ``user``, packed once.

    A client's identity is the same on every frame it sends, so its packed
    form is made once per connection (:func:`identity`), not once per frame.
    """

    sender: str
    workspace: str
    user: dict[str, Any]
    packed: bytes  # the three entries of the header map, msgpack


def identity(sender: str, workspace: str, user: dict[str, Any]) -> Identity:
    """``sender``'s identity, packed for :func:`stamp` (once per connection for a client)."""
    pack = msgpack.Packer(use_bin_type=True).pack
    packed = b"".join(map(pack, ("from", sender, "ws", workspace, "user", user)))
    return Identity(sender, workspace, user, packed)


_STAMPED = ("from", "ws", "user")
_FIXMAP = [bytes((0x80 | n,)) for n in range(16)]


def _map_header(size: int) -> bytes:
    """The msgpack header of a map of ``size`` entries."""
    if size < 16:
        return _FIXMAP[size]
    return (b"\xde" + size.to_bytes(2, "big")) if size < 0x10000 else (b"\xdf" + size.to_bytes(4, "big"))


def stamp(env: Envelope, *, identity: Identity, to: str, trusted: bool = False, allow_encrypted: bool = False) -> bytes:
    """The message as every receiver will read it, with the identity the hub gives it.

    This is the trust boundary. ``from``, ``ws`` and ``user`` drive reply
    addressing and the callee's permission checks, so they always come from
    the server, never the sender. hypha-rpc lets the payload override the
    header (``main.update(extra)``) and takes a ``ctx`` it finds as the
    callee's context, so a client's frame may carry neither a ``ctx`` nor,
    in its payload, any key the hub owns, nor a promise that sends the answer to
    anyone but the sender (:mod:`switchboard.protocol.hypha.payload`).
    A server event type (:data:`SERVER_EVENT_TYPES`) is refused outright.
    An end-to-end encrypted payload (``_enc`` in the header or the payload)
    is refused unless ``allow_encrypted``: its callee would take a context
    from inside a box the hub cannot read (:data:`payload.ENCRYPTED`).
    ``trusted`` frames (the manager's own) skip the payload check.

    The sender's own header goes out without whatever it said its identity
    was, followed by the identity's packed entries; ``env.main`` is left
    holding the stamped fields too.
    """
    main = env.main
    if not trusted:
        _check_type(main["type"])
        if "ctx" in main:
            raise ProtocolError(_CTX_REFUSAL)
        if payload.ENCRYPTED in main and not allow_encrypted:
            raise EncryptedPayload(payload.ENCRYPTED_REFUSAL)
        payload.check_extra(env.rest, sender=identity.sender, allow_encrypted=allow_encrypted)
    for key in _STAMPED:
        main.pop(key, None)
    main["to"] = to
    own: bytes = msgpack.packb(main, use_bin_type=True)
    size = len(main)
    skip = 1 if size < 16 else 3 if size < 0x10000 else 5  # the header packb wrote for ``size`` entries
    frame = b"".join((_map_header(size + len(_STAMPED)), memoryview(own)[skip:], identity.packed, env.rest))
    main["from"], main["ws"], main["user"] = identity.sender, identity.workspace, identity.user
    return frame


_CTX_REFUSAL = "a message may not set 'ctx': the hub sets who sent a message"


def _check_type(kind: object) -> None:
    if not isinstance(kind, str) or not kind:
        raise ProtocolError("message header has no 'type' string")
    if kind in SERVER_EVENT_TYPES:
        raise ProtocolError(f"event type {kind!r} is reserved for the server")


def check_joined_header(types: Sequence[str | None], *, ctx: bool) -> None:
    """The header inside a message put together from pieces, held to :func:`stamp`'s rules.

    hypha-rpc fires the joined header's ``type`` (setting ``from``, ``to``,
    ``ws``, ``user`` and ``ctx`` from the ``process`` call the hub stamped),
    so it may not be a server event type, nor set ``ctx``: ``types`` are its
    ``type`` values as a :class:`~switchboard.protocol.hypha.payload.Scanner` read
    them (a map may repeat a key), ``ctx`` whether it has one.
    """
    if not types:
        raise ProtocolError("message header has no 'type' string")
    for kind in types:
        _check_type(kind)
    if ctx:
        raise ProtocolError(_CTX_REFUSAL)


RouteKind = Literal["manager", "client", "broadcast", "nowhere"]


@dataclass(frozen=True, slots=True)
class Route:
    """Where a client's message goes: the manager, one client, a workspace, or nowhere.

    ``nowhere``: ``*/<id>`` for an id that is not the manager's. ``*`` is no
    workspace, so no client has that address: the sender is answered at once,
    and the target never becomes a channel or key name.
    """

    kind: RouteKind
    target: str  # "<ws>/<cid>", "*/<manager_id>", "<ws>/*" (or "*/<other id>", nowhere)
    workspace: str


def route(to: str | None, *, sender_workspace: str, manager_id: str) -> Route:
    """Normalise a ``to`` field as the reference does (protocol §3.5 rule 2)."""
    if to is None or to == "":
        raise ProtocolError("message has no 'to' target")
    if to == "*":
        return Route("broadcast", f"{sender_workspace}/*", sender_workspace)
    if "/" not in to:
        if not ids.is_id(to):
            raise ProtocolError(f"invalid target {to[:140]!r}: client ids are {ids.GRAMMAR}")
        return Route("client", f"{sender_workspace}/{to}", sender_workspace)
    ws, _, cid = to.partition("/")
    if not ws or not cid or "/" in cid:
        raise ProtocolError(f"invalid target {to[:140]!r}: expected '<workspace>/<client_id>'")
    if not (ws == "*" or ids.is_id(ws)) or not (cid == "*" or ids.is_id(cid)):
        raise ProtocolError(f"invalid target {to[:140]!r}: ids are {ids.GRAMMAR}")
    if ws == "*":
        # "*/<old manager id>" (a client that kept a stale id) is a client
        # nobody serves: it fails fast like any vanished target.
        return Route("manager" if cid == manager_id else "nowhere", to, "*")
    if cid == "*":
        return Route("broadcast", to, ws)
    if cid == manager_id:  # the manager serves every workspace (its callbacks name one)
        return Route("manager", to, ws)
    return Route("client", to, ws)


def reject_frame(*, session: str, target: str, caller: str, message: str, trace: str = "") -> bytes:
    """The synthetic ``<session>.reject`` that fails a caller fast (protocol §3.5); ``trace`` is
    what hypha-rpc appends to the message the caller's exception carries."""
    main = {"type": "method", "from": target, "to": caller, "method": f"{session}.reject"}
    ws = caller.partition("/")[0]
    main["ws"] = ws
    extra = {"args": [{"_rtype": "error", "_rvalue": message, "_rtrace": trace}]}
    return encode(main, msgpack.packb(extra, use_bin_type=True))

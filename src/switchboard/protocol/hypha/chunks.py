"""hypha-rpc's ``message_cache`` calls, which carry a message too large for one frame.

``services.built-in.message_cache.<op>`` with the arguments hypha-rpc sends:
``create(key, heartbeat[, overwrite])``, ``append(key, data, heartbeat)``,
``set(key, index, data, heartbeat)``, ``process(key, heartbeat)`` and
``remove(key)`` (keyword arguments are accepted as well). Pure functions.

The hub walks the pieces for their receiver (:mod:`switchboard.hub.routing.uploads`),
and that walk of a key starts at its ``create``. hypha-rpc (Python and
JavaScript) refuses a ``create`` for a key its cache already holds unless it
says ``overwrite``, and would then join new pieces after old ones the walk
never saw (pieces walked on another replica, before a reconnection, or of an
upload the hub gave up on). So every ``create`` reaches the receiver as an
overwrite (:func:`overwriting`): its cache for the key starts where the walk does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from switchboard.errors import ProtocolError

MESSAGE_CACHE = "services.built-in.message_cache."
OPS = ("create", "append", "set", "process", "remove")
_PARAMS = {
    "create": ("key", "heartbeat", "overwrite"),
    "append": ("key", "data", "heartbeat"),
    "set": ("key", "index", "data", "heartbeat"),
    "process": ("key", "heartbeat"),
    "remove": ("key",),
}
# a key is a session id (a short uuid, dotted when nested) or a short uuid: nothing longer is
# worth routing (chunk_key) or walking (hub/routing/uploads.py)
MAX_KEY = 1024


@dataclass(frozen=True, slots=True)
class CacheCall:
    """One ``message_cache`` call, its arguments checked."""

    op: str
    key: str
    index: int | None = None
    data: bytes = b""
    overwrite: bool = False
    heartbeat: Any = False


def cache_op(method: object) -> str | None:
    """``"append"`` for ``services.built-in.message_cache.append``, else ``None``."""
    if isinstance(method, str) and method.startswith(MESSAGE_CACHE):
        op = method[len(MESSAGE_CACHE) :]
        return op if op in OPS else None
    return None


def parse_cache_call(op: str, extra: dict[str, Any]) -> CacheCall:
    """The call's arguments from its decoded payload, or a :class:`ProtocolError`."""
    args = extra.get("args") or []
    if not isinstance(args, list):
        raise ProtocolError("message_cache call: 'args' must be a list")
    args = list(args)
    kwargs: dict[str, Any] = {}
    if extra.get("with_kwargs") and args and isinstance(args[-1], dict):
        kwargs = args.pop()
    params = _PARAMS[op]
    if len(args) > len(params):
        raise ProtocolError(f"message_cache.{op} takes at most {len(params)} arguments")
    values = dict(zip(params, args, strict=False))
    for name, value in kwargs.items():
        if name not in params or name in values:
            raise ProtocolError(f"message_cache.{op}: unexpected argument {name!r}")
        values[name] = value
    key = values.get("key")
    if not isinstance(key, str) or not key or len(key) > MAX_KEY:
        raise ProtocolError(f"message_cache.{op}: key must be a string of 1 to {MAX_KEY} characters")
    index = values.get("index")
    if op == "set" and (not isinstance(index, int) or isinstance(index, bool) or index < 0):
        raise ProtocolError("message_cache.set: index must be a non-negative integer")
    data = values.get("data", b"")
    if op in ("append", "set") and not isinstance(data, bytes):
        raise ProtocolError(f"message_cache.{op}: data must be bytes")
    return CacheCall(op, key, index, data, bool(values.get("overwrite")), values.get("heartbeat", False))


def overwriting(call: CacheCall, extra: dict[str, Any]) -> bytes:
    """The payload of the ``create`` ``call`` (decoded as ``extra``), re-encoded to overwrite
    whatever its receiver holds under the key; every other field of the payload is kept."""
    args = [call.key, call.heartbeat, True]
    packed: bytes = msgpack.packb({**extra, "args": args, "with_kwargs": False}, use_bin_type=True)
    return packed


def piece_header(op: str, rest: bytes | memoryview) -> dict[str, Any] | None:
    """The header a message in pieces starts with, read from its first piece (``set`` index 0,
    or an ``append``: ``None`` if it is not the first), or ``None`` if it holds no header."""
    try:
        extra = msgpack.unpackb(rest, raw=False)
        call = parse_cache_call(op, extra) if isinstance(extra, dict) else None
    except (ProtocolError, ValueError, TypeError, msgpack.UnpackException):
        return None
    if call is None or (op == "set" and call.index != 0):
        return None
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=len(call.data))
    unpacker.feed(call.data)
    try:
        header = unpacker.unpack()
    except (ValueError, TypeError, msgpack.UnpackException):
        return None
    return header if isinstance(header, dict) else None


def chunk_key(method: object, extra: bytes | memoryview) -> str | None:
    """The key of a ``message_cache`` call (its first argument), else ``None``.

    Only the start of ``extra`` is read: a chunk (up to 256 KiB of bytes that
    follow the key) is never unpacked.
    """
    if not isinstance(method, str) or not method.startswith(MESSAGE_CACHE) or not extra:
        return None
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=len(extra), max_str_len=MAX_KEY)
    unpacker.feed(extra)
    try:
        for _ in range(unpacker.read_map_header()):
            name = unpacker.unpack()
            if name != "args":
                unpacker.skip()
                continue
            if unpacker.read_array_header() < 1:
                return None
            key = unpacker.unpack()
            return key if isinstance(key, str) and key else None
    except (ValueError, TypeError, msgpack.UnpackException):
        return None  # not ours to judge: the manager's RPC rejects it
    return None

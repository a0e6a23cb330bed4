"""What a client may put in a message's payload, checked without decoding it.

hypha-rpc reads a message as ``main.update(extra)``: every key of the second
msgpack object (the payload) replaces the key of the same name in the
header, and a ``ctx`` it finds becomes the callee's context. The hub stamps
the header, so the payload must not hold any key the hub owns
(:data:`RESERVED`); otherwise a client could name any sender it likes to the
callee. The payload may hold megabytes, so it is walked, not decoded: the
top-level keys are read and every value is skipped by its length, with no
copy of payload bytes.

:class:`Scanner` is fed bytes in order (one frame, or the chunks of a
message too large for one frame, which hypha-rpc assembles on the receiving
side) and reports what it found; :func:`check_extra` is the one-frame case.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from typing import Any

import msgpack

from switchboard.errors import EncryptedPayload, PermissionDenied, ProtocolError

# Keys of the header the hub sets or decides on (identity, routing, the call's kind).
# In the payload they would override, on the receiving side, what the hub stamped.
RESERVED = frozenset({"type", "from", "to", "ws", "user", "ctx", "session", "method"})
_RESERVED_BYTES = frozenset(k.encode() for k in RESERVED)
# hypha-rpc's end-to-end encryption: a payload ``{"_enc": {...}, "data": <box>}``
# is opened by the callee, and every field inside (ctx, from, user, promise...)
# merged over the message after its context was built. The hub cannot read the
# box, so unless encrypted payloads are allowed, a top-level ``_enc`` in any part
# of a message is refused (``--allow-encrypted-payloads``).
ENCRYPTED = "_enc"
_ENCRYPTED_BYTES = ENCRYPTED.encode()
_WATCHED = RESERVED | {ENCRYPTED}
ENCRYPTED_REFUSAL = (
    "end-to-end encrypted payloads ('_enc') are refused by this hub: it cannot check what they carry, and "
    "hypha-rpc takes the caller's context (ctx, from, user) from inside them; a hub started with "
    "--allow-encrypted-payloads (SWITCHBOARD_ALLOW_ENCRYPTED_PAYLOADS) lets them through"
)
_LONGEST_KEY = max(len(k) for k in _RESERVED_BYTES | {b"promise"})
# A header's ``type`` is read up to this many bytes: enough to tell every server event type
# from any other (the rest of a longer one is skipped like any value).
TYPE_PREFIX = 64

MAX_DEPTH = 512  # as deep as msgpack's own unpacker goes; deeper is no honest message
# The walk is plain Python: past this many values in one frame the rest of the
# check runs in msgpack's C unpacker, so a frame of a million tiny values costs
# milliseconds, not seconds.
WALK_BUDGET = 4096
# A payload this small is decoded whole in C (about 1 µs): cheaper than any walk.
SMALL_PAYLOAD = 2048

# A promise names where the answer goes: three small callback maps. More is no promise.
MAX_PROMISE = 64 * 1024

_LEAF, _STR, _EXT, _ARRAY, _MAP, _BAD = range(6)


def _table() -> list[tuple[int, int, int, int]]:
    """For each first byte: (kind, header bytes before a length, length-field bytes, fixed n)."""
    t: list[tuple[int, int, int, int]] = [(_BAD, 0, 0, 0)] * 256
    for b in range(0x00, 0x80):
        t[b] = (_LEAF, 1, 0, 0)
    for b in range(0xE0, 0x100):
        t[b] = (_LEAF, 1, 0, 0)
    for b in range(0x80, 0x90):
        t[b] = (_MAP, 1, 0, b & 0x0F)
    for b in range(0x90, 0xA0):
        t[b] = (_ARRAY, 1, 0, b & 0x0F)
    for b in range(0xA0, 0xC0):
        t[b] = (_STR, 1, 0, b & 0x1F)
    for b in (0xC0, 0xC2, 0xC3):
        t[b] = (_LEAF, 1, 0, 0)
    for b, size in (
        (0xCA, 5),
        (0xCB, 9),
        (0xCC, 2),
        (0xCD, 3),
        (0xCE, 5),
        (0xCF, 9),
        (0xD0, 2),
        (0xD1, 3),
        (0xD2, 5),
        (0xD3, 9),
        (0xD4, 3),
        (0xD5, 4),
        (0xD6, 6),
        (0xD7, 10),
        (0xD8, 18),
    ):
        t[b] = (_LEAF, size, 0, 0)
    for b, n in ((0xC4, 1), (0xC5, 2), (0xC6, 4), (0xD9, 1), (0xDA, 2), (0xDB, 4)):
        t[b] = (_STR, 1, n, 0)  # bin and str: skipped alike
    for b, n in ((0xC7, 1), (0xC8, 2), (0xC9, 4)):
        t[b] = (_EXT, 1, n, 0)  # the type byte follows the length
    for b, n in ((0xDC, 2), (0xDD, 4)):
        t[b] = (_ARRAY, 1, n, 0)
    for b, n in ((0xDE, 2), (0xDF, 4)):
        t[b] = (_MAP, 1, n, 0)
    return t


_TABLE = _table()


class Scanner:
    """Walks msgpack objects fed in order and collects the reserved keys of one of them.

    ``objects`` says how many top-level maps the stream may hold (the last
    may be missing), and ``payload`` which of them is checked. The bytes of
    the payload's ``promise`` (where the callee sends its answer) are kept,
    up to :data:`MAX_PROMISE`, for :func:`foreign_targets`; otherwise nothing
    is kept but a small header that straddles two feeds. ``header``, if
    given, is the object read as the message's routing header: the values of
    its ``type`` keys are noted (the first :data:`TYPE_PREFIX` bytes of a
    string, ``None`` for anything else), and whether it sets ``ctx``, so the
    header of a message put together from pieces can be held to the rules of
    any header (:func:`switchboard.protocol.hypha.envelope.check_joined_header`).
    """

    def __init__(self, *, objects: int, payload: int, header: int | None = None) -> None:
        self.objects = objects
        self.payload = payload
        self.header = header
        self.found: set[str] = set()  # reserved keys seen at the payload's top level
        self.header_types: list[str | None] = []  # the header's ``type`` values, in order
        self.header_ctx = False  # the header has a ``ctx`` key
        self.promise: bytes | None = None  # the payload's promise, once walked whole
        self.values = 0  # values walked so far
        self._obj = 0  # index of the top-level object being walked (or next)
        self._stack: list[int] = []  # items left in each open container
        self._skip = 0  # bytes of a str/bin/ext body still to pass
        self._carry = b""  # the start of an item the last feed cut off
        self._promise_next = False  # the next value is the promise
        self._capture: bytearray | None = None  # the promise's bytes so far

    @property
    def complete(self) -> bool:
        """Between objects, with at least every object before the payload seen whole."""
        return not self._stack and not self._skip and not self._carry and self._obj >= self.payload

    def feed(self, data: bytes | memoryview, budget: int | None = None) -> bool:
        """Walk ``data``; ``False`` if ``budget`` values were walked before its end."""
        if self._carry:
            data = self._carry + bytes(data)
            self._carry = b""
        end = len(data)
        pos = min(self._skip, end)
        self._skip -= pos
        stack = self._stack
        table = _TABLE
        walked = 0
        cap_from = 0 if self._capture is not None else -1
        if cap_from >= 0 and not self._skip and self._promise_done():
            cap_from = self._end_capture(data, cap_from, pos)
        while pos < end:
            if budget is not None and walked >= budget:
                return self._stop(data, pos, cap_from, walked, done=False)
            kind, head, lsize, n = table[data[pos]]
            start = pos
            if lsize:
                if pos + head + lsize > end:
                    return self._stop(data, pos, cap_from, walked)
                n = int.from_bytes(data[pos + head : pos + head + lsize], "big")
            pos += head + lsize
            if not stack:  # a top-level object starts
                walked += 1
                if self._obj >= self.objects:
                    raise ProtocolError("unexpected data after the message's payload")
                if kind != _MAP:
                    raise ProtocolError("each part of a message must be a msgpack map")
                if n:
                    stack.append(2 * n)
                else:
                    self._obj += 1
                continue
            top_key = len(stack) == 1 and not stack[0] & 1  # a key of a top-level object
            is_key = top_key and self._obj == self.payload
            promise_key = False
            if kind == _LEAF:
                if pos > end:
                    return self._stop(data, start, cap_from, walked)
            elif kind in (_STR, _EXT):
                if kind == _EXT:
                    pos += 1
                if top_key and kind == _STR and n <= _LONGEST_KEY:
                    if pos + n > end:  # a short key cut in two: walk it again next time
                        return self._stop(data, start, cap_from, walked)
                    key = bytes(data[pos : pos + n])
                    if key == _ENCRYPTED_BYTES:  # in the header too: hypha-rpc looks for it in both
                        self.found.add(ENCRYPTED)
                    elif is_key and key in _RESERVED_BYTES:
                        self.found.add(key.decode())
                    elif self._obj == self.header:
                        if key == b"type":  # its value is read here, and walked as any value next
                            at_hand, value = _str_prefix(data, pos + n, end)
                            if not at_hand:  # the value cut off: walk the key again next time
                                return self._stop(data, start, cap_from, walked)
                            self.header_types.append(value)
                        self.header_ctx = self.header_ctx or key == b"ctx"
                    promise_key = is_key and key == b"promise"
                pos += n
                if pos > end:
                    self._skip = pos - end
                    pos = end
            elif kind != _ARRAY and kind != _MAP:
                raise ProtocolError(f"message payload is not valid msgpack (byte 0x{data[start]:02x})")
            walked += 1
            if is_key:
                self._promise_next = promise_key
            elif self._promise_next and len(stack) == 1:
                self._promise_next = False
                self._capture = bytearray()
                cap_from = start
            stack[-1] -= 1
            if (kind in (_ARRAY, _MAP)) and n:
                if len(stack) >= MAX_DEPTH:
                    raise ProtocolError(f"message payload nested deeper than {MAX_DEPTH}")
                stack.append(2 * n if kind == _MAP else n)
                continue
            while stack and not stack[-1]:
                stack.pop()
            if not stack:
                self._obj += 1
            if cap_from >= 0 and not self._skip and self._promise_done():
                cap_from = self._end_capture(data, cap_from, pos)
        return self._stop(data, end, cap_from, walked)

    def _promise_done(self) -> bool:
        """The promise's value has been walked (the payload map is back at its top level)."""
        return len(self._stack) <= 1 and (not self._stack or not self._stack[0] & 1)

    def _end_capture(self, data: bytes | memoryview, cap_from: int, pos: int) -> int:
        assert self._capture is not None
        self._capture += data[cap_from:pos]
        self._check_capture()
        self.promise = bytes(self._capture)
        self._capture = None
        return -1

    def _check_capture(self) -> None:
        if self._capture is not None and len(self._capture) > MAX_PROMISE:
            raise ProtocolError(f"a message's promise may take at most {MAX_PROMISE} bytes")

    def _stop(self, data: bytes | memoryview, pos: int, cap_from: int, walked: int, *, done: bool = True) -> bool:
        """End this feed at ``pos``: keep what follows for the next, and the promise so far."""
        if done and pos < len(data):  # out of budget, the walk ends here: nothing to keep
            self._carry = bytes(data[pos:])
        if cap_from >= 0 and self._capture is not None:
            self._capture += data[cap_from:pos]
            self._check_capture()
        self.values += walked
        return done


_STR_HEAD = {0xD9: 1, 0xDA: 2, 0xDB: 4}  # str 8/16/32: bytes of the length field


def _str_prefix(data: bytes | memoryview, pos: int, end: int) -> tuple[bool, str | None]:
    """Whether the start of the value at ``pos`` is at hand in ``data[:end]``, and then the first
    :data:`TYPE_PREFIX` bytes of that msgpack str (``None``: it is not a str)."""
    if pos >= end:
        return False, None
    first = data[pos]
    if 0xA0 <= first <= 0xBF:
        head, n = 1, first & 0x1F
    elif first in _STR_HEAD:
        head = 1 + _STR_HEAD[first]
        if pos + head > end:
            return False, None
        n = int.from_bytes(data[pos + 1 : pos + head], "big")
    else:
        return True, None
    take = min(n, TYPE_PREFIX)
    if pos + head + take > end:
        return False, None
    return True, bytes(data[pos + head : pos + head + take]).decode(errors="replace")


def check_extra(rest: bytes | memoryview, *, sender: str, allow_encrypted: bool = False) -> None:
    """Refuse a frame's payload unless it is one map free of :data:`RESERVED` keys (and of
    :data:`ENCRYPTED`, unless ``allow_encrypted``) whose promise, if any, sends the answer to
    ``sender`` only."""
    if not rest:
        return
    found, promise = _keys_of_small(rest) if len(rest) <= SMALL_PAYLOAD else _keys_of_large(rest)
    check_keys(found, allow_encrypted=allow_encrypted)
    check_promise(promise, sender)


def check_keys(found: AbstractSet[str], *, allow_encrypted: bool = False) -> None:
    """Refuse what a :class:`Scanner` (or a decoded payload) found: reserved keys, an encrypted payload."""
    if not found:  # every honest frame: nothing more to pay
        return
    reserved = sorted(k for k in found if k != ENCRYPTED)
    if reserved:
        raise ProtocolError(f"the payload may not set {', '.join(reserved)}: the hub sets who sent a message")
    if ENCRYPTED in found and not allow_encrypted:
        raise EncryptedPayload(ENCRYPTED_REFUSAL)


def check_promise(promise: Any, sender: str) -> None:
    foreign = foreign_targets(promise, sender)
    if foreign:
        raise PermissionDenied(
            f"Permission denied: a call's promise may send its answer only to its caller {sender}, "
            f"not {', '.join(foreign)}"
        )


def foreign_targets(promise: Any, sender: str) -> list[str]:
    """The callback targets in a promise other than ``sender`` (hypha-rpc's ``_rtarget``).

    The callee calls these functions as itself when it answers; a promise
    naming anyone but the caller would make it call a third party's
    functions, protected ones included, on the caller's behalf. A bare
    target is relative to the sender's workspace, as hypha-rpc reads it;
    ``"*"`` is the promise hypha-rpc expands from the (stamped) sender itself.
    """
    if promise is None or promise == "*":
        return []
    client_id = sender.partition("/")[2]
    if type(promise) is dict:  # hypha-rpc's shape: {resolve, reject, heartbeat: callback, interval}
        found: list[str] = []
        for value in promise.values():
            if type(value) is not dict:
                if type(value) is list or not _plain(value):
                    break  # not hypha-rpc's shape: walk it all
                continue
            target = value.get("_rtarget")
            if target is not None and target != sender and target != client_id:
                found.append(str(target)[:140])
            for field in value.values():
                if type(field) is dict or type(field) is list:
                    break
            else:
                continue
            break  # nested deeper than a callback: walk it all
        else:
            return found
    return _walk_targets(promise, sender, client_id)


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool | bytes)


def _walk_targets(promise: Any, sender: str, client_id: str) -> list[str]:
    found: list[str] = []
    stack = [promise]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            target = item.get("_rtarget")
            if target is not None and target != sender and target != client_id:
                found.append(str(target)[:140])
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif not _plain(item):
            found.append(type(item).__name__)
    return found


def decode_promise(raw: bytes | None) -> Any:
    """The promise bytes a :class:`Scanner` kept, decoded."""
    if raw is None:
        return None
    with _not_msgpack("message promise"):
        return msgpack.unpackb(raw, strict_map_key=False)


@contextlib.contextmanager
def _not_msgpack(what: str) -> Iterator[None]:
    """msgpack's errors, as the one :class:`ProtocolError` a client is told."""
    try:
        yield
    except msgpack.ExtraData:
        raise ProtocolError("unexpected data after the message's payload") from None
    except msgpack.OutOfData:
        raise ProtocolError(f"{what} is truncated") from None
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ProtocolError(f"{what} is not valid msgpack ({type(exc).__name__}: {exc})") from None


def _keys_of_small(rest: bytes | memoryview) -> tuple[AbstractSet[str], Any]:
    try:  # not `with _not_msgpack(...)`: on every frame its generator cost as much as the unpacking
        extra = msgpack.unpackb(rest, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException):
        with _not_msgpack("message payload"):
            raise
    if type(extra) is not dict:
        raise ProtocolError("each part of a message must be a msgpack map")
    return _WATCHED.intersection(extra), extra.get("promise")


def _keys_of_large(rest: bytes | memoryview) -> tuple[AbstractSet[str], Any]:
    scanner = Scanner(objects=1, payload=0)
    if scanner.feed(rest, WALK_BUDGET):
        if not scanner.complete:
            raise ProtocolError("message payload is truncated")
        return scanner.found, decode_promise(scanner.promise)
    return _keys_with_c_unpacker(rest)


def _keys_with_c_unpacker(rest: bytes | memoryview) -> tuple[set[str], Any]:
    """:func:`check_extra` for payloads of many small values: the same rules, at C speed."""
    unpacker = msgpack.Unpacker(max_buffer_size=len(rest), strict_map_key=False)
    unpacker.feed(rest)
    promise = None
    found = set()
    with _not_msgpack("message payload"):
        for _ in range(unpacker.read_map_header()):
            key = unpacker.unpack()
            if key == "promise":
                promise = unpacker.unpack()
                continue
            if isinstance(key, str) and key in _WATCHED:
                found.add(key)
            unpacker.skip()
    if unpacker.tell() != len(rest):
        raise ProtocolError("unexpected data after the message's payload")
    return found, promise


def payload_map(rest: bytes | memoryview) -> dict[str, Any]:
    """A frame's second object, decoded (for the few frames whose arguments the hub acts on)."""
    if not rest:
        return {}
    try:
        extra = msgpack.unpackb(rest, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ProtocolError(f"message payload is not valid msgpack ({type(exc).__name__}: {exc})") from None
    if not isinstance(extra, dict):
        raise ProtocolError("each part of a message must be a msgpack map")
    return extra

"""Messages too large for one frame, on their way to one receiver.

hypha-rpc sends a message above 256 KiB as calls to the receiver's
``message_cache``: ``create(key)``, then ``set(key, index, chunk)`` or
``append(key, chunk)`` for each piece, then ``process(key)``, on which the
receiver joins the pieces and handles the message as if it had come in one
frame. The hub must see such a message as the receiver will: its header
passes the rules of any header (no server event type, no ``ctx``), its payload
may not name a sender (:mod:`switchboard.protocol.hypha.payload`), and a stranger
may not write into, take over or fill another sender's message.

An :class:`Uploads` belongs to one receiver (a client, kept by the router of
its replica while it is connected there or in transit from there, since
hypha-rpc keeps its message cache across reconnections; or the hub's
manager). It knows who sends each key,
walks the pieces in order with a :class:`~switchboard.protocol.hypha.payload.Scanner`
(so nothing is decoded), and holds only pieces that arrived ahead of their
turn, or, for the hub's own manager (``keep=True``), all of them, since the
manager's pieces are put together here. Every byte held counts against its
sender's bound; an upload nobody touches for ``idle_timeout`` is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from switchboard.clock import Clock
from switchboard.errors import LimitExceeded, PermissionDenied, ProtocolError
from switchboard.protocol.hypha.chunks import CacheCall
from switchboard.protocol.hypha.envelope import check_joined_header
from switchboard.protocol.hypha.payload import Scanner, check_keys, check_promise, decode_promise

# Walking is plain Python; a message of more values than this is refused rather
# than cost the replica seconds of CPU (honest large payloads are bytes or arrays).
MAX_VALUES = 2_000_000
# hypha-rpc sends one large message at a time per call or reply; 64 open from one
# sender to one receiver covers bursts of concurrent ones.
MAX_OPEN_UPLOADS = 64
# hypha-rpc sends a message's pieces back to back: a minute of silence is an abandoned upload.
UPLOAD_IDLE_TIMEOUT = 60.0


@dataclass(eq=False)
class Upload:
    """One chunked message: its sender, the walk so far, the pieces held."""

    sender: str
    touched: float
    scanner: Scanner = field(default_factory=lambda: Scanner(objects=2, payload=1, header=0))
    next_index: int = 0  # the piece the walk needs next
    count: int = 0  # pieces received (``append`` puts the next one at this index)
    ahead: dict[int, bytes] = field(default_factory=dict)
    kept: list[bytes] = field(default_factory=list)
    held: int = 0  # bytes of ``ahead`` and ``kept``


class Uploads:
    """The chunked messages on their way to one receiver, by key."""

    def __init__(
        self,
        *,
        clock: Clock,
        keep: bool,
        max_bytes: int,
        max_uploads: int,
        idle_timeout: float,
        allow_encrypted: bool = False,
    ) -> None:
        self.clock = clock
        self.keep = keep
        self.allow_encrypted = allow_encrypted  # let an end-to-end encrypted message through (payload.ENCRYPTED)
        self.max_bytes = max_bytes  # bytes one sender may have held here
        self.max_uploads = max_uploads  # messages one sender may have open here
        self.idle_timeout = idle_timeout
        self._uploads: dict[str, Upload] = {}
        self._held: dict[str, int] = {}  # bytes held per sender
        self._open: dict[str, int] = {}  # uploads per sender

    def __len__(self) -> int:
        return len(self._uploads)

    @property
    def held_bytes(self) -> int:
        return sum(self._held.values())

    def create(self, sender: str, key: str, *, overwrite: bool = False) -> None:
        self._expire()
        upload = self._uploads.get(key)
        if upload is not None:
            if upload.sender != sender:
                raise PermissionDenied(f"Message key {key!r} is in use by another sender")
            if not overwrite:
                raise ProtocolError(f"Message with the same key ({key}) already exists")
            self._drop(key)
        if self._open.get(sender, 0) >= self.max_uploads:
            raise LimitExceeded(f"Too many chunked messages: a sender may have at most {self.max_uploads} open")
        self._uploads[key] = Upload(sender, self.clock.monotonic())
        self._open[sender] = self._open.get(sender, 0) + 1

    def add(self, sender: str, key: str, index: int | None, data: bytes) -> None:
        """One piece; ``index`` ``None`` appends it after the pieces received so far."""
        upload = self._owned(sender, key)
        if index is None:
            index = upload.count
        if not isinstance(index, int) or isinstance(index, bool) or index < upload.next_index:
            raise ProtocolError(f"Message {key!r}: piece {index!r} is out of range or came twice")
        if index in upload.ahead:
            raise ProtocolError(f"Message {key!r}: piece {index} came twice")
        upload.count += 1
        upload.touched = self.clock.monotonic()
        if index > upload.next_index:
            self._hold(upload, key, len(data))
            upload.ahead[index] = data
            return
        self._walk(upload, key, data)
        while upload.next_index in upload.ahead:
            piece = upload.ahead.pop(upload.next_index)
            self._release(upload, len(piece))
            self._walk(upload, key, piece)

    def finish(self, sender: str, key: str) -> bytes | None:
        """The message is complete and clean: forget it, and return it if kept."""
        upload = self._owned(sender, key)
        self._drop(key)
        scanner = upload.scanner
        if upload.ahead or not scanner.complete:
            raise ProtocolError(f"Message {key!r} is incomplete: pieces are missing")
        check_joined_header(scanner.header_types, ctx=scanner.header_ctx)
        check_keys(scanner.found, allow_encrypted=self.allow_encrypted)
        check_promise(decode_promise(scanner.promise), sender)
        return b"".join(upload.kept) if self.keep else None

    def take(self, sender: str, call: CacheCall) -> bytes | None:
        """One ``message_cache`` call of ``sender``; what :meth:`finish` returns for a ``process``."""
        if call.op == "create":
            self.create(sender, call.key, overwrite=call.overwrite)
        elif call.op in ("append", "set"):
            self.add(sender, call.key, call.index, call.data)
        elif call.op == "remove":
            self.remove(sender, call.key)
        else:
            return self.finish(sender, call.key)
        return None

    def remove(self, sender: str, key: str) -> None:
        self._owned(sender, key)
        self._drop(key)

    def forget(self, sender: str) -> None:
        """A sender left: what it had under way here goes."""
        for key in [k for k, u in self._uploads.items() if u.sender == sender]:
            self._drop(key)

    # -- bookkeeping ---------------------------------------------------------

    def _owned(self, sender: str, key: str) -> Upload:
        upload = self._uploads.get(key)
        if upload is None:
            raise ProtocolError(f"Message with key {key} does not exist: create it first")
        if upload.sender != sender:
            raise PermissionDenied(f"Message key {key!r} is in use by another sender")
        return upload

    def _walk(self, upload: Upload, key: str, data: bytes) -> None:
        try:
            upload.scanner.feed(data)
        except ProtocolError:
            self._drop(key)
            raise
        upload.next_index += 1
        if upload.scanner.values > MAX_VALUES:
            self._drop(key)
            raise LimitExceeded(f"Message {key!r} holds more than {MAX_VALUES} values: send large data as bytes")
        if self.keep:
            self._hold(upload, key, len(data))
            upload.kept.append(data)

    def _hold(self, upload: Upload, key: str, size: int) -> None:
        total = self._held.get(upload.sender, 0) + size
        if total > self.max_bytes:
            self._drop(key)
            raise LimitExceeded(f"Chunked messages of one sender may hold at most {self.max_bytes} bytes here")
        self._held[upload.sender] = total
        upload.held += size

    def _release(self, upload: Upload, size: int) -> None:
        upload.held -= size
        self._held[upload.sender] -= size

    def _drop(self, key: str) -> None:
        upload = self._uploads.pop(key, None)
        if upload is None:
            return
        sender = upload.sender
        self._held[sender] = self._held.get(sender, 0) - upload.held
        if not self._held[sender]:
            del self._held[sender]
        self._open[sender] -= 1
        if not self._open[sender]:
            del self._open[sender]

    def _expire(self) -> None:
        cutoff = self.clock.monotonic() - self.idle_timeout
        for key in [k for k, u in self._uploads.items() if u.touched < cutoff]:
            self._drop(key)


class Receivers:
    """The :class:`Uploads` of each client of one replica, by client id.

    A client's outlives its connection while it is ``alive`` (connected here,
    or in transit from here): hypha-rpc keeps its message cache across
    reconnections, so the walk of what is in it must go on where it stopped.
    """

    def __init__(
        self, *, clock: Clock, max_bytes: int, alive: Callable[[str], bool], allow_encrypted: bool = False
    ) -> None:
        self.clock = clock
        self.max_bytes = max_bytes
        self.alive = alive
        self.allow_encrypted = allow_encrypted
        self._by_client: dict[str, Uploads] = {}

    def __contains__(self, client: object) -> bool:
        return client in self._by_client

    def __len__(self) -> int:
        return len(self._by_client)

    def of(self, client: str) -> Uploads:
        uploads = self._by_client.get(client)
        if uploads is None:
            for gone in [c for c in self._by_client if not self.alive(c)]:
                del self._by_client[gone]  # a safety net: forget() is called as clients leave
            uploads = self._by_client[client] = Uploads(
                clock=self.clock,
                keep=False,
                max_bytes=self.max_bytes,
                max_uploads=MAX_OPEN_UPLOADS,
                idle_timeout=UPLOAD_IDLE_TIMEOUT,
                allow_encrypted=self.allow_encrypted,
            )
        return uploads

    def forget(self, client: str) -> None:
        """What was under way to ``client`` goes, unless it is still alive (it came back here)."""
        if not self.alive(client):
            self._by_client.pop(client, None)

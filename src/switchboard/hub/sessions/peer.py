"""One connected client, whatever carries its bytes (WebSocket or HTTP stream)."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

from switchboard.hub.identity.users import User
from switchboard.hub.sessions.life import Life
from switchboard.hub.sessions.send_queue import ClientConnection, SendQueue
from switchboard.protocol.hypha import envelope

log = logging.getLogger(__name__)

# Replies sent to a fresh connection (back from transit less than FRESH_GOODBYE ago, hub/sessions/life.py)
# that are kept to be sent again on the next
# (:meth:`Peer.note_reply`): hypha-rpc's listener stops reading the connection it
# closes as soon as the close handshake is done, dropping what it had not read yet,
# typically the reply to the very call whose sending opened that connection. A
# reply is safe to send twice (hypha-rpc ignores one for a session it has closed).
FRESH_REPLIES = 64
FRESH_REPLY_BYTES = 64 * 1024  # larger ones are not kept: at most 4 MiB per client, for a second


class Peer:
    """A client of the hub: its identity, its connection's life and send queue.

    Routing never awaits the client's socket: frames go through a bounded
    :class:`~switchboard.hub.sessions.send_queue.SendQueue`. A client that stops
    reading fills it, and when the queued bytes pass ``max_queue_bytes`` it is
    disconnected so that it cannot grow the server's memory or slow anyone else.
    What the hub's parts keep about a connection (its services, event
    subscriptions, frame rate, reconnection token ...) each part keeps itself,
    keyed by the peer and freed when the hub detaches it: nothing outside
    ``hub/sessions/`` writes a peer but the hub's :attr:`last_heard`.
    """

    # slots, not a __dict__ (1.5 KiB with this many attributes): thousands of idle clients have one each
    __slots__ = (
        "workspace", "client_id", "id", "user", "user_wire", "identity", "transport", "queue", "life",
        "unsent", "fresh_replies", "_on_close", "last_heard", "log",
    )  # fmt: skip

    def __init__(
        self,
        *,
        workspace: str,
        client_id: str,
        user: User,
        transport: ClientConnection,
        max_queue_bytes: int,
        replica_id: str = "",
        life: Life | None = None,
    ) -> None:
        self.workspace = workspace
        self.client_id = client_id
        self.id = f"{workspace}/{client_id}"
        self.user = user
        self.user_wire: dict[str, Any] = user.to_wire(workspace, client_id)
        self.identity = envelope.identity(self.id, workspace, self.user_wire)  # what its frames are stamped with
        self.transport = transport
        # its life from joining to gone (hub/sessions/life.py): the door's, made before its admission
        self.life = Life() if life is None else life
        self.queue = SendQueue(transport, max_bytes=max_queue_bytes, life=self.life, name=f"writer {self.id}")
        self.unsent: list[bytes] = []  # binary frames still queued when the connection was closed
        # see FRESH_REPLIES; made when the first is kept (thousands of idle connections keep none)
        self.fresh_replies: deque[bytes] | None = None
        # a future made when something waits for the close (closing()), not an asyncio.Event
        self._on_close: asyncio.Future[None] | None = None
        self.last_heard = 0.0  # when its last binary frame came in (the hub's clock; written by Hub.route_binary)
        self.log = logging.LoggerAdapter(log, {"client": self.id, "replica": replica_id})

    @property
    def closed(self) -> bool:
        return self.life.ended

    @property
    def close_code(self) -> int | None:
        return self.life.code

    @property
    def close_reason(self) -> str:
        return self.life.reason

    @property
    def queued_bytes(self) -> int:
        return self.queue.queued_bytes

    @property
    def writer(self) -> asyncio.Task[None] | None:
        """The task writing its waiting frames or its close, if one runs (:meth:`start_writing`)."""
        return self.queue.writer

    def send(self, frame: bytes | str) -> bool:
        """Queue a frame; ``False`` when the peer is closed or was just dropped as too slow."""
        if self.life.ended:
            return False
        if self.queue.push(frame):
            return True
        self.log.warning("send queue full (%d bytes queued): disconnecting slow client", self.queue.queued_bytes)
        self.close(1008, "Send queue full: client is not reading fast enough")
        return False

    def start_writing(self) -> None:
        """Frames go to the transport from now on (:meth:`SendQueue.start`: a writer task only while some wait)."""
        self.queue.start()

    async def run_writer(self) -> None:
        """Drain the queue into the transport until the peer is closed (:meth:`SendQueue.run`)."""
        await self.queue.run()

    def note_reply(self, frame: bytes, now: float) -> None:
        """A reply is on its way to this client: kept while the connection is fresh (:data:`FRESH_REPLIES`)."""
        if len(frame) <= FRESH_REPLY_BYTES and self.life.fresh(now):
            if self.fresh_replies is None:
                self.fresh_replies = deque(maxlen=FRESH_REPLIES)
            self.fresh_replies.append(frame)

    def leftovers(self, now: float) -> list[bytes]:
        """What this ended connection's client may still need, oldest first, handed out once: the
        replies it may not have read (only while fresh, :data:`FRESH_REPLIES`), then the frames
        never written (:attr:`unsent`)."""
        replies = list(self.fresh_replies or ()) if self.life.fresh(now) else []
        frames = [*replies, *self.unsent]
        self.fresh_replies = None
        self.unsent = []
        if replies:
            self.log.info("%d replies it may not have read wait for its next connection", len(replies))
        return frames

    def client_closed(self, code: int) -> None:
        """The client ended the connection (a close frame with ``code``, or the stream ended)."""
        if self.life.end_by_client(code):
            self._ended()

    def close(self, code: int = 1000, reason: str = "") -> None:
        """Ask the writer to flush nothing more and close the transport."""
        if self.life.end(code, reason):
            self._ended()

    def _ended(self) -> None:
        self.queue.wake()
        if self._on_close is not None and not self._on_close.done():
            self._on_close.set_result(None)
        # never handed to the transport: sent on if the client is in transit and comes back
        self.unsent = self.queue.take_unsent()

    async def wait_closed(self) -> None:
        await asyncio.shield(self.closing())  # a waiter cancelled is not the close cancelled

    def closing(self) -> asyncio.Future[None]:
        """A future done once the peer is closed: waited on with others, it needs no task of its own
        (a task per idle connection costs about a KiB)."""
        if self._on_close is None:
            self._on_close = asyncio.get_running_loop().create_future()
            if self.closed:
                self._on_close.set_result(None)
        return self._on_close

    def __repr__(self) -> str:
        return f"<Peer {self.id} queued={self.queue.queued_bytes}B closed={self.closed}>"

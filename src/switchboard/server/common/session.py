"""One client's life on this replica, written once for both doors (``/ws`` and ``GET /rpc``).

``async with ClientSession(state, hello, transport) as session:`` admits the
client, attaches its :class:`~switchboard.hub.sessions.peer.Peer` and tracks it (a drain
waits for the tracked ones to go); on the way out, whatever ends the block (the
client left, the hub closed it, an error, a cancel), it untracks the peer,
lets the door finish what the client sent before it left (:attr:`settle`), and
detaches it from the hub, exactly once.

A refusal (a bad token, a limit, an id held by another user, Redis out of
reach) comes out of the ``async with`` line as the hub raised it, with
:attr:`admitted` telling which step refused (:attr:`attached` tells a
refusal from a failure inside the block: both read the connection's
:class:`~switchboard.hub.sessions.life.Life`), and leaves nothing behind:
nothing is tracked and there is nothing to detach. Each door answers it in its
own terms (a close frame, an HTTP status). The session is entered once per
connection; the frames that follow never pass through it.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Protocol

from switchboard.backends.patience import patience
from switchboard.hub.sessions.life import Life, Stage
from switchboard.hub.sessions.peer import Peer
from switchboard.hub.sessions.send_queue import ClientConnection
from switchboard.protocol.hypha.handshake import Hello
from switchboard.server.process.server_state import ServerState


class Settling(Protocol):
    """What a door finishes before its client is detached (the connection's inbox)."""

    async def settle(self) -> None: ...


class ClientSession:
    """Admitted, attached and tracked inside the block; untracked and detached once after it.

    Slots: it lives as long as its connection, for each of thousands of idle clients.
    """

    __slots__ = ("_hello", "_life", "_peer", "_state", "_transport", "info", "settle")

    def __init__(self, state: ServerState, hello: Hello, transport: ClientConnection) -> None:
        self._state = state
        self._hello: Hello | None = hello
        self._transport: ClientConnection | None = transport
        self._peer: Peer | None = None
        self._life: Life | None = None  # the connection's, from before its admission
        #: the ``connection_info`` the client is owed first; the door drops it once sent
        self.info: dict[str, Any] | None = None
        #: awaited on the way out, after the untrack and before the detach: what the client
        #: sent before it left is routed while its peer is still attached
        self.settle: Settling | None = None

    @property
    def admitted(self) -> bool:
        """The hub admitted the client (a refusal after this came from the attach)."""
        return self._life is not None and self._life.stage >= Stage.ADMITTED

    @property
    def attached(self) -> bool:
        """The attach finished: what is raised from now on is no refusal."""
        return self._life is not None and self._life.was_live

    @property
    def peer(self) -> Peer:
        if self._peer is None:
            raise RuntimeError("the session has no peer outside its block")
        return self._peer

    async def __aenter__(self) -> ClientSession:
        hub = self._state.hub
        hello, transport = self._hello, self._transport
        if hello is None or transport is None:
            raise RuntimeError("a session is entered once")
        # neither is kept for the connection's life: the hello holds the client's token
        self._hello = self._transport = None
        # from before the stores are read until the join: a deletion or revocation notice meanwhile refuses it
        with hub.joining() as life:
            self._life = life
            with patience():  # a silent Redis turns the client away (to retry) within a second
                admitted = await hub.admit(hello, life)
            peer = Peer(
                workspace=admitted.workspace,
                client_id=hello.client_id,
                user=admitted.user,
                transport=transport,
                max_queue_bytes=hub.settings.send_queue_bytes,
                replica_id=hub.replica_id,
                life=life,
            )
            with patience():
                self.info = await hub.attach(peer, reconnecting=admitted.reconnecting, arrival=admitted.arrival)
        self._peer = peer
        self._state.track(peer)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        peer, self._peer = self._peer, None
        if peer is None:
            return  # left already
        self._state.untrack(peer)
        try:
            if (settle := self.settle) is not None:
                self.settle = None
                await settle.settle()
        finally:
            await self._state.hub.detach(peer)

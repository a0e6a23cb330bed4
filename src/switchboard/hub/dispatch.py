"""Carrying out the router's actions: the hub's hands.

:class:`~switchboard.hub.routing.router.Router` decides where a frame goes;
:class:`Dispatch` sends it there: into a client's :class:`~switchboard.hub.sessions.peer.Peer`,
over a direct link or the bus (:class:`~switchboard.replicas.dataplane.remote.Remote`), into
the holding of a client in transit (:class:`~switchboard.hub.transit.moves.Moves`),
the retry window or the manager's RPC. What needs no waiting is done at once;
what must wait (a publish, a broadcast) is handed back as an awaitable, or run
as a task where nothing can wait (a bus callback, a timer). It decides
nothing: what a step turns up (a connection that refused, a publish that
reached nobody, a registry's answer) goes back to the router as a fact, and
the next action is the router's. It also takes in what other replicas route
here, through the router like everything else.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from contextvars import ContextVar
from typing import Any

from switchboard.errors import ProtocolError
from switchboard.hub.manager.acting import Acting
from switchboard.hub.routing.actions import (
    Action,
    BindFirst,
    Broadcast,
    Deliver,
    Fail,
    Forward,
    Hold,
    RetryIfClaimed,
    RetryLater,
    Send,
    SendToken,
    ToAlias,
    ToManager,
    ToReplica,
)
from switchboard.hub.routing.router import Router
from switchboard.hub.routing.undelivered import Undelivered, undelivered_of
from switchboard.hub.sessions.peer import Peer
from switchboard.hub.sessions.subscribers import Subscribers
from switchboard.hub.transit.moves import Moves
from switchboard.hub.transit.retry import RetryWindow
from switchboard.metrics import HubMetrics
from switchboard.protocol.hypha import envelope, handshake
from switchboard.protocol.link import relay, replica_wire
from switchboard.replicas.dataplane.remote import Remote
from switchboard.tasks import spawn

log = logging.getLogger(__name__)


# Listeners a broadcast is written to in one turn of the event loop (about 2 to 5 ms of writes).
BROADCAST_TURN = 256

# Context-local, not global state: set around one HTTP call, inherited by the
# tasks the manager's RPC creates to send that call's frames.
ACTING_AS: ContextVar[Acting | None] = ContextVar("switchboard_acting_as", default=None)

Later = Coroutine[Any, Any, Any]


class Dispatch:
    """Executes :class:`~switchboard.hub.routing.router.Action` values (see the module docstring).

    ``subscribers`` (who here listens to which workspace event) and ``aliases``
    (HTTP callers by address) are the hub's tables, read only; ``to_manager`` hands a frame to
    the manager's door, ``token`` signs a client's reconnection token.
    """

    def __init__(
        self,
        *,
        router: Router,
        remote: Remote,
        moves: Moves,
        retry: RetryWindow,
        replies: RetryWindow,
        to_manager: Callable[[bytes, Peer | None, envelope.Envelope | None], None],
        subscribers: Subscribers,
        aliases: Mapping[str, Acting],
        metrics: HubMetrics,
        token: Callable[[Peer], str],
        manager_user: dict[str, Any] | None = None,
        bind_first: Callable[[Peer, str], None] | None = None,
    ) -> None:
        self.router = router
        self.remote = remote
        self.moves = moves
        self.retry = retry
        self.replies = replies  # manager replies for other replicas that reached nobody (yet)
        self.to_manager = to_manager  # the manager's door: its RPC, with the frame's caller
        self.subscribers = subscribers
        self.aliases = aliases
        self.metrics = metrics
        self.token = token
        self.manager_user = manager_user or {}  # the user the manager's frames carry (root)
        # looks a balanced handle up for a caller and routes what waited for it (BindFirst)
        self.bind_first = bind_first or self._cannot_bind
        self.replica_id = router.replica_id
        self._background: set[asyncio.Task[Any]] = set()
        self._broadcasts: deque[tuple[list[Peer], bytes]] = deque()  # waiting for their turns, oldest first
        self.log = logging.LoggerAdapter(log, {"replica": self.replica_id})

    def run(self, action: Action | None) -> Later | None:
        """Do ``action`` as far as it goes without waiting; return the rest, to be awaited in order."""
        while action is not None:
            # type() and "is", not match: this runs for every frame, and costs a quarter as much
            if type(action) is Deliver:
                peer, item = action.peer, action.item
                if peer.send(item.frame):
                    self.metrics.frames.routed += 1
                    return None
                action = self.router.refused(peer, item)  # its connection just ended
                continue
            if type(action) is Forward:
                item = action.item
                if not item.event and self.remote.send_direct(action.target, action.wire, item.caller):
                    self.metrics.frames.routed += 1
                    return None
                return self._publish(action)
            if type(action) is Send:
                action.peer.send(action.message)
                return None
            if type(action) is Hold:
                if self.moves.hold(action.target, action.item, begins=action.begins):
                    return None
                action = action.otherwise
            elif type(action) is RetryLater:
                self.retry.add(action.target, action.item)
                return None
            elif type(action) is Fail:
                action = self.router.undeliverable(action.target, action.item.session, action.item.caller)
            elif type(action) is RetryIfClaimed:
                return self._retry_if_claimed(action.target, action.item)
            elif type(action) is ToManager:
                self._to_manager(action)
                return None
            elif type(action) is ToAlias:
                if (acting := self.aliases.get(action.address)) is not None:
                    self.receive_as(acting, action.frame)
                return None
            elif type(action) is ToReplica:
                self._to_replica(action)
                return None
            elif type(action) is Broadcast:
                return self.broadcast(action.workspace, action.event_type, action.frame)
            elif type(action) is SendToken:
                action.peer.send(handshake.reconnection_token_text(self.token(action.peer)))
                return None
            elif type(action) is BindFirst:
                self.bind_first(action.peer, action.target)
                return None
            else:
                raise TypeError(f"not an action: {action!r}")
        return None

    def _cannot_bind(self, peer: Peer, target: str) -> None:
        for action in self.router.bound(peer, target, "balanced handles are not served here"):
            self.carry(action)

    def carry(self, action: Action | None) -> None:
        """:meth:`run` where nothing can wait: what is left runs as a task."""
        rest = self.run(action)
        if rest is not None:
            spawn(self._background, rest)

    async def deliver(self, target: str, item: Undelivered) -> None:
        """Send a frame to one client here or on another replica; fail its caller fast if nobody has it."""
        rest = self.run(self.router.toward(target, item))
        if rest is not None:
            await rest

    async def _publish(self, forward: Forward) -> None:
        """Through the bus (the link was tried, or it is an event); what a publish that reached
        nobody becomes is the router's to say."""
        if await self.remote.publish_to_client(forward.target, forward.wire, link=False):
            self.metrics.frames.routed += 1
            return
        self.metrics.publishes_to_nobody.inc()
        rest = self.run(self.router.reached_nobody(forward))
        if rest is not None:
            await rest

    async def _retry_if_claimed(self, target: str, item: Undelivered) -> None:
        """Read whether some replica claims ``target``, and do what the router makes of it."""
        claimed = await self.remote.worth_retrying(target)
        self.carry(self.router.claim_read(target, item, claimed=claimed))

    def give_up(self, target: str, item: Undelivered) -> None:
        """The retry window (or a holding) could not deliver ``item``: its caller is told."""
        self.carry(Fail(target, item))

    def _to_replica(self, action: ToReplica) -> None:
        """A reply for another replica's manager: over a link at once, else by ``replies`` in its
        own task (at once behind those already waiting there: the router's ``behind``).

        Never awaited on the provider's path: a publish Redis does not answer
        (a replica cut off from it) would hold up the provider's every later
        frame, its replies to callers here included. One that reaches nobody
        (the replica's subscription is being re-wired, Redis restarted) is
        retried as a client's frame is, instead of leaving its caller to its
        whole timeout.
        """
        if action.behind or not self.remote.send_to_replica(action.replica, action.frame):
            self.replies.add(action.replica, Undelivered(action.frame, None, ""))

    def _to_manager(self, action: ToManager) -> None:
        """Into the manager's door; a callback addressed to the manager within a workspace
        (:func:`~switchboard.protocol.link.relay.manager_in_workspace`) is answered from that address."""
        env = action.env
        if env is None:
            try:
                env = envelope.decode(action.frame)
            except ProtocolError:
                self.to_manager(action.frame, action.caller, None)  # the door drops it, saying why
                return
        ws = relay.manager_in_workspace(env.main.get("to"), env.main.get("method"), self.router.manager_id)
        if ws is None or ACTING_AS.get() is not None:
            self.to_manager(action.frame, action.caller, env)
            return
        token = ACTING_AS.set(Acting(f"{ws}/{self.router.manager_id}", ws, self.manager_user))
        try:
            self.to_manager(action.frame, action.caller, env)
        finally:
            ACTING_AS.reset(token)

    def receive_as(self, acting: Acting, frame: bytes) -> None:
        """A frame for an HTTP caller: its calls live in the manager's RPC, which answers as the caller.

        The caller's address is an alias of the manager. Besides replies, a
        provider sends it the ``get_service("<address>:built-in")`` call with
        which it starts a reply too large for one frame; the RPC answers only
        calls addressed to its own id, and the provider accepts the answer only
        from the address it asked. So the frame goes in addressed to the
        manager, and what the RPC sends in answer leaves from the alias.
        """
        try:
            env = envelope.decode(frame)
        except ProtocolError as exc:
            self.log.info("dropped a frame for %s: %s", acting.address, exc)
            return
        env.main["to"] = self.router.manager_address
        token = ACTING_AS.set(acting)  # inherited by the tasks the RPC starts to answer
        try:
            self.to_manager(envelope.encode(env.main, env.rest), None, None)
        finally:
            ACTING_AS.reset(token)

    # -- broadcasts --------------------------------------------------------------

    async def broadcast(self, workspace: str, event_type: str, frame: bytes) -> None:
        """Deliver an event to every subscribed client of ``workspace`` on every replica."""
        self._broadcast_here(workspace, event_type, frame)
        await self.remote.publish_message(replica_wire.WorkspaceEvent(workspace, self.replica_id, frame))

    def _broadcast_here(self, workspace: str, event_type: str, frame: bytes) -> None:
        """Write ``frame`` to its listeners here (not the whole workspace): at once if they are
        few and nothing waits before it, else in turns of :data:`BROADCAST_TURN` listeners, in the
        order the broadcasts came (each listener sees them in that order), so the loop serves the
        rest between turns. Thousands of departures announced to thousands of listeners (a drain
        whose clients passed their grace) held a replica's loop for 14 s at a time (issue 26)."""
        listeners = self.subscribers.of(workspace, event_type)
        if len(listeners) <= BROADCAST_TURN and not self._broadcasts:
            for peer in listeners:
                peer.send(frame)
            return
        self._broadcasts.append((list(listeners), frame))
        if len(self._broadcasts) == 1:
            spawn(self._background, self._write_broadcasts())

    async def _write_broadcasts(self) -> None:
        while self._broadcasts:
            listeners, frame = self._broadcasts[0]
            for start in range(0, len(listeners), BROADCAST_TURN):
                for peer in listeners[start : start + BROADCAST_TURN]:
                    peer.send(frame)
                await asyncio.sleep(0)  # a turn of the loop for everything else
            self._broadcasts.popleft()

    # -- what other replicas send here -------------------------------------------

    def from_replica_to_client(self, peer: Peer, data: bytes) -> None:
        """A frame another replica routed to one of our clients (its channel's subscriber)."""
        action = self.router.relayed(peer, data)
        if type(action) is Send:  # nearly always: straight into the client's connection
            action.peer.send(action.message)
        else:
            self.carry(action)

    def from_replica_to_manager(self, frame: bytes) -> None:
        """A reply to a call our manager made, via the provider's replica (our replica channel)."""
        self.carry(self.router.manager_reply(frame))

    def from_replica_broadcast(self, origin: str, frame: bytes) -> None:
        """A broadcast another replica (``origin``) published for a workspace with members here."""
        if origin == self.replica_id:
            return
        try:
            env = envelope.decode(frame)
        except ProtocolError as exc:
            self.log.warning("dropped a malformed broadcast from %r: %s", origin, exc)
            return
        workspace = str(env.main.get("to", "")).partition("/")[0]
        if env.main.get("to") == "*":
            workspace = str(env.main.get("ws", ""))
        self._broadcast_here(workspace, env.type, frame)

    async def take_lost(self) -> None:
        """Until the unicast closes: frames it had counted as delivered that reached nobody after all."""
        async for target, data in self.remote.lost():
            self.undelivered(target, data)

    def undelivered(self, target: str, data: bytes) -> None:
        """A frame the bus had counted as delivered reached nobody after all: the same path as a
        publish to nobody."""
        item = undelivered_of(data)
        if item is None:
            return
        self.metrics.publishes_to_nobody.inc()
        retried = Undelivered(item.frame, item.session, item.caller, op=item.op)
        self.carry(self.router.lost(target, retried))

    def __repr__(self) -> str:
        return f"<Dispatch replica={self.replica_id} tasks={len(self._background)}>"

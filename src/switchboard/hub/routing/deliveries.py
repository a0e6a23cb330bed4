"""The router's part in a frame for one client, wherever it is: here, on another replica, in
transit; and what the I/O turned up on the way (a publish that reached nobody, a frame lost
after delivery, a connection that refused, the registry's claim), each a fact that gets the next
action. Decisions only, as the rest of the :class:`~switchboard.hub.routing.router.Router`,
which this completes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from switchboard.hub.routing import balance
from switchboard.hub.routing.actions import (
    Action,
    Deliver,
    Fail,
    Forward,
    Hold,
    RetryIfClaimed,
    RetryLater,
    Send,
    ToAlias,
    ToManager,
)
from switchboard.hub.routing.chunk_routes import ChunkRoutes
from switchboard.hub.routing.undelivered import Undelivered
from switchboard.protocol.hypha import envelope
from switchboard.protocol.link import replica_wire

if TYPE_CHECKING:
    from switchboard.hub.sessions.peer import Peer


class Deliveries(ChunkRoutes):
    """A frame's way to one client, a part of :class:`~switchboard.hub.routing.router.Router`."""

    def toward(self, target: str, item: Undelivered, *, new_call: bool = False) -> Action | None:
        """Where a frame for the client ``target`` goes from here.

        An event (a point-to-point emit) never takes a direct link (see
        :class:`Forward`), so it cannot overtake a broadcast its sender emitted before it.
        A piece of a chunked message for a client here is walked first (:meth:`_walked`).
        """
        if target in self.aliases:
            return ToAlias(target, item.frame)
        peer = self.peers.get(target)
        if peer is not None:
            if (
                item.session is None
                and not replica_wire.plain(item.frame)
                and (replica_wire.is_manager_call(item.frame) or replica_wire.is_bounced(item.frame))
            ):
                # another replica's manager call (or a call of this client's bounced back), held
                # wrapped for a client that came back here: as if it had just come off the bus
                return self.relayed(peer, item.frame)
            if self.draining and new_call and not peer.closed:
                # this replica is going away: the call waits for the client to reappear
                # elsewhere, and is no longer in flight here (the drain must not wait for it)
                self.inflight.closed(item.caller, item.session or "")
                return RetryLater(target, self._travelling(item))
            if item.op is not None:
                return self._walked(peer, item)
            return Deliver(peer, item)
        if target in self.transit:  # it is moving between connections: the frame waits for it
            return Hold(target, item, self.elsewhere(target, item))
        return self.elsewhere(target, item)

    def elsewhere(self, target: str, item: Undelivered) -> Action:
        """A client that is not here: behind frames already waiting for it, else to its replica."""
        travelling = self._travelling(item)
        if self.retry.pending(target):  # keep order
            return RetryLater(target, travelling)
        return Forward(target, item, travelling.frame)

    def _travelling(self, item: Undelivered) -> Undelivered:
        """``item`` as it travels to another replica: a call the manager makes (itself, or for an
        HTTP caller) carries its origin, so that the reply finds its way back here
        (:mod:`switchboard.protocol.link.relay`). Wrapped here, once per trip; never for a client here."""
        if item.session and (item.caller == self.manager_address or item.caller in self.aliases):
            return item._replace(
                frame=replica_wire.wrap_manager_call(self.replica_id, item.session.partition(".")[0], item.frame)
            )
        return item

    # -- after the I/O: what a publish, a delivery or a registry read found ----------

    def reached_nobody(self, forward: Forward) -> Action:
        """A :class:`Forward` whose publish no replica received: the frame waits for a client in
        transit, else is retried while some replica claims the client (its subscription may be
        seconds from repair), as it was wrapped for the trip, else its caller fails."""
        target, item = forward.target, forward.item
        if (resent := self._balanced_elsewhere(target, item)) is not None:
            return resent
        travelling = item if forward.wire is item.frame else item._replace(frame=forward.wire)
        otherwise = self._if_claimed(target, travelling)
        return Hold(target, item, otherwise) if target in self.transit else otherwise

    def lost(self, target: str, item: Undelivered) -> Action | None:
        """A frame the bus had counted as delivered reached nobody after all (its connection
        ended first): held if the client is moving, else behind what already waits for it, else
        as a publish to nobody."""
        if (resent := self._balanced_elsewhere(target, item)) is not None:
            return resent
        travelling = self._travelling(item)
        otherwise = (
            RetryLater(target, travelling) if self.retry.pending(target) else self._if_claimed(target, travelling)
        )
        return self.hold(target, item, otherwise)

    def _if_claimed(self, target: str, item: Undelivered) -> Action:
        """Retried while some replica claims the client, if there is a retry window; else failed."""
        return RetryIfClaimed(target, item) if self.retry.window > 0 else Fail(target, item)

    def refused(self, peer: Peer, item: Undelivered) -> Action | None:
        """A client's connection here refused a frame (it just ended): held for its return, else failed."""
        return self.hold(peer.id, item, Fail(peer.id, item))

    def hold(self, target: str, item: Undelivered, otherwise: Action | None) -> Action | None:
        """A frame for a client whose connection may just have ended: held if the client is in
        transit, or if its connection here ended in a way it comes back from (:meth:`Life.expected_back`:
        its transit begins now, :attr:`Hold.begins`, before the hub's clean-up tells the registry);
        else ``otherwise``."""
        if target in self.transit:
            return Hold(target, item, otherwise)
        peer = self.peers.get(target)
        if peer is not None and peer.life.expected_back(self.clock.monotonic(), grace=self.transit.grace):
            return Hold(target, item, otherwise, begins=True)
        return otherwise

    def claim_read(self, target: str, item: Undelivered, *, claimed: bool) -> Action:
        """The registry's answer to :class:`RetryIfClaimed`: a client some replica claims (or
        one the registry cannot vouch for now) is retried; one nobody claims fails its caller."""
        return RetryLater(target, item) if claimed else Fail(target, item)

    def undeliverable(self, target: str, session: str | None, caller: str) -> Action | None:
        """Nobody has ``target``: a caller that waits is told at once; fire-and-forget frames are
        dropped (a reject for each would start a storm)."""
        self.metrics.undeliverable.inc()
        if not session:
            return None
        message = f"Target peer {target} is not connected"
        if self.balanced.has(caller, session):
            step = self.balanced.failed(caller, session, target)
            if step is None:  # a frame for an instance the call has left: it goes on elsewhere
                return None
            if isinstance(step, balance.Resend):
                return self._resent(step)
            message, target = step.message, step.target
        self.inflight.closed(caller, session)
        reject = envelope.reject_frame(session=session, target=target, caller=caller, message=message)
        if caller == self.manager_address or caller in self.aliases:
            return ToManager(reject)
        if (sender := self.peers.get(caller)) is not None:
            return Send(sender, reject)
        if "/" in caller:  # a frame another replica sent here (held for a client in transit)
            return self.toward(caller, Undelivered(reject, None, target))
        return None

    def _noted(self, action: Action | None) -> Action | None:
        """A reply about to be written to a client here is noted by its connection (:meth:`Peer.note_reply`)."""
        if isinstance(action, Deliver) and action.peer.life.returned:  # else not fresh: no clock read
            action.peer.note_reply(action.item.frame, self.clock.monotonic())
        elif isinstance(action, Send) and action.peer.life.returned and isinstance(action.message, bytes):
            action.peer.note_reply(action.message, self.clock.monotonic())
        return action

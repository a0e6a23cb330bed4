"""The router's part in frames other replicas routed here: to a client of this replica (as they
came off the bus or a link), and replies to calls this replica's manager made. Decisions only, as
the rest of the :class:`~switchboard.hub.routing.router.Router`, which this completes.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from switchboard.errors import ProtocolError
from switchboard.hub.routing import balance
from switchboard.hub.routing.actions import Action, Send, ToManager
from switchboard.hub.routing.deliveries import Deliveries
from switchboard.hub.routing.undelivered import Undelivered
from switchboard.protocol.hypha import envelope
from switchboard.protocol.hypha.calls import CALL, REPLY, Traits, classify
from switchboard.protocol.link import relay, replica_wire

if TYPE_CHECKING:
    from switchboard.hub.sessions.peer import Peer

log = logging.getLogger(__name__)


class RelayedRoutes(Deliveries):
    """Frames from other replicas, a part of :class:`~switchboard.hub.routing.router.Router`."""

    def relayed(self, peer: Peer, data: bytes) -> Action | None:
        """A frame another replica routed to a client here (as it came off the bus or a link).

        Calls into and replies to our clients count as in flight; the pieces
        of a chunked message pass the client's uploads; a frame for a
        connection that just ended waits for its client if it is in transit,
        and a call to a client that left fails at once, not at its timeout.
        """
        handle = origin = None
        frame = data
        if not replica_wire.plain(data):  # wrapped by a replica: nearly never
            if replica_wire.is_bounced(data):
                return self._bounced_back(peer, data)
            try:
                handle, data = replica_wire.unwrap_balanced(
                    data
                )  # a balanced call, with the handle it was made through
                origin, origin_session, frame = relay.unwrap(data)
            except ProtocolError as exc:
                peer.log.warning("dropped a relayed frame: %s", exc)
                return None
            if origin is not None and origin_session is not None:
                self.reply_routes.remember(origin_session, origin)
        try:
            env = envelope.decode(frame)
        except ProtocolError:
            return None if peer.closed else Send(peer, frame)  # not ours to judge: its receiver drops it
        caller, session = env.main.get("from"), env.session
        traits = classify(env.main.get("method"), session, env.rest)
        # the manager's own frames (a call stays wrapped with its origin) are the hub's, as
        # from_manager's are here; every other piece is walked as it reaches the client
        op = traits.op if origin is None else None
        if peer.closed:
            # a manager call stays wrapped with its origin: sent on, it still finds its way back
            item = (
                Undelivered(data, None, "", False)
                if origin is not None
                else Undelivered(frame, session, str(caller or ""), env.type != "method", op)
            )
            unrun = frame if traits.kind is CALL and origin is None else None  # a client's call: it never ran
            return self.hold(peer.id, item, self._bounce(peer.id, unrun, session, caller))
        if op is not None:
            refused = self.upload_refusal(peer, str(caller or ""), op, env.rest)
            if refused is not None:
                return self._refused(peer.id, Undelivered(frame, session, str(caller or "")), refused)
        if traits.kind is CALL:
            self.inflight.opened(str(caller), session, peer.id, self.peers)  # type: ignore[arg-type]
            if handle is not None and session:
                self.served.took(peer.id, str(caller), session, handle)
        else:
            method = session_method(env.main.get("method"), traits)
            if self.balanced and (handle := self.balanced.relabel(peer.id, method, caller)) is not None:
                if handle != caller:  # else the instance's replica labelled it (routing.served)
                    env.main["from"] = handle  # within a balanced call: from the handle the caller called
                    frame = envelope.encode(env.main, env.rest)
                if traits.answers is not None:
                    self.balanced.closed(peer.id, traits.answers)
            if traits.answers is not None and self.inflight.busy(peer.id):
                self.inflight.closed(peer.id, traits.answers)
        send = Send(peer, frame)
        return self._noted(send) if traits.kind is REPLY else send

    def _bounce(self, target: str, call: bytes | None, session: str | None, caller: Any) -> Action | None:
        """A frame that reached this replica as its client left: its caller is told. A client's
        ``call`` never ran: it goes back to its caller's replica, which knows whether another
        instance may take it (:meth:`_bounced_back`, which keeps the call), with the reject that
        fails it otherwise (all a replica of a release before bounced calls reads); any other
        frame's caller fails now."""
        if not session or not isinstance(caller, str) or "/" not in caller:
            return None
        reject = envelope.reject_frame(
            session=session, target=target, caller=caller, message=f"Target peer {target} is not connected"
        )
        if call is not None:
            return self.toward(caller, Undelivered(replica_wire.wrap_bounced(target, reject), None, target))
        return self.toward(caller, Undelivered(reject, None, target))

    def _bounced_back(self, peer: Peer, data: bytes) -> Action | None:
        """A call of ``peer``'s that reached its callee's replica as the callee left: a balanced one
        goes to another instance, idempotent or not (it never ran), and fails with the clear error
        only when none is left; any other fails now, the callee not connected."""
        try:
            callee, reject = replica_wire.unwrap_bounced(data)
            session = relay.session_root(envelope.decode(reject).main.get("method"))
        except ProtocolError as exc:
            peer.log.warning("dropped a bounced call: %s", exc)
            return None
        if not session:
            return None
        if self.balanced.has(peer.id, session):
            step = self.balanced.failed(peer.id, session, callee)
            if step is None:  # the call went on elsewhere already
                return None
            self.inflight.closed(peer.id, session)
            if isinstance(step, balance.Resend):
                return self._resent(step)
            reject = envelope.reject_frame(session=session, target=step.target, caller=peer.id, message=step.message)
        self.inflight.closed(peer.id, session)
        return self.toward(peer.id, Undelivered(reject, None, callee))

    def manager_reply(self, frame: bytes) -> Action | None:
        """A reply (or a piece of one) to a call our manager made, sent back by the provider's replica."""
        try:
            env = envelope.decode(frame)
        except ProtocolError as exc:
            log.warning("dropped a malformed manager reply: %s", exc, extra={"replica": self.replica_id})
            return None
        answers = classify(env.main.get("method"), env.session, env.rest).answers
        if answers is not None:
            self.inflight.closed(self.manager_address, answers)
        return ToManager(frame)


def session_method(method: Any, traits: Traits) -> Any:
    """The method a frame's session is read from: a reply in pieces names it as the key of its ``process``."""
    if traits.op == "process" and traits.answers is not None:
        return f"{traits.answers}.resolve"
    return method

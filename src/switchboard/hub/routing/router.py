"""Where a frame goes: the hub's routing decisions, as values, without I/O.

The hub hands the :class:`Router` a sender and a frame and gets back one
action: deliver it to a client here, forward it to another replica, hold it
for a client in transit, retry it later, hand it to the manager (here or on
the replica whose manager made the call), broadcast it, or answer the sender
(an error, a reject, a pong): the values of :mod:`switchboard.hub.routing.actions`.
What the I/O turns up (a connection that refused, a publish that reached
nobody, a frame lost after delivery, the registry's claim) comes back here as
a fact and gets the next action; so do whether a frame is held for a client
that may be moving and the frame as it travels to another replica.
The hub carries the action out (:mod:`switchboard.hub.dispatch`). The router owns what its decisions depend
on that is not I/O: the calls in flight, the limits, which replica's manager
a reply belongs to, and the one classification of frames (:func:`classify`);
it reads, and never changes, the hub's tables (clients here, HTTP callers,
clients in transit, targets waiting in the retry window).

Nothing here awaits, so every rule is tested synchronously
(``tests/hub/test_router.py``; after the I/O, ``tests/hub/test_after_io.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Container, Mapping
from typing import TYPE_CHECKING, Any

from switchboard.errors import EncryptedPayload, LimitExceeded, PermissionDenied, ProtocolError
from switchboard.hub.identity.users import Permission
from switchboard.hub.routing import balance
from switchboard.hub.routing.actions import (
    Action,
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
from switchboard.hub.routing.balanced_routes import BalancedRoutes
from switchboard.hub.routing.inflight import InFlight
from switchboard.hub.routing.reply_routes import ReplyRoutes
from switchboard.hub.routing.undelivered import Undelivered
from switchboard.hub.routing.uploads import Receivers
from switchboard.hub.sessions.in_transit import Transit
from switchboard.protocol.hypha import envelope, handshake
from switchboard.protocol.hypha.calls import CALL, REPLY, Traits, classify
from switchboard.protocol.hypha.chunks import overwriting, parse_cache_call, piece_header
from switchboard.protocol.hypha.payload import payload_map
from switchboard.protocol.link import relay

if TYPE_CHECKING:  # named in signatures only: the router itself loads nothing with I/O (tests/test_layers.py)
    from switchboard.clock import Clock
    from switchboard.config import Settings
    from switchboard.hub.sessions.in_transit import Waiting as RetryWindow
    from switchboard.hub.sessions.peer import Peer
    from switchboard.metrics import HubMetrics

log = logging.getLogger(__name__)

# -- the router ---------------------------------------------------------------


class Router(BalancedRoutes):
    """The routing decisions of one replica (see the module docstring).

    ``peers`` (clients here), ``aliases`` (HTTP callers' addresses),
    ``transit``, ``retry`` and ``replies`` are the hub's, read only. ``draining`` is set
    by the drain: new calls to clients here then wait for them to reappear
    elsewhere.
    """

    def __init__(
        self,
        *,
        settings: Settings,
        clock: Clock,
        metrics: HubMetrics,
        peers: Mapping[str, Peer],
        aliases: Container[str],
        transit: Transit[Undelivered],
        retry: RetryWindow,
        replies: RetryWindow | None = None,
        inflight: InFlight | None = None,
        balanced: balance.Balanced | None = None,
        uploads: Receivers | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.metrics = metrics
        self.replica_id = settings.replica_id
        self.manager_id = settings.manager_id
        self.manager_address = f"*/{self.manager_id}"
        self.peers = peers
        self.aliases = aliases
        self.transit = transit
        self.retry = retry
        self.replies = replies  # manager replies waiting for another replica (ToReplica)
        self.inflight = inflight if inflight is not None else InFlight()
        self.reply_routes = ReplyRoutes(clock)  # session -> the replica whose manager made the call
        # chunked messages on their way to each client here or in transit from here
        self.uploads = uploads or Receivers(
            clock=clock,
            max_bytes=settings.max_upload_bytes,
            alive=lambda c: c in self.peers or c in self.transit,
            allow_encrypted=settings.allow_encrypted_payloads,
        )
        self.balanced = balanced if balanced is not None else balance.Balanced()
        metrics.watch_balanced(self.balanced)  # the balanced handles of our callers, and their calls in flight
        self.draining = False
        s = settings
        self._rate_refusal = (
            f"Rate limit exceeded: at most {s.max_messages_per_second:g} messages/s (burst {s.message_burst})"
        )
        self._pending_refusal = f"Too many pending calls: at most {s.max_pending_calls} may wait for a reply"

    # -- a client's own frames -------------------------------------------------

    def text(self, peer: Peer, text: str) -> Action | None:
        """A text control frame. Each takes from the client's rate bucket, as a binary
        frame does: over the limit it gets an error frame instead of an answer."""
        if peer.rate is not None and not peer.rate.take():
            self.metrics.rate_limited.inc()
            return Send(peer, handshake.error_text(self._rate_refusal))
        kind = handshake.parse_control(text)
        if kind == "ping":
            return Send(peer, handshake.PONG)
        if kind == "refresh_token":
            return SendToken(peer)
        peer.log.debug("ignored unknown text frame (%d chars)", len(text))
        return None

    def route(self, peer: Peer, data: bytes) -> Action | None:
        """Where a binary frame from ``peer`` goes, stamped at the trust boundary; ``None``: nowhere.

        A bad frame is answered with an error frame (the connection stays), a
        refused call with a reject for its session.
        """
        virtual: str | None = None  # a balanced handle's address: the sender's refusals come from it
        try:
            env = envelope.decode(data)
            route = envelope.route(env.main.get("to"), sender_workspace=peer.workspace, manager_id=self.manager_id)
            if route.kind == "broadcast" and (
                route.workspace != peer.workspace or not peer.user.can(peer.workspace, Permission.READ_WRITE)
            ):  # events go to one's own workspace, and need read-write there (§3.5 rule 6)
                raise PermissionDenied(f"Permission denied: cannot broadcast into workspace {route.workspace}")
            if route.kind == "client" and balance.is_virtual(route.target):
                virtual, instance = route.target, self._instance_for(peer, env)
                if instance is None:
                    why = (
                        f"{virtual} is a balanced handle: it takes calls only, from the connection that looked "
                        "the service up, while an instance it may reach is left (look the service up again)"
                    )
                    return Send(peer, self._refusal(peer, env.session, virtual, why))
                route = envelope.Route("client", instance, instance.partition("/")[0])
            frame = envelope.stamp(
                env, identity=peer.identity, to=route.target, allow_encrypted=self.settings.allow_encrypted_payloads
            )
        except (ProtocolError, PermissionDenied) as exc:
            self.metrics.bad_frames.inc()
            peer.log.info("rejected frame: %s", exc)
            if isinstance(exc, EncryptedPayload) and env.session:  # an honest client's call: it fails now, saying why
                return Send(peer, self._refusal(peer, env.session, virtual or route.target, str(exc)))
            return Send(peer, handshake.error_text(f"Invalid message: {exc}"))
        method, session, target = env.main.get("method"), env.session, route.target
        traits = classify(method, session, env.rest)
        refusal = self._over_limit(peer, traits, target)
        if refusal:
            self.metrics.rate_limited.inc()
            if session:
                return Send(
                    peer,
                    envelope.reject_frame(session=session, target=virtual or target, caller=peer.id, message=refusal),
                )
            return None
        if route.kind == "nowhere":
            self.metrics.bad_frames.inc()
            why = f"invalid target {target!r}: only the manager is addressed as {self.manager_address!r}; "
            return Send(peer, self._refusal(peer, session, target, why + "a client is '<workspace>/<client_id>'"))
        if route.kind == "manager":
            if traits.answers is not None:
                self.inflight.closed(target, traits.answers)
            return self._to_manager(peer, method, env, frame)
        if route.kind == "client":
            if traits.op == "create":
                frame = self._overwriting(env, peer, target, frame)
            new_call = traits.kind is CALL
            if new_call:
                self.inflight.opened(peer.id, session, target, self.peers)  # type: ignore[arg-type]
                if virtual is not None:
                    function = balance.function_of(method)
                    self.balanced.opened(peer.id, session, virtual, target, function, frame)  # type: ignore[arg-type]
                    if method == balance.BUILT_IN_LOOKUP:
                        self.balanced.expect_pieces(peer.id, target, virtual)
            elif traits.op in ("set", "append") and self.balanced.expects_pieces(peer.id, target):
                if (header := piece_header(traits.op, env.rest)) is not None:
                    self.balanced.piece_header(peer.id, target, header)
            elif self.balanced and (handle := self.balanced.relabel(target, _session_method(method, traits), peer.id)):
                env.main["from"] = handle  # within a balanced call: from the handle the caller called
                frame = envelope.encode(env.main, env.rest)
                if traits.answers is not None:
                    self.inflight.closed(target, traits.answers)
                    self.balanced.closed(target, traits.answers)
            elif traits.answers is not None:
                self.inflight.closed(target, traits.answers)
            item = Undelivered(frame, session, peer.id, env.type != "method", traits.op)
            action = self.toward(target, item, new_call=new_call)
            return self._noted(action) if traits.kind is REPLY else action
        if env.type == "method":
            return Send(peer, handshake.error_text("Invalid message: cannot broadcast a method call"))
        return Broadcast(route.workspace, env.type, frame)

    def _over_limit(self, peer: Peer, traits: Traits, target: str) -> str | None:
        """Why this frame is refused (rate or pending-call limit), or ``None``.

        A reply that answers a call still open is never refused: dropping it
        would punish the caller, who did nothing wrong, with a timeout.
        """
        if peer.rate is not None and not peer.rate.take():
            if traits.kind is REPLY and self.inflight.is_open(target, traits.answers):  # type: ignore[arg-type]
                return None
            return self._rate_refusal
        if traits.kind is CALL and self.inflight.pending(peer.id) >= self.settings.max_pending_calls:
            return self._pending_refusal
        return None

    def _refusal(self, peer: Peer, session: str | None, target: str, message: str) -> bytes | str:
        """A frame the hub will not deliver: its call fails now, with the reason."""
        if session:
            return envelope.reject_frame(session=session, target=target, caller=peer.id, message=message)
        return handshake.error_text(f"Invalid message: {message}")

    def _to_manager(self, peer: Peer, method: Any, env: envelope.Envelope, frame: bytes) -> Action:
        """A reply to a call another replica's manager made goes back to that replica.

        So do the ``message_cache`` calls that carry a reply too large for one
        frame: only the manager that made the call can put the chunks together.
        """
        session = relay.manager_session(method, env.rest)
        origin = self.reply_routes.origin_of(session) if session else None
        if origin is None or origin == self.replica_id:
            return ToManager(frame, peer, env)
        return ToReplica(origin, frame, self.replies is not None and self.replies.pending(origin))

    # -- chunked messages: walked for their receiver, whatever path they took ----------

    def _overwriting(self, env: envelope.Envelope, peer: Peer, target: str, frame: bytes) -> bytes:
        """A client's ``create`` as its receiver gets it: an overwrite (:func:`~switchboard.protocol.chunks.overwriting`)."""
        try:
            extra = payload_map(env.rest)
            env.rest = overwriting(parse_cache_call("create", extra), extra)
        except ProtocolError:
            return frame  # refused when it is walked
        return envelope.stamp(env, identity=peer.identity, to=target)

    def _walked(self, receiver: Peer, item: Undelivered) -> Action | None:
        """A piece of a chunked message about to be handed to ``receiver``'s connection: walked first.

        This is where every piece for a client of this replica passes, straight
        from its sender, after it was held while the client was in transit, or
        from the retry window; once walked it travels as an ordinary frame (a
        connection that ends as it is handed over holds it for the next).
        """
        try:
            rest = envelope.decode(item.frame).rest
        except ProtocolError:  # cannot happen: the hub stamped it
            return None
        refused = self.upload_refusal(receiver, item.caller, item.op or "", rest)
        if refused is not None:
            return self._refused(receiver.id, item, refused)
        return Deliver(receiver, item._replace(op=None))

    def _refused(self, target: str, item: Undelivered, message: str) -> Action | None:
        """A piece that may not reach ``target``: its sender is told, wherever it is."""
        if (sender := self.peers.get(item.caller)) is not None:
            return Send(sender, self._refusal(sender, item.session, target, message))
        if item.session and "/" in item.caller:
            reject = envelope.reject_frame(session=item.session, target=target, caller=item.caller, message=message)
            return self.toward(item.caller, Undelivered(reject, None, target))
        return None

    def upload_refusal(self, receiver: Peer, sender: str, op: str, rest: bytes | memoryview) -> str | None:
        """Why a ``message_cache`` call for ``receiver`` may not reach it, or ``None``.

        hypha-rpc joins the pieces of a large message on the receiving side
        and reads their payload over the header the hub stamped, so the hub
        walks them on the receiver's replica, as they are handed to its
        connection, whichever path they took (:mod:`switchboard.hub.routing.uploads`).
        """
        try:
            self.uploads.of(receiver.id).take(sender, parse_cache_call(op, payload_map(rest)))
        except (ProtocolError, PermissionDenied, LimitExceeded) as exc:
            self.metrics.bad_frames.inc()
            receiver.log.info("refused a chunk from %s: %s", sender, exc)
            return str(exc)
        return None

    # -- a frame for one client, wherever it is ----------------------------------

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
            if item.session is None and relay.is_manager_call(item.frame):
                # another replica's manager call, held wrapped for a client that came back here:
                # it reaches the client as if it had just come off the bus (unwrapped, its reply's way noted)
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
        (:mod:`switchboard.protocol.relay`). Wrapped here, once per trip; never for a client here."""
        if item.session and (item.caller == self.manager_address or item.caller in self.aliases):
            return item._replace(
                frame=relay.wrap_manager_call(self.replica_id, item.session.partition(".")[0], item.frame)
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

    def from_manager(self, data: bytes, *, sender: str, workspace: str | None, user: dict[str, Any]) -> Action | None:
        """A frame the manager's RPC emitted, stamped as the trusted ``sender`` (the manager, or the
        HTTP caller it acts for; ``workspace`` ``None``: the target's)."""
        env = envelope.decode(data)
        target = env.main.get("to")
        if not isinstance(target, str) or "/" not in target:
            log.warning(
                "manager emitted a message without a full target: %r", target, extra={"replica": self.replica_id}
            )
            return None
        who = envelope.identity(sender, workspace or target.partition("/")[0], user)
        frame = envelope.stamp(env, identity=who, to=target, trusted=True)
        if target == self.manager_address:
            return ToManager(frame)
        kind = classify(env.main.get("method"), env.session, env.rest).kind
        if kind is CALL:
            self.inflight.opened(sender, env.session, target, self.peers)  # type: ignore[arg-type]  # its reply is never refused
        action = self.toward(target, Undelivered(frame, env.session, sender))
        return self._noted(action) if kind is REPLY else action

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

    # -- frames other replicas routed here -------------------------------------

    def relayed(self, peer: Peer, data: bytes) -> Action | None:
        """A frame another replica routed to a client here (as it came off the bus or a link).

        Calls into and replies to our clients count as in flight; the pieces
        of a chunked message pass the client's uploads; a frame for a
        connection that just ended waits for its client if it is in transit,
        and a call to a client that left fails at once, not at its timeout.
        """
        try:
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
            return self.hold(peer.id, item, self._bounce(peer.id, session, caller))
        if op is not None:
            refused = self.upload_refusal(peer, str(caller or ""), op, env.rest)
            if refused is not None:
                return self._refused(peer.id, Undelivered(frame, session, str(caller or "")), refused)
        if traits.kind is CALL:
            self.inflight.opened(str(caller), session, peer.id, self.peers)  # type: ignore[arg-type]
        else:
            method = _session_method(env.main.get("method"), traits)
            if self.balanced and (handle := self.balanced.relabel(peer.id, method, caller)) is not None:
                env.main["from"] = handle  # within a balanced call: from the handle the caller called
                frame = envelope.encode(env.main, env.rest)
                if traits.answers is not None:
                    self.balanced.closed(peer.id, traits.answers)
            if traits.answers is not None and self.inflight.busy(peer.id):
                self.inflight.closed(peer.id, traits.answers)
        send = Send(peer, frame)
        return self._noted(send) if traits.kind is REPLY else send

    def _noted(self, action: Action | None) -> Action | None:
        """A reply about to be written to a client here is noted by its connection (:meth:`Peer.note_reply`)."""
        if isinstance(action, Deliver) and action.peer.life.returned:  # else not fresh: no clock read
            action.peer.note_reply(action.item.frame, self.clock.monotonic())
        elif isinstance(action, Send) and action.peer.life.returned and isinstance(action.message, bytes):
            action.peer.note_reply(action.message, self.clock.monotonic())
        return action

    def _bounce(self, target: str, session: str | None, caller: Any) -> Action | None:
        """A call that reached this replica as its client left: its caller fails now."""
        if session and isinstance(caller, str) and "/" in caller:
            reject = envelope.reject_frame(
                session=session, target=target, caller=caller, message=f"Target peer {target} is not connected"
            )
            return self.toward(caller, Undelivered(reject, None, target))
        return None

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

    def __repr__(self) -> str:
        return f"<Router replica={self.replica_id} in_flight={len(self.inflight)} draining={self.draining}>"


def _session_method(method: Any, traits: Traits) -> Any:
    """The method a frame's session is read from: a reply in pieces names it as the key of its ``process``."""
    if traits.op == "process" and traits.answers is not None:
        return f"{traits.answers}.resolve"
    return method

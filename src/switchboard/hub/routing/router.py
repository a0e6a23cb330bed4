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

The router is made of parts, one concept each (:mod:`~switchboard.hub.routing.router_base`
names them); this module holds a client's own frames and the manager's.

Nothing here awaits, so every rule is tested synchronously
(``tests/hub/test_router.py``; after the I/O, ``tests/hub/test_after_io.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Container, Mapping
from typing import TYPE_CHECKING, Any

from switchboard.errors import EncryptedPayload, PermissionDenied, ProtocolError
from switchboard.hub.identity.users import Permission
from switchboard.hub.routing import balance
from switchboard.hub.routing.actions import (
    Action,
    Broadcast,
    Send,
    SendToken,
    ToManager,
    ToReplica,
)
from switchboard.hub.routing.binds import PendingBinds
from switchboard.hub.routing.inflight import InFlight
from switchboard.hub.routing.relayed_routes import RelayedRoutes, session_method
from switchboard.hub.routing.reply_routes import ReplyRoutes
from switchboard.hub.routing.served import ServedHandles
from switchboard.hub.routing.undelivered import Undelivered
from switchboard.hub.routing.uploads import Receivers
from switchboard.hub.sessions.in_transit import Transit
from switchboard.protocol.hypha import envelope, handshake
from switchboard.protocol.hypha.calls import CALL, REPLY, Traits, classify
from switchboard.protocol.hypha.chunks import piece_header
from switchboard.protocol.link import relay

if TYPE_CHECKING:  # named in signatures only: the router itself loads nothing with I/O (tests/test_layers.py)
    from switchboard.clock import Clock
    from switchboard.config import Settings
    from switchboard.hub.routing.limits import TokenBucket
    from switchboard.hub.sessions.in_transit import Waiting
    from switchboard.hub.sessions.peer import Peer
    from switchboard.metrics import HubMetrics

log = logging.getLogger(__name__)


class Router(RelayedRoutes):
    """The routing decisions of one replica (see the module docstring).

    ``peers`` (clients here), ``aliases`` (HTTP callers' addresses),
    ``transit``, ``retry`` and ``replies`` are the hub's, read only; so are
    ``rates``, each connection's frame rate (the gatekeeper's), which it spends. ``draining`` is set
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
        retry: Waiting,
        replies: Waiting | None = None,
        inflight: InFlight | None = None,
        balanced: balance.Balanced | None = None,
        uploads: Receivers | None = None,
        rates: Mapping[Peer, TokenBucket] | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.metrics = metrics
        self.replica_id = settings.replica_id
        self.manager_id = settings.manager_id
        self.manager_address = settings.manager_address
        self.peers = peers
        self.rates: Mapping[Peer, TokenBucket] = rates if rates is not None else {}  # none: no rate limit
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
        self.served = ServedHandles()  # balanced calls our instances took from callers elsewhere: their handles
        self.binds = PendingBinds()  # calls through handles made on another replica, waiting to be bound here
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
        rate = self.rates.get(peer)
        if rate is not None and not rate.take():
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
                    waits, bind = self._bind_first(peer, env, virtual, data)
                    if waits:  # a handle its caller made on another replica: bound here first
                        return bind
                    why = f"{virtual} is a balanced handle: it takes calls only, while an instance the caller may reach is left"
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
            elif (self.balanced or self.served) and (
                handle := self.handle_of(target, session_method(method, traits), peer.id)
            ):
                env.main["from"] = handle  # within a balanced call: from the handle the caller called
                frame = envelope.encode(env.main, env.rest)
                if traits.answers is not None:
                    self.inflight.closed(target, traits.answers)
                    self.balanced.closed(target, traits.answers)
                    self.served.closed(target, traits.answers)
            elif traits.answers is not None:
                self.inflight.closed(target, traits.answers)
            item = Undelivered(frame, session, peer.id, env.type != "method", traits.op)
            action = self.toward(target, item, new_call=new_call)
            if virtual is not None and new_call:
                return self.with_handle(action, virtual)
            return self._noted(action) if traits.kind is REPLY else action
        if env.type == "method":
            return Send(peer, handshake.error_text("Invalid message: cannot broadcast a method call"))
        return Broadcast(route.workspace, env.type, frame)

    def _over_limit(self, peer: Peer, traits: Traits, target: str) -> str | None:
        """Why this frame is refused (rate or pending-call limit), or ``None``.

        A reply that answers a call still open is never refused: dropping it
        would punish the caller, who did nothing wrong, with a timeout.
        """
        rate = self.rates.get(peer)
        if rate is not None and not rate.take():
            if traits.kind is REPLY and self.inflight.is_open(target, traits.answers):  # type: ignore[arg-type]
                return None
            return self._rate_refusal
        if traits.kind is CALL and self.inflight.pending(peer.id) >= self.settings.max_pending_calls:
            return self._pending_refusal
        return None

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

    def __repr__(self) -> str:
        return f"<Router replica={self.replica_id} in_flight={len(self.inflight)} draining={self.draining}>"

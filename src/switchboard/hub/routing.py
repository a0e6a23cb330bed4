"""A client's frames: checked, stamped, and sent on their way.

Part of :class:`~switchboard.hub.hub.Hub` (a mixin, like
:mod:`switchboard.hub.across`). Routing is synchronous wherever it can be: a
frame for a client of this replica, or for one a direct link reaches, is on
its way when :meth:`Routing.route_binary` returns, and only what must wait
for the bus or the manager is left as an awaitable for the caller to await
in order.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from switchboard.errors import PermissionDenied, ProtocolError
from switchboard.hub.auth import Permission
from switchboard.hub.inflight import chunked_reply_session, is_call, reply_session
from switchboard.hub.retry import Undelivered
from switchboard.protocol import envelope, handshake
from switchboard.protocol.chunks import cache_op

if TYPE_CHECKING:
    from switchboard.clock import Clock
    from switchboard.config import Settings
    from switchboard.hub.inflight import InFlight
    from switchboard.hub.metrics import HubMetrics
    from switchboard.hub.peer import Peer
    from switchboard.hub.retry import RetryWindow
    from switchboard.hub.transit import Transit


class Routing:
    """The routing half of the hub; the attributes below are the hub's own."""

    settings: Settings
    clock: Clock
    manager_id: str
    peers: dict[str, Peer]
    inflight: InFlight
    retry: RetryWindow
    transit: Transit[Undelivered]
    metrics: HubMetrics
    draining: bool
    log: logging.LoggerAdapter[logging.Logger]
    _acting: dict[str, Any]

    if TYPE_CHECKING:  # the hub's own methods, used here

        def reconnection_token(self, peer: Peer) -> str: ...

        def _receive_as(self, acting: Any, frame: bytes) -> None: ...

        async def broadcast(self, workspace: str, event_type: str, frame: bytes) -> None: ...

        async def _to_manager(self, peer: Peer, method: Any, extra: bytes | memoryview, frame: bytes) -> None: ...

        def _send_direct(self, target: str, frame: bytes, session: str | None, caller: str) -> bool: ...

        async def _publish_to_client(
            self, target: str, frame: bytes, session: str | None, caller: str, event: bool = False
        ) -> bool: ...

        async def worth_retrying(self, target: str) -> bool: ...

        def _undeliverable(self, target: str, session: str | None, caller: str) -> None: ...

        def upload_refusal(self, receiver: Peer, sender: str, op: str, rest: bytes | memoryview) -> str | None: ...

        def hold(self, target: str, item: Undelivered) -> bool: ...

    def handle_text(self, peer: Peer, text: str) -> None:
        """Answer a text control frame. Each takes from the client's rate bucket, as a
        binary frame does: over the limit it gets an error frame instead of an answer
        (and ``refresh_token`` reuses a recent token, see ``Hub.reconnection_token``)."""
        if peer.rate is not None and not peer.rate.take():
            self.metrics.rate_limited.inc()
            s = self.settings
            peer.send(
                handshake.error_text(
                    f"Rate limit exceeded: at most {s.max_messages_per_second:g} messages/s (burst {s.message_burst})"
                )
            )
            return
        kind = handshake.parse_control(text)
        if kind == "ping":
            peer.send(handshake.PONG)
        elif kind == "refresh_token":
            peer.send(handshake.reconnection_token_text(self.reconnection_token(peer)))
        else:
            peer.log.debug("ignored unknown text frame (%d chars)", len(text))

    async def handle_binary(self, peer: Peer, data: bytes) -> None:
        """Route one binary frame from ``peer``; a bad frame gets an error, never a crash."""
        rest = self.route_binary(peer, data)
        if rest is not None:
            await rest

    def route_binary(self, peer: Peer, data: bytes) -> Awaitable[Any] | None:
        """Route a frame as far as it goes without waiting; return the rest of the work, if any.

        Most frames go to a client here or over a direct link and are done on
        return. The server calls this in the callback that read the frame and
        awaits what is returned before it routes the client's next frame.
        """
        counts = self.metrics.frames
        counts.received += 1
        peer.last_heard = self.clock.monotonic()  # a drain sends it away in a pause (drain.QUIET)
        counts.received_bytes += len(data)
        try:
            env = envelope.decode(data)
            to = env.main.get("to")
            route = envelope.route(to, sender_workspace=peer.workspace, manager_id=self.manager_id)
            if route.kind == "broadcast" and (
                route.workspace != peer.workspace or not peer.user.can(peer.workspace, Permission.READ_WRITE)
            ):  # events go to one's own workspace, and need read-write there (§3.5 rule 6)
                raise PermissionDenied(f"Permission denied: cannot broadcast into workspace {route.workspace}")
            frame = envelope.stamp(env, sender=peer.id, workspace=peer.workspace, user=peer.user_wire, to=route.target)
        except (ProtocolError, PermissionDenied) as exc:
            self.metrics.bad_frames.inc()
            peer.log.info("rejected frame: %s", exc)
            peer.send(handshake.error_text(f"Invalid message: {exc}"))
            return None
        method = env.main.get("method")
        refusal = self._over_limit(peer, method, env.session, route.target)
        if refusal:
            self.metrics.rate_limited.inc()
            if env.session:
                peer.send(
                    envelope.reject_frame(session=env.session, target=route.target, caller=peer.id, message=refusal)
                )
            return None
        if route.kind == "manager":
            if (replied := reply_session(method) or chunked_reply_session(method, env.rest)) is not None:
                self.inflight.closed(route.target, replied)
            return self._to_manager(peer, method, env.rest, frame)
        if route.kind == "client":
            if (op := cache_op(method)) is not None and (receiver := self.peers.get(route.target)):
                refusal = self.upload_refusal(receiver, peer.id, op, env.rest)
                if refusal is not None:
                    self._refuse(peer, env.session, route.target, refusal)
                    return None
            new_call = is_call(method, env.session)
            if new_call:
                self.inflight.opened(peer.id, env.session, route.target, self.peers)  # type: ignore[arg-type]
            elif (replied := reply_session(method) or chunked_reply_session(method, env.rest)) is not None:
                self.inflight.closed(route.target, replied)
            event = env.type != "method"
            if (
                self.deliver_now(
                    route.target, frame, session=env.session, caller=peer.id, new_call=new_call, event=event
                )
                is None
            ):
                return self._deliver_through_bus(route.target, frame, env.session, peer.id, event)
            return None
        if env.type == "method":
            peer.send(handshake.error_text("Invalid message: cannot broadcast a method call"))
            return None
        return self.broadcast(route.workspace, env.type, frame)

    def _refuse(self, peer: Peer, session: str | None, target: str, message: str) -> None:
        """A frame the hub will not deliver: its call fails now, with the reason."""
        if session:
            peer.send(envelope.reject_frame(session=session, target=target, caller=peer.id, message=message))
        else:
            peer.send(handshake.error_text(f"Invalid message: {message}"))

    def _over_limit(self, peer: Peer, method: Any, session: str | None, target: str) -> str | None:
        """Why this frame is refused (rate or pending-call limit), or ``None``.

        A reply that answers a call still open is never refused: dropping it
        would punish the caller, who did nothing wrong, with a timeout.
        """
        s = self.settings
        if peer.rate is not None and not peer.rate.take():
            replied = reply_session(method)
            if replied is not None and self.inflight.is_open(target, replied):
                return None
            return f"Rate limit exceeded: at most {s.max_messages_per_second:g} messages/s (burst {s.message_burst})"
        if is_call(method, session) and self.inflight.pending(peer.id) >= s.max_pending_calls:
            return f"Too many pending calls: at most {s.max_pending_calls} may wait for a reply"
        return None

    async def deliver(
        self,
        target: str,
        frame: bytes,
        *,
        session: str | None,
        caller: str,
        new_call: bool = False,
        event: bool = False,
    ) -> bool:
        """Send ``frame`` to one client here or on another replica; fail the caller fast if nobody has it.

        An ``event`` (a point-to-point emit) takes the bus's shared path even where a
        direct link exists, so it cannot overtake a broadcast its sender emitted before it.
        """
        done = self.deliver_now(target, frame, session=session, caller=caller, new_call=new_call, event=event)
        if done is not None:
            return done
        return await self._deliver_through_bus(target, frame, session, caller, event)

    def deliver_now(
        self,
        target: str,
        frame: bytes,
        *,
        session: str | None,
        caller: str,
        new_call: bool = False,
        event: bool = False,
    ) -> bool | None:
        """:meth:`deliver` where that needs no waiting (a client here, a direct link); else ``None``."""
        if (acting := self._acting.get(target)) is not None:
            self._receive_as(acting, frame)
            return True
        peer = self.peers.get(target)
        if peer is not None:
            if self.draining and new_call and not peer.closed:
                # this replica is going away: the call waits for the client to reappear
                # elsewhere, and is no longer in flight here (the drain must not wait for it)
                self.inflight.closed(caller, session or "")
                self.retry.add(target, Undelivered(frame, session, caller, event))
                return True
            if peer.send(frame):
                self.metrics.frames.routed += 1
                return True
            if self.hold(target, Undelivered(frame, session, caller, event)):  # its connection just ended
                return True
            self._undeliverable(target, session, caller)
            return False
        if target in self.transit and self.hold(target, Undelivered(frame, session, caller, event)):
            return True  # it is moving between connections: the frame waits for it
        if self.retry.pending(target):  # keep order behind frames already waiting
            self.retry.add(target, Undelivered(frame, session, caller, event))
            return True
        if not event and self._send_direct(target, frame, session, caller):
            self.metrics.frames.routed += 1
            return True
        return None

    async def _deliver_through_bus(
        self, target: str, frame: bytes, session: str | None, caller: str, event: bool
    ) -> bool:
        if await self._publish_to_client(target, frame, session, caller, event):
            self.metrics.frames.routed += 1
            return True
        if target in self.transit and self.hold(target, Undelivered(frame, session, caller, event)):
            return True  # we heard it left while the publish was on its way
        if self.retry.window > 0 and await self.worth_retrying(target):
            self.metrics.publishes_to_nobody.inc()
            self.retry.add(target, Undelivered(frame, session, caller, event))
            return True
        self._undeliverable(target, session, caller)
        return False

"""Frames to and from other replicas: the hub's side of the event bus.

Part of :class:`~switchboard.hub.hub.Hub` (a mixin, kept apart so that each
file reads in one sitting): publishing to a client on another replica and
failing its caller fast when nobody holds it, taking in what other replicas
route here, and repairing what a backend outage left undone.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from switchboard.errors import BackendError, ProtocolError
from switchboard.hub.inflight import chunked_reply_session, is_call, reply_session
from switchboard.hub.retry import Undelivered
from switchboard.protocol import envelope, relay
from switchboard.protocol.chunks import cache_op
from switchboard.protocol.services import ServiceQuery
from switchboard.tasks import spawn

if TYPE_CHECKING:
    from switchboard.backends.base import EventBus, Registry
    from switchboard.hub.admission import Gatekeeper
    from switchboard.hub.inflight import InFlight
    from switchboard.hub.manager import WorkspaceManager
    from switchboard.hub.metrics import HubMetrics
    from switchboard.hub.peer import Peer
    from switchboard.hub.relay import ReplyRoutes
    from switchboard.hub.retry import RetryWindow
    from switchboard.protocol.services import ServiceInfo
    from switchboard.replicas.unicast import Unicast

CLIENT_CHANNEL = "sb:client:"  # + "<workspace>/<client id>": the replica holding the client listens
WORKSPACE_CHANNEL = "sb:ws:"  # + workspace: broadcasts, heard by every replica with members there
REPLICA_CHANNEL = "sb:replica:"  # + replica id: replies to calls its manager made


class AcrossReplicas:
    """The cross-replica half of the hub; the attributes below are the hub's own."""

    replica_id: str
    manager_address: str
    bus: EventBus
    unicast: Unicast
    registry: Registry
    gate: Gatekeeper
    peers: dict[str, Peer]
    manager: WorkspaceManager
    reply_routes: ReplyRoutes
    inflight: InFlight
    retry: RetryWindow
    metrics: HubMetrics
    log: logging.LoggerAdapter[logging.Logger]
    unpurged: set[tuple[str, str]]
    registry_dirty: bool
    _acting: dict[str, Any]
    _background: set[asyncio.Task[Any]]

    if TYPE_CHECKING:  # the hub's own methods, used here

        async def deliver(
            self,
            target: str,
            frame: bytes,
            *,
            session: str | None,
            caller: str,
            new_call: bool = False,
            event: bool = False,
        ) -> bool: ...

        async def purge(self, workspace: str, client_id: str, *, owner: str | None = None) -> int: ...

        def _broadcast_local(self, workspace: str, event_type: str, frame: bytes) -> None: ...

        def upload_refusal(self, receiver: Peer, sender: str, op: str, rest: bytes | memoryview) -> str | None: ...

        def hold(self, target: str, item: Undelivered) -> bool: ...

    async def _to_manager(self, peer: Peer, method: Any, extra: bytes | memoryview, frame: bytes) -> None:
        """A reply to a call another replica's manager made goes back to that replica.

        So do the ``message_cache`` calls that carry a reply too large for one
        frame: only the manager that made the call can put the chunks together.
        """
        session = relay.manager_session(method, extra)
        origin = self.reply_routes.origin_of(session) if session else None
        if origin is None or origin == self.replica_id:
            self.manager.receive(frame, peer)
        elif await self._publish(REPLICA_CHANNEL + origin, frame) == 0:
            self.log.info("manager reply for replica %s dropped: it is gone or unreachable", origin)

    def _on_bus_replica(self, frame: bytes) -> None:
        """A reply (or a chunk of one) to a call our manager made, via the provider's replica."""
        try:
            env = envelope.decode(frame)
        except ProtocolError as exc:
            self.log.warning("dropped a malformed manager reply: %s", exc)
            return
        method = env.main.get("method")
        if (replied := reply_session(method) or chunked_reply_session(method, env.rest)) is not None:
            self.inflight.closed(self.manager_address, replied)
        self.manager.receive(frame)

    def _on_bus_client(self, peer: Peer, data: bytes) -> None:
        """A frame another replica routed to one of our clients."""
        try:
            origin, session, frame = relay.unwrap(data)
        except ProtocolError as exc:
            self.log.warning("dropped a relayed frame for %s: %s", peer.id, exc)
            return
        if origin is not None and session is not None:
            self.reply_routes.remember(session, origin)
        if peer.closed:
            if not self._hold_relayed(peer.id, data if origin is not None else frame):
                self._bounce(peer.id, frame)
            return
        if not self._track_relayed(peer, frame):
            return
        peer.send(frame)

    def _hold_relayed(self, target: str, data: bytes) -> bool:
        """A frame for a client whose connection here just ended without a goodbye: it waits for it.

        A manager call stays wrapped with its origin (``data`` as it came), so
        that sent on it still finds its way back to the manager that made it.
        """
        try:
            _, _, frame = relay.unwrap(data)
            env = envelope.decode(frame)
        except ProtocolError:
            return False
        if frame is not data:
            return self.hold(target, Undelivered(data, None, "", False))
        caller = str(env.main.get("from", ""))
        return self.hold(target, Undelivered(frame, env.session, caller, env.type != "method"))

    def _bounce(self, target: str, frame: bytes) -> None:
        """A call that reached this replica as its client left: fail the caller now, not at its timeout."""
        try:
            env = envelope.decode(frame)
        except ProtocolError:
            return
        caller = env.main.get("from")
        if env.session and isinstance(caller, str) and "/" in caller:
            reject = envelope.reject_frame(
                session=env.session,
                target=target,
                caller=caller,
                message=f"Target peer {target} is not connected",
            )
            spawn(self._background, self.deliver(caller, reject, session=None, caller=target))

    def _track_relayed(self, peer: Peer, frame: bytes) -> bool:
        """Calls into (and replies to) our clients from other replicas count as in flight too.

        ``False`` if the frame may not reach the client: a piece of a chunked
        message that the client's uploads refuse (its caller is told why).
        """
        try:
            env = envelope.decode(frame)
        except ProtocolError:
            return True
        method, session = env.main.get("method"), env.session
        caller = env.main.get("from")
        if (op := cache_op(method)) is not None and isinstance(caller, str):
            refusal = self.upload_refusal(peer, caller, op, env.rest)
            if refusal is not None:
                if session and "/" in caller:
                    reject = envelope.reject_frame(session=session, target=peer.id, caller=caller, message=refusal)
                    spawn(self._background, self.deliver(caller, reject, session=None, caller=peer.id))
                return False
        if is_call(method, session):
            self.inflight.opened(str(env.main.get("from")), session, peer.id, self.peers)  # type: ignore[arg-type]
        elif (
            self.inflight.busy(peer.id)
            and (replied := reply_session(method) or chunked_reply_session(method, env.rest)) is not None
        ):
            self.inflight.closed(peer.id, replied)
        return True

    async def _take_lost(self) -> None:
        """Frames counted as delivered that reached nobody after all (a direct link gave
        them back and Redis found no subscriber): the same path as a publish to nobody."""
        async for channel, data in self.unicast.lost():
            target = channel.removeprefix(CLIENT_CHANNEL)
            try:
                _, _, frame = relay.unwrap(data)
                env = envelope.decode(frame)
            except ProtocolError:
                continue
            caller = str(env.main.get("from", ""))
            self.metrics.publishes_to_nobody.inc()
            spawn(self._background, self._retry_or_fail(target, Undelivered(frame, env.session, caller)))

    async def _retry_or_fail(self, target: str, item: Undelivered) -> None:
        if self.hold(target, item):
            return
        if self.retry.pending(target) or (self.retry.window > 0 and await self.worth_retrying(target)):
            self.retry.add(target, item)
        else:
            self._undeliverable(target, item.session, item.caller)

    async def worth_retrying(self, target: str) -> bool:
        """Does some replica claim this client, or can we not tell right now?"""
        ws, _, cid = target.partition("/")
        try:
            # a registry that lost its data (Redis restarted empty) is re-filled within seconds
            return bool(await self.registry.find(ServiceQuery(ws, cid, "built-in"))) or await self.registry.lost_data()
        except BackendError:
            return True  # the registry is unreachable: a retry may well succeed

    async def _publish(self, channel: str, data: bytes) -> int:
        """Publish; a bus failure counts as "nobody received it", never as a crash."""
        try:
            return await self.bus.publish(channel, data)
        except BackendError as exc:
            self.log.warning("publish failed: %s", exc)
            return 0

    def _undeliverable(self, target: str, session: str | None, caller: str) -> None:
        self.metrics.undeliverable.inc()
        if not session:
            return  # fire-and-forget: dropping is right, a reject here would start a storm
        self.inflight.closed(caller, session)
        reject = envelope.reject_frame(
            session=session,
            target=target,
            caller=caller,
            message=f"Target peer {target} is not connected",
        )
        if caller == self.manager_address or caller in self._acting:
            self.manager.receive(reject)
        elif (sender := self.peers.get(caller)) is not None:
            sender.send(reject)
        elif "/" in caller:  # a frame another replica sent here (held for a client in transit)
            spawn(self._background, self.deliver(caller, reject, session=None, caller=target))

    def _for_client(self, frame: bytes, session: str | None, caller: str) -> bytes:
        """A call the manager makes travels with its origin, for the reply to find the way back."""
        if session and (caller == self.manager_address or caller in self._acting):
            return relay.wrap_manager_call(self.replica_id, session.partition(".")[0], frame)
        return frame

    def _send_direct(self, target: str, frame: bytes, session: str | None, caller: str) -> bool:
        """Over a direct link to the client's replica, if one is known and takes it now."""
        return self.unicast.send(CLIENT_CHANNEL + target, self._for_client(frame, session, caller))

    async def _publish_to_client(
        self, target: str, frame: bytes, session: str | None, caller: str, event: bool = False
    ) -> bool:
        frame = self._for_client(frame, session, caller)
        try:
            return await self.unicast.publish(CLIENT_CHANNEL + target, frame, direct=not event) > 0
        except BackendError as exc:
            self.log.warning("publish failed: %s", exc)
            return False

    def _on_bus_broadcast(self, data: bytes) -> None:
        origin, _, frame = data.partition(b"\n")
        if origin == self.replica_id.encode():
            return
        try:
            env = envelope.decode(frame)
        except ProtocolError as exc:
            self.log.warning("dropped a malformed broadcast from %r: %s", origin, exc)
            return
        workspace = str(env.main.get("to", "")).partition("/")[0]
        if env.main.get("to") == "*":
            workspace = str(env.main.get("ws", ""))
        self._broadcast_local(workspace, env.type, frame)

    async def repair_registry(self) -> list[ServiceInfo]:
        """Retry what a backend outage left undone; return the registrations to re-write, if any."""
        await self.gate.retry_uncounted()
        for ws, cid in list(self.unpurged):
            if f"{ws}/{cid}" not in self.peers:  # a reconnected client re-registered itself
                await self.purge(ws, cid, owner=self.replica_id)
            self.unpurged.discard((ws, cid))
        if not self.registry_dirty:
            return []
        self.registry_dirty = False
        return [info for peer in list(self.peers.values()) for info in peer.services.values()]

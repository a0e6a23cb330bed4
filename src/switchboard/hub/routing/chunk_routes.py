"""The router's part in chunked messages: each piece walked for its receiver, whatever path it took.

hypha-rpc sends a message too large for one frame as ``message_cache`` calls
(``create``, ``set``/``append``, ``process``) to its receiver; the hub walks
them on the receiver's replica as they are handed to its connection
(:mod:`switchboard.hub.routing.uploads`). Decisions only, as the rest of the
:class:`~switchboard.hub.routing.router.Router`, which this completes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from switchboard.errors import LimitExceeded, PermissionDenied, ProtocolError
from switchboard.hub.routing.actions import Action, Deliver, Send
from switchboard.hub.routing.balanced_routes import BalancedRoutes
from switchboard.hub.routing.undelivered import Undelivered
from switchboard.protocol.hypha import envelope
from switchboard.protocol.hypha.chunks import overwriting, parse_cache_call
from switchboard.protocol.hypha.payload import payload_map

if TYPE_CHECKING:
    from switchboard.hub.sessions.peer import Peer


class ChunkRoutes(BalancedRoutes):
    """Chunked messages' routing, a part of :class:`~switchboard.hub.routing.router.Router`."""

    def _overwriting(self, env: envelope.Envelope, peer: Peer, target: str, frame: bytes) -> bytes:
        """A client's ``create`` as its receiver gets it: an overwrite (:func:`~switchboard.protocol.hypha.chunks.overwriting`)."""
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

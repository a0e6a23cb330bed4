"""The hub's one inbound port: what other replicas send here, each kind to what carries it out.

The replica layer decodes every message, off the bus or a direct link, once
(:mod:`switchboard.protocol.link.replica_wire`) and hands the value to this one
:class:`~switchboard.replicas.dataplane.inbound.Inbound`, which dispatches on its type.
A client channel's frame finds its client here, in :class:`FromReplicas`'s table
of the channels this replica listens on: no callable is registered per channel.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping

from switchboard.hub.dispatch import Dispatch
from switchboard.hub.identity.credentials import REVOKED
from switchboard.hub.manager.acting import Acting
from switchboard.hub.sessions.joins import Holders, Joins
from switchboard.hub.sessions.peer import Peer
from switchboard.hub.transit.moves import Moves
from switchboard.protocol.hypha.handshake import CLOSE_POLICY
from switchboard.protocol.link import replica_wire
from switchboard.protocol.link.replica_wire import (
    BalancedCall,
    BouncedCall,
    ClientFrame,
    ClientKicked,
    CredentialRevoked,
    ManagerCall,
    ManagerReply,
    Message,
    TransitNotice,
    WorkspaceDeleted,
    WorkspaceEvent,
)

log = logging.getLogger(__name__)


class FromReplicas:
    """:class:`~switchboard.replicas.dataplane.inbound.Inbound`, implemented once for the hub.

    ``members`` is the hub's table of its clients by workspace (read only).
    Which connection or HTTP caller a client channel is for is kept here from
    its subscription until its unsubscription is done (:meth:`listen`,
    :meth:`forget`): a frame Redis counted as delivered before then still
    reaches that connection, even once the hub let go of it (it is held for
    the client if it is in transit).
    """

    def __init__(
        self,
        *,
        dispatch: Dispatch,
        moves: Moves,
        members: Mapping[str, Collection[Peer]],
        replica_id: str,
        joins: Joins | None = None,
        holders: Holders | None = None,
    ) -> None:
        self._dispatch = dispatch
        self._moves = moves
        self._members = members
        # the hub's connections between admission and join, and its sessions by the credentials they stand on
        self._joins = Joins() if joins is None else joins
        self._holders = Holders() if holders is None else holders
        self._listening: dict[str, Peer | Acting] = {}  # address -> whose channel this replica listens on
        self.log = logging.LoggerAdapter(log, {"replica": replica_id})

    def listen(self, address: str, target: Peer | Acting) -> None:
        """Frames on ``address``'s channel are ``target``'s from now on (set before subscribing)."""
        self._listening[address] = target

    def forget(self, address: str, target: Peer | Acting) -> None:
        """``target``'s channel is unsubscribed (unless a newer connection of the client took it)."""
        if self._listening.get(address) is target:
            del self._listening[address]

    def __len__(self) -> int:
        return len(self._listening)

    # -- Inbound -------------------------------------------------------------------

    def receive(self, message: Message) -> bool:
        """Each kind of message to what carries it out; ``False``: no client here by its address."""
        # type() and "is", not match: this runs for every frame
        if type(message) is ClientFrame or type(message) is ManagerCall:
            return self._to_client(message)
        if type(message) is BalancedCall or type(message) is BouncedCall:
            return self._call_to_client(message)
        if type(message) is ManagerReply:
            self._dispatch.from_replica_to_manager(message.frame)
        elif type(message) is WorkspaceEvent:
            self._dispatch.from_replica_broadcast(message.origin, message.frame)
        elif type(message) is TransitNotice:
            # Moves reads the notice as it travelled (hub/transit/ is to take the value next)
            self._moves.on_notice(replica_wire.encode(message, version=1))
        elif type(message) is WorkspaceDeleted:
            self.workspace_deleted(message.workspace)
        elif type(message) is CredentialRevoked:
            self.credential_revoked(message.token_id)
        elif type(message) is ClientKicked:
            self.kicked(message)
        else:
            raise TypeError(f"not a message between replicas: {message!r}")
        return True

    def _to_client(self, message: ClientFrame | ManagerCall) -> bool:
        target = self._listening.get(message.address)
        if target is None:
            return False
        if isinstance(target, Acting):
            self._dispatch.receive_as(target, message.frame)
        elif type(message) is ManagerCall:
            self._dispatch.from_replica_to_client(target, message.wrapped)  # the router notes its way back
        else:
            self._dispatch.from_replica_to_client(target, message.frame)
        return True

    def _call_to_client(self, message: BalancedCall | BouncedCall) -> bool:
        """Into the router as it wraps them (``protocol/link/relay.py``); an HTTP caller's is a plain frame."""
        target = self._listening.get(message.address)
        if target is None:
            return False
        if isinstance(target, Acting):
            self._dispatch.receive_as(target, message.frame)
        elif isinstance(message, BalancedCall):
            self._dispatch.from_replica_to_client(target, replica_wire.wrap_balanced(message.handle, message.frame))
        else:
            self._dispatch.from_replica_to_client(target, replica_wire.wrap_bounced(message.callee, message.frame))
        return True

    def workspace_deleted(self, workspace: str) -> None:
        """Every client of ``workspace`` here is closed, and every one joining it refused (its deletion
        was published, or done here)."""
        self._joins.deleted(workspace)
        for peer in list(self._members.get(workspace, ())):
            peer.close(CLOSE_POLICY, f"Workspace {workspace} was deleted")

    def credential_revoked(self, token_id: str) -> None:
        """Every session here standing on the credential ``token_id`` (or on one descended from it) is
        closed, and every connection joining with one refused (its revocation was published, or done here)."""
        self._joins.revoked(token_id)
        for peer in self._holders.of(token_id):
            peer.close(CLOSE_POLICY, f"Authentication error: {REVOKED}")

    def kicked(self, kick: ClientKicked) -> None:
        """Close the connections a kick names: one client, or a workspace's every one."""
        for peer in list(self._members.get(kick.workspace, ())):
            if kick.client_id is None or kick.client_id == peer.client_id:
                peer.close(kick.code, kick.reason)

    def __repr__(self) -> str:
        return f"<FromReplicas channels={len(self._listening)}>"

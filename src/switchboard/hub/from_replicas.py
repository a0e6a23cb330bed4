"""The hub's one inbound port: what other replicas send here, each kind to what carries it out.

The replica layer hands every message, off the bus or a direct link, to this
one :class:`~switchboard.replicas.inbound.Inbound` by the name of its channel.
A client channel's frame finds its client here, in :class:`FromReplicas`'s table
of the channels this replica listens on: no callable is registered per channel.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping

from switchboard.errors import ProtocolError
from switchboard.hub.dispatch import Acting, Dispatch
from switchboard.hub.identity.credentials import REVOKED
from switchboard.hub.sessions.joins import Holders, Joins
from switchboard.hub.sessions.peer import Peer
from switchboard.hub.transit.moves import Moves
from switchboard.protocol import relay
from switchboard.protocol.handshake import CLOSE_POLICY

log = logging.getLogger(__name__)


class FromReplicas:
    """:class:`~switchboard.replicas.inbound.Inbound`, implemented once for the hub.

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

    def to_client(self, address: str, frame: bytes) -> bool:
        target = self._listening.get(address)
        if target is None:
            return False
        if isinstance(target, Acting):
            try:
                _, _, inner = relay.unwrap(frame)
            except ProtocolError as exc:
                self.log.info("dropped a frame for %s: %s", address, exc)
                return True
            self._dispatch.receive_as(target, inner)
        else:
            self._dispatch.from_replica_to_client(target, frame)
        return True

    def to_manager(self, frame: bytes) -> None:
        self._dispatch.from_replica_to_manager(frame)

    def broadcast(self, data: bytes) -> None:
        self._dispatch.from_replica_broadcast(data)

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

    def kicked(self, data: bytes) -> None:
        """Close the connections a kick names (:func:`kick_notice`): one client, or a workspace's every one."""
        try:
            address, code_text, reason = data.decode().split("\n", 2)
            workspace, _, client_id = address.partition("/")
            code = int(code_text)
        except ValueError:
            self.log.info("dropped a malformed kick notice")
            return
        for peer in list(self._members.get(workspace, ())):
            if client_id in ("*", peer.client_id):
                peer.close(code, reason)

    def transit_notice(self, data: bytes) -> None:
        self._moves.on_notice(data)

    def __repr__(self) -> str:
        return f"<FromReplicas channels={len(self._listening)}>"


def kick_notice(workspace: str, client_id: str | None, code: int, reason: str) -> bytes:
    """What :meth:`FromReplicas.kicked` reads: ``None`` closes every client of ``workspace``."""
    return f"{workspace}/{client_id or '*'}\n{code}\n{reason}".encode()

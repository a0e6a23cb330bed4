"""Whom a deletion or a revocation notice reaches: the sessions in the workspace, and those joining it.

Admission reads the tombstones and the revocations, then the join may wait (on the
old connection's ping, on the stores); a notice that arrives in between must still
reach the joining session. So a connection's :class:`~switchboard.hub.sessions.life.Life`
is kept here from before admission reads the stores until it joins its workspace; a
notice for its workspace or one of its credentials marks it refused, and its join
returns the refusal, with no wait between the read and the join. Once joined, the session is in the
hub's tables, and notices reach it there (:class:`Holders` for revocations).

Sound because every notice is sent after its store was written: a notice that
came before a connection began joining was sent after a write its admission read
then sees. Pure bookkeeping, no I/O: the hub carries out what it says.
"""

from __future__ import annotations

from switchboard.hub.identity.credentials import REVOKED
from switchboard.hub.sessions.life import Life, Stage
from switchboard.hub.sessions.peer import Peer


class Joins:
    """The connections of one replica between their admission and their join."""

    def __init__(self) -> None:
        self._pending: set[Life] = set()

    def begin(self) -> Life:
        joining = Life(Stage.JOINING)
        self._pending.add(joining)
        return joining

    def end(self, joining: Life) -> None:
        """It joined, or was refused: notices reach it through the hub's tables from now on, or never."""
        self._pending.discard(joining)

    def deleted(self, workspace: str) -> None:
        """``workspace`` was deleted: whoever joins it now is refused, as its sessions are closed."""
        for joining in self._pending:
            if joining.workspace == workspace:
                joining.refuse(f"Workspace {workspace} was deleted")

    def revoked(self, token_id: str) -> None:
        """The credential ``token_id`` was revoked: whoever joins with it, or with what descends from it, is refused."""
        for joining in self._pending:
            if token_id in joining.ids:
                joining.refuse(f"Authentication error: {REVOKED}")

    def __len__(self) -> int:
        return len(self._pending)


class Holders:
    """The sessions of one replica by the ids of the credentials they stand on (:attr:`User.revocation_ids`),
    so that a revocation closes exactly theirs."""

    def __init__(self) -> None:
        self._by_id: dict[str, set[Peer]] = {}

    def add(self, peer: Peer) -> None:
        for token_id in peer.user.revocation_ids:
            self._by_id.setdefault(token_id, set()).add(peer)

    def discard(self, peer: Peer) -> None:
        for token_id in peer.user.revocation_ids:
            holders = self._by_id.get(token_id)
            if holders is not None:
                holders.discard(peer)
                if not holders:
                    del self._by_id[token_id]

    def of(self, token_id: str) -> list[Peer]:
        return list(self._by_id.get(token_id, ()))

    def __len__(self) -> int:
        return len(self._by_id)

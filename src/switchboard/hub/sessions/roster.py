"""The live connections of one replica: by client address, by workspace, and by the credentials they stand on.

The attach and the detach's bookkeeping, without I/O: who a connection
replaced, whether it is the first or the last of its workspace here, whether
it was still its client's live connection when it left. The hub reads the
answers into :class:`~switchboard.hub.sessions.life.Life`'s transitions. The
tables are shared, read only, with what routes and moves frames.
"""

from __future__ import annotations

from dataclasses import dataclass

from switchboard.hub.sessions.joins import Holders
from switchboard.hub.sessions.peer import Peer


@dataclass(frozen=True, slots=True)
class Joined:
    """A connection put in the tables: the live one of its client it replaced, and whether it is the
    first of its workspace here."""

    replaced: Peer | None
    first_in_workspace: bool


@dataclass(frozen=True, slots=True)
class Left:
    """A connection taken out of the tables: whether it was its client's live one, and the last of its
    workspace here."""

    current: bool
    workspace_empty: bool


class Roster:
    """Every live connection here (see the module docstring)."""

    def __init__(self) -> None:
        self.peers: dict[str, Peer] = {}  # the live connection of each client here, by address
        self.members: dict[str, set[Peer]] = {}  # the same, by workspace
        self.holders = Holders()  # by the credentials they stand on: whom a revocation closes

    def join(self, peer: Peer) -> Joined:
        """``peer`` is its client's live connection from now on."""
        replaced = self.peers.get(peer.id)
        self.peers[peer.id] = peer
        members = self.members.setdefault(peer.workspace, set())
        first = not members
        members.add(peer)
        if replaced is not None:
            members.discard(replaced)
        self.holders.add(peer)
        return Joined(replaced, first)

    def leave(self, peer: Peer) -> Left:
        """``peer`` is no longer here (a newer connection of its client may be, and stays)."""
        members = self.members.get(peer.workspace)
        if members is not None:
            members.discard(peer)
        self.holders.discard(peer)
        current = self.peers.get(peer.id) is peer
        if current:
            del self.peers[peer.id]
        empty = members is not None and not members
        if empty:
            self.members.pop(peer.workspace, None)
        return Left(current, empty)

    def has_workspace(self, workspace: str) -> bool:
        return workspace in self.members

    def __len__(self) -> int:
        return len(self.peers)

    def __repr__(self) -> str:
        return f"<Roster clients={len(self.peers)} workspaces={len(self.members)}>"

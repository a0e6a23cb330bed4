"""What a step of a client's life calls for: values the hub carries out, in order.

:class:`~switchboard.hub.sessions.life.Life` decides; these say what follows,
and the hub (:meth:`~switchboard.hub.hub.Hub.attach`,
:meth:`~switchboard.hub.hub.Hub.detach`) does the I/O. Each names the client by
its address (``"<workspace>/<client_id>"``) or its workspace, never a socket
or a channel: which channel carries a client is the hub's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RefuseJoin:
    """A deletion or revocation notice came while it joined: closed with the policy code, and refused."""

    reason: str


@dataclass(frozen=True, slots=True)
class Supersede:
    """It replaced a live connection of its client here: that one is closed, and what it still had
    goes to this one behind its ``connection_info`` (``resume``) or fails (a new session)."""

    address: str
    resume: bool


@dataclass(frozen=True, slots=True)
class Listen:
    """Frames for ``address`` from other replicas are this connection's: subscribe its channel."""

    address: str


@dataclass(frozen=True, slots=True)
class JoinWorkspace:
    """The first member here of ``workspace``: subscribe its event channel."""

    workspace: str


@dataclass(frozen=True, slots=True)
class TakeOver:
    """The id was held on another replica: the copy there is closed (``taken``)."""

    address: str


@dataclass(frozen=True, slots=True)
class Resume:
    """It resumed its client's session: the transit ends everywhere, and what waited for it comes."""

    address: str


@dataclass(frozen=True, slots=True)
class Expect:
    """Its connection ended and it is no longer the live one: frames that come while the stores are
    asked are held if its client may come back."""

    address: str


@dataclass(frozen=True, slots=True)
class HandOn:
    """A newer connection of the client attached here while this one was cleaned up: what was held
    for the client goes to it, and the client's channel stays subscribed (it is the newer one's)."""

    address: str


@dataclass(frozen=True, slots=True)
class Unlisten:
    """Nothing more for ``address`` from the other replicas: unsubscribe its channel."""

    address: str


@dataclass(frozen=True, slots=True)
class LeaveWorkspace:
    """The last member here of ``workspace`` left: unsubscribe its event channel (unless one joined meanwhile)."""

    workspace: str


@dataclass(frozen=True, slots=True)
class Depart:
    """Ask the registry to put its client in transit; its answer is :meth:`Life.departed`'s."""

    address: str


@dataclass(frozen=True, slots=True)
class Salvage:
    """In transit: what the ended connection still had waits for the client's next one."""

    address: str


@dataclass(frozen=True, slots=True)
class Purge:
    """It left: its registrations go and its departure is announced (its uploads are forgotten)."""

    workspace: str
    client_id: str


# what attaching calls for, then what letting go does
Effect = (
    Supersede
    | RefuseJoin
    | Listen
    | JoinWorkspace
    | TakeOver
    | Resume
    | Expect
    | HandOn
    | Unlisten
    | LeaveWorkspace
    | Depart
    | Salvage
    | Purge
)

"""What the router decides a frame's fate to be: plain values, carried out by the dispatch.

One frame, one action (:data:`Action`); an action that may not succeed names
what to do instead (:class:`Hold` ``otherwise``), decided at the same time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from switchboard.hub.routing.undelivered import Undelivered
from switchboard.protocol.hypha.envelope import Envelope

if TYPE_CHECKING:  # a peer is named, never used: the actions stay values without I/O
    from switchboard.hub.sessions.peer import Peer


@dataclass(slots=True)
class Deliver:
    """Send to a client of this replica; if its connection refuses, hold the frame or fail its caller."""

    peer: Peer
    item: Undelivered


@dataclass(slots=True)
class Send:
    """Send to a client here as is (an answer to its own frame, or a frame another replica counted)."""

    peer: Peer
    message: bytes | str


@dataclass(slots=True)
class SendToken:
    """Answer ``refresh_token``: the client's reconnection token (signed by the hub)."""

    peer: Peer


@dataclass(slots=True)
class Forward:
    """To a client on another replica: over a direct link if one takes it now, else published.

    ``wire`` is the frame as it travels between replicas: a call the manager
    makes wrapped with its origin (:func:`~switchboard.protocol.link.replica_wire.wrap_manager_call`),
    once, by the router; any other frame as it is. The link is tried once
    (never for an event), the bus after it.
    """

    target: str
    item: Undelivered
    wire: bytes


@dataclass(slots=True)
class Hold:
    """Keep for a client in transit until it is back; ``otherwise`` if its holding is full.

    ``begins``: its connection here has just ended in a way it comes back from,
    and its transit begins now, before the hub's clean-up tells the registry.
    """

    target: str
    item: Undelivered
    otherwise: Action | None
    begins: bool = False


@dataclass(slots=True)
class RetryLater:
    """Into the retry window, behind what already waits for the target. The window only
    publishes it: its frame is the one that travels between replicas (:class:`Forward` ``wire``)."""

    target: str
    item: Undelivered


@dataclass(slots=True)
class RetryIfClaimed:
    """It reached nobody: into the retry window if some replica claims the client (a registry
    read, which the dispatch makes), else its caller fails (:class:`Fail`). Its frame travels as
    :class:`RetryLater`'s does."""

    target: str
    item: Undelivered


@dataclass(slots=True)
class Fail:
    """Nobody has the client: a caller that waits is told at once (the router's ``undeliverable``)."""

    target: str
    item: Undelivered


@dataclass(slots=True)
class ToAlias:
    """To an HTTP caller's address: the manager's RPC answers as that caller."""

    address: str
    frame: bytes


@dataclass(slots=True)
class ToManager:
    """To this replica's manager, on behalf of ``caller`` (``None``: a reply, or its own traffic).
    ``env``: the frame as the router decoded and stamped it, so the manager's door does not decode it again."""

    frame: bytes
    caller: Peer | None = None
    env: Envelope | None = None


@dataclass(slots=True)
class ToReplica:
    """To another replica's manager: it made the call this frame answers. Over a direct link if
    one takes it now, else into the replies' retry window; ``behind``: replies already wait there
    for that replica, and it keeps its place behind them."""

    replica: str
    frame: bytes
    behind: bool = False


@dataclass(slots=True)
class BindFirst:
    """A call through a balanced handle not bound here for ``peer`` (it looked the service up on
    another replica): look ``target``'s service up as ``peer``, bind it, then route its frames
    again (:mod:`switchboard.hub.routing.binds`)."""

    peer: Peer
    target: str


@dataclass(slots=True)
class Broadcast:
    """An event for every subscribed client of a workspace, on every replica."""

    workspace: str
    event_type: str
    frame: bytes


Action = (
    Deliver
    | Send
    | SendToken
    | Forward
    | Hold
    | RetryLater
    | RetryIfClaimed
    | Fail
    | ToAlias
    | ToManager
    | ToReplica
    | Broadcast
    | BindFirst
)

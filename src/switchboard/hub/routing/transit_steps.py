"""What a client's transit calls for once the I/O answered: decisions as values, without I/O.

The moves (:mod:`switchboard.hub.transit.moves`) do the I/O of a client in
transit (the registry's mark, the notices between replicas, the grace's end)
and report what it turned up here as a fact: the registry marked the client
or refused, settled its transit as ``waiting``, ``none`` or ``expired``, a
notice came, a holding is full. :class:`TransitSteps` keeps the books of the
:class:`~switchboard.hub.sessions.in_transit.Transit` table (pure too) and returns
the steps that follow, in order (:data:`Step`): send frames on, fail them,
announce a departure, tell the other replicas, close a copy; the moves only
carry them out, as the dispatch carries out the router's actions.

What the connection of a client that came back with a new one still had
(:func:`superseded_leftovers`) is decided here too, as the router's actions.

Nothing here awaits: every rule is a row of a synchronous table
(``tests/hub/test_transit_steps.py``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from switchboard.backends.base import Expiry
from switchboard.hub.routing.actions import Fail, Send
from switchboard.hub.routing.undelivered import Undelivered, undelivered_of
from switchboard.hub.sessions.in_transit import Transit, TransitEnd
from switchboard.protocol.hypha.services import ServiceInfo

if TYPE_CHECKING:  # a peer is named and read, never written to: the steps stay values without I/O
    from switchboard.clock import Clock
    from switchboard.hub.sessions.peer import Peer

log = logging.getLogger(__name__)

# Seconds between asking the registry whether a client we hold frames for is still away.
RECHECK = 0.5

NoticeKind = Literal["left", "back", "gone", "abandoned", "taken"]
# the notices that end a client's transit for good: what was held for it fails
ENDING: tuple[NoticeKind, ...] = ("gone", "abandoned")


@dataclass(frozen=True, slots=True)
class SendOn:
    """Route a finished transit's frames again, in order: its client is back (here or elsewhere)."""

    client: str
    frames: tuple[Undelivered, ...]
    away: float  # seconds the client was in transit


@dataclass(frozen=True, slots=True)
class Forget:
    """Drop what the router kept for the client's next connection here (its uploads)."""

    client: str


@dataclass(frozen=True, slots=True)
class Notify:
    """Tell every replica, on the transit channel (fire and forget); ``grace`` goes with ``left``."""

    kind: NoticeKind
    client: str
    grace: float | None = None


@dataclass(frozen=True, slots=True)
class AnnounceGone:
    """The client's grace ran out: tell its workspace it left (its ``removed`` services, then the client)."""

    client: str
    removed: tuple[ServiceInfo, ...]


@dataclass(frozen=True, slots=True)
class CameBack:
    """The client of ``peer`` is back after ``away`` seconds in transit, ``held_here`` frames held for it here."""

    peer: Peer
    away: float
    held_here: int


@dataclass(frozen=True, slots=True)
class FailWaiting:
    """The frames for the client in the retry window fail now: it is known gone."""

    client: str


@dataclass(frozen=True, slots=True)
class WakeWaiting:
    """The retry window tries the client's frames at once: it is reachable again."""

    client: str


@dataclass(frozen=True, slots=True)
class CloseCopy:
    """Close a connection of the client here: another replica took the client over."""

    peer: Peer
    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class WakeKeeper:
    """The keeper of the graces reads its next deadline again (a new transit, or the first frame held)."""


WAKE_KEEPER = WakeKeeper()

Step = SendOn | Forget | Fail | Notify | AnnounceGone | CameBack | FailWaiting | WakeWaiting | CloseCopy | WakeKeeper


@dataclass(frozen=True, slots=True)
class MarkInTransit:
    """Ask the registry to mark the client in transit for ``grace`` seconds; ``steps`` first (its
    transit here began)."""

    grace: float
    steps: tuple[Step, ...]


class TransitSteps:
    """The decisions of clients in transit on one replica (see the module docstring).

    ``transit`` is the table it keeps the books of; ``peers`` (the clients
    here) is the hub's, read only.
    """

    def __init__(
        self, *, transit: Transit[Undelivered], clock: Clock, replica_id: str, peers: Mapping[str, Peer]
    ) -> None:
        self.transit = transit
        self.clock = clock
        self.replica_id = replica_id
        self.peers = peers

    # -- holding frames ------------------------------------------------------

    def may_return(self, peer: Peer) -> bool:
        """Whether this ended connection's client is expected back (:meth:`Life.expected_back`)."""
        return peer.life.expected_back(self.clock.monotonic(), grace=self.transit.grace)

    def begin(self, client: str, remaining: float | None = None) -> list[Step]:
        """``client`` is in transit from now (for ``remaining`` s, default: the grace), unless it was."""
        return [WAKE_KEEPER] if self.transit.left(client, remaining) else []

    def hold(self, target: str, item: Undelivered, *, begins: bool = False) -> tuple[bool, list[Step]]:
        """Keep a frame for a client in transit; ``False``: its holding is full (or it is not in transit).
        ``begins``: its transit begins now (the router found its connection here just ended)."""
        steps = self.begin(target) if begins else []
        if not self.transit.hold(target, item, size=len(item.frame)):
            return False, steps
        if self.transit.holding == 1 and not steps:
            steps.append(WAKE_KEEPER)  # the keeper rechecks every RECHECK seconds from now
        return True, steps

    def expect(self, peer: Peer) -> list[Step]:
        """Hold frames for the client of this ended connection from now on, if it may return."""
        return self.begin(peer.id) if self.may_return(peer) else []

    def taken_up(self, peer: Peer) -> list[Step]:
        """``peer`` attached while its client's previous connection here was being cleaned up: what
        was held goes to it now (unless its own attach took it already)."""
        return self._released(self.transit.back(peer.id))

    def salvage(self, peer: Peer) -> list[Step]:
        """What an ended connection's client may still need waits for it, ahead of what was held for
        it since, the newest kept first; once one is refused (the holding is full), it and every
        older one fail now, not at their callers' timeout."""
        failed: list[Step] = []
        full = False
        for frame in reversed(peer.leftovers(self.clock.monotonic())):
            item = undelivered_of(frame, walked=True)
            if item is None:
                continue
            if full or not self.transit.hold(peer.id, item, size=len(frame), first=True):
                full = True
                failed.append(Fail(peer.id, item))
        return failed

    # -- a client leaves and comes back --------------------------------------

    def departure(self, peer: Peer) -> bool | MarkInTransit:
        """A connection ended: ``True`` if its client is in transit already, ``False`` if it left (a
        goodbye, dropped by the hub, no grace), else the registry is asked to mark it."""
        if peer.life.moving:  # the drain put it in transit before it was let go
            return True
        if not self.may_return(peer):
            return False
        return MarkInTransit(self.transit.grace, tuple(self.begin(peer.id)))

    def marked(self, peer: Peer, *, marked: bool, grace: float) -> tuple[bool, list[Step]]:
        """The registry's answer to :class:`MarkInTransit` (``False`` too when it could not be asked).

        Refused: the client is back elsewhere already, and what this connection
        still had goes on with what was held here, to wherever it is live now;
        the caller cleans up as for any departure (``False``). Marked: the
        other replicas hear it left (``True``).
        """
        if not marked:
            return False, [*self.salvage(peer), *self._released(self.transit.cancel(peer.id))]
        peer.life.left_in_transit(self.clock.monotonic() + grace)
        return True, [Notify("left", peer.id, grace=grace)]

    def arriving(self, peer: Peer) -> None:
        """A reconnection comes in (before the registry is asked whether its client was in transit)."""
        peer.life.arrived(self.clock.monotonic())

    def arrived(self, peer: Peer, *, away: float | None) -> list[Step]:
        """The registry ended the client's transit (``away`` seconds), or it was not in transit
        (``None``) as far as the registry knows: what waited here for it comes, and if it was away
        (by the registry, or by this replica's own books) the others hear it is back."""
        released = self.transit.back(peer.id)
        steps = [*self._released(released), WakeWaiting(peer.id)]  # its frames queue behind connection_info
        if away is None and released is not None:
            away = released.away
        if away is None:
            return steps
        peer.life.back()
        held_here = len(released.frames) if released is not None else 0
        return [*steps, CameBack(peer, away, held_here), Notify("back", peer.id)]

    def abandoned(self, client: str) -> list[Step]:
        """A new session of ``client`` replaces the one in transit: what was held for that one fails,
        here and on every replica."""
        return [
            *self._released(self.transit.cancel(client), fail=True),
            FailWaiting(client),
            Notify("abandoned", client),
        ]

    def taken(self, client: str) -> list[Step]:
        """``client`` was taken over here from another replica: a copy still live there is closed."""
        return [Notify("taken", client)]

    # -- the grace's end -----------------------------------------------------

    def to_settle(self) -> list[str]:
        """The clients to ask the registry about: those whose grace is over, and those we hold frames
        for that we have not asked about for :data:`RECHECK` seconds (a lost ``back``)."""
        due = set(self.transit.due())
        now = self.clock.monotonic()
        for client in self.transit.holders():
            if client in due or now - self.transit.since(client) >= RECHECK:
                due.add(client)
        return sorted(due)

    def settled(self, client: str, expiry: Expiry) -> list[Step]:
        """The registry settled ``client``'s transit (its clock, one winner): ``waiting`` keeps holding
        until the registry's deadline; ``none`` (back, or expired by another replica) sends the frames
        on; ``expired`` here announces the departure, and the held frames fail (never routed again:
        the id is free, a newcomer may hold it)."""
        if expiry.state == "waiting":
            self.transit.extend(client, expiry.remaining)
            return []
        if expiry.state == "none":
            return self._released(self.transit.cancel(client))
        released = self.transit.expire(client)
        return [
            AnnounceGone(client, tuple(expiry.removed)),
            Notify("gone", client),
            FailWaiting(client),
            *self._released(released, fail=True),
        ]

    def swept(self, clients: list[str]) -> int:
        """Transits whose grace is over that nobody here knew of are due now; how many were new."""
        swept = 0
        for client in clients:
            if client in self.transit:
                continue  # the keeper settles it
            self.transit.left(client, 0.0)
            swept += 1
        return swept

    def next_wake(self) -> float | None:
        """When the keeper settles next (the hub's clock): the next grace's end, or :data:`RECHECK`
        from now while frames are held; ``None``: nothing to wait for."""
        deadline = self.transit.next_deadline()
        if self.transit.holders():
            recheck = self.clock.monotonic() + RECHECK
            deadline = recheck if deadline is None else min(deadline, recheck)
        return deadline

    # -- notices between replicas --------------------------------------------

    def notice_bytes(self, notice: Notify) -> bytes:
        """``{kind: "<ws>/<cid>", "from": replica[, "grace": s]}``, as every replica reads it."""
        body: dict[str, str | float] = {notice.kind: notice.client, "from": self.replica_id}
        if notice.grace is not None:
            body["grace"] = notice.grace
        return json.dumps(body).encode()

    def on_notice(self, data: bytes) -> list[Step]:
        """Another replica's notice: what it means here."""
        try:
            notice = json.loads(data)
            origin = notice["from"]
        except (ValueError, KeyError, TypeError):
            log.warning("dropped a malformed transit notice: %r", data[:200], extra={"replica": self.replica_id})
            return []
        if origin == self.replica_id:
            return []
        if isinstance(client := notice.get("left"), str):
            grace = notice.get("grace")
            return self.begin(client, float(grace) if isinstance(grace, int | float) else None)
        if isinstance(client := notice.get("back"), str):
            # and frames sent before we heard it left: its new replica has it now
            return [*self._released(self.transit.back(client)), WakeWaiting(client)]
        if isinstance(client := notice.get("gone"), str) or isinstance(client := notice.get("abandoned"), str):
            return [FailWaiting(client), *self._released(self.transit.cancel(client), fail=True)]
        if isinstance(client := notice.get("taken"), str):
            return self._copy_taken(client, str(origin))
        return []

    def _copy_taken(self, client: str, origin: str) -> list[Step]:
        peer = self.peers.get(client)
        if peer is None or peer.closed:
            return []
        if peer.life.just_arrived(self.clock.monotonic()):
            # hypha-rpc reconnecting may open two connections at once (through a balancer, to
            # two replicas) and closes one itself within the second: the client chooses
            return []
        peer.log.info("superseded by a new connection on replica %s", origin)  # one live copy
        return [CloseCopy(peer, 1000, "Superseded by a new connection of the same client")]

    # -- a finished transit's frames -------------------------------------------

    def _released(self, released: TransitEnd[Undelivered] | None, *, fail: bool = False) -> list[Step]:
        """A finished transit's frames: routed again in order (to the client if it is back, else they
        fail there), or with ``fail`` failed at once (it left, or a new session took its id). What
        the router kept for the client's next connection here goes with them."""
        if released is None:
            return []
        if not released.frames:
            return [Forget(released.client)]
        if fail:
            return [Forget(released.client), *(Fail(released.client, item) for item in released.frames)]
        return [Forget(released.client), SendOn(released.client, tuple(released.frames), released.away)]


def superseded_leftovers(new: Peer, leftovers: list[bytes], *, resume: bool) -> list[Send | Fail]:
    """A client's new connection replaced a live one here: what the old one still had goes to the
    new one behind its ``connection_info`` if it resumes the session, else (a new session) it fails."""
    if resume:
        return [Send(new, frame) for frame in leftovers]
    failed: list[Send | Fail] = []
    for frame in leftovers:
        if (item := undelivered_of(frame)) is not None:
            failed.append(Fail(new.id, item))
    return failed

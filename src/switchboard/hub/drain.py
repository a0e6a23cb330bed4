"""Draining on SIGTERM: finish what is under way, then send every client elsewhere.

A collaborator of :class:`~switchboard.hub.hub.Hub`: it tells the
:class:`~switchboard.hub.router.Router` that the replica drains (new calls to
its clients then wait for them elsewhere), waits on the router's calls in
flight, and puts each client in transit (:class:`~switchboard.hub.moves.Moves`)
as it sends it away.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Mapping

from switchboard.clock import Clock
from switchboard.hub.drain_pace import DrainPace, InFlight
from switchboard.hub.moves import Moves
from switchboard.hub.peer import Peer
from switchboard.hub.remote import CLIENT_CHANNEL
from switchboard.hub.retry import RetryWindow
from switchboard.hub.router import Router
from switchboard.replicas.unicast import Unicast

log = logging.getLogger(__name__)

# Seconds between looks at what this replica still holds for the clients it sent away.
HANDOVER_POLL = 0.02
# When a client is sent away: hypha-rpc 0.21.47 can lose a call it sends in the
# millisecond after its stream ends (it then opens two connections at once and loses
# track of what it was sending), so the hand-over goes where a client is least likely
# to be sending: early in a pause. That is QUIET to QUIET + PAUSE seconds after its last
# frame (a call and the heartbeat answer that follows it come within 2 ms; the next
# call of a steady caller, 20 ms later at 50 calls/s), or at once for a client idle for
# IDLE seconds, and after QUIET_WAIT at the latest (a client that never pauses).
QUIET = 0.005
PAUSE = 0.005
IDLE = 0.05
QUIET_WAIT = 0.1
# Pacing (drain_pace): seconds a client sent away counts against the window at most when there is
# no transit grace (with one, the grace: a client not back by then is gone, and must not hold up the
# rest), and between looks at who is back while the window is full.
PATIENCE = 2.0
PACE_POLL = 0.02


class Drainer:
    """Drains one replica; ``peers`` is the hub's table of clients here (read only)."""

    def __init__(
        self,
        *,
        router: Router,
        moves: Moves,
        unicast: Unicast,
        clock: Clock,
        peers: Mapping[str, Peer],
        retry: RetryWindow,
        window: int = 0,
        alone: bool = False,
    ) -> None:
        self.window = window  # clients in flight at once (drain_pace.DrainPace); 0: all at once
        self.alone = alone  # no sibling can take a client in: nothing held here can follow it
        self._until: float | None = None  # set while draining: see holding_until
        self.router = router
        self.inflight = router.inflight
        self.moves = moves
        self.transit = moves.transit
        self.unicast = unicast
        self.clock = clock
        self.peers = peers
        self.retry = retry
        self.log = logging.LoggerAdapter(log, {"replica": router.replica_id})

    async def drain(self, timeout: float, *, code: int, reason: str) -> None:
        """Stop taking new calls, let calls in flight finish, then tell every client to move.

        A client's channel is unsubscribed as soon as it waits for no reply:
        new calls from other replicas then wait in their senders' retry windows
        until the client has reconnected to a sibling, instead of landing here.
        A client still waiting for replies keeps its channel until they came.
        Each client is put in transit as it is closed (every replica then
        holds its frames and announces nothing). Clients are sent away in
        waves (:mod:`~switchboard.hub.drain_pace`): at most ``window`` in
        flight to a sibling at once, yet all by ``timeout``; a client waiting
        for its wave keeps its channel, and a new call to it waits here for it
        (:meth:`holding_until`). The drain ends once what
        this replica holds for the clients it sent away has followed them,
        bounded by the transit grace.
        """
        self.router.draining = True
        cutoff = self.inflight.opened_count  # only calls already under way are waited for
        unsubscribed: set[str] = set()
        ready_since: dict[str, float] = {}  # when each client had no call left to wait for
        started = self.clock.monotonic()
        deadline = started + timeout
        self._until = deadline + self.transit.grace
        patience = self.transit.grace or PATIENCE
        pace = DrainPace(
            window=self.window, patience=patience, started=started, deadline=deadline, total=len(self.peers)
        )
        flight = InFlight(patience)
        logged = 0.0
        while True:
            wake = deadline
            now = self.clock.monotonic()
            for client in flight.flying():
                if client not in self.transit:  # its "back" notice came: it is admitted elsewhere
                    flight.back(client)
            waiting = sum(1 for peer in self.peers.values() if not peer.closed)
            if flight.sent + waiting > pace.total:  # a client taken over here meanwhile: it goes too
                pace = dataclasses.replace(pace, total=flight.sent + waiting)
            allowed = pace.allowance(now=now, sent=flight.sent, in_flight=flight.count(now))
            for peer in list(self.peers.values()):
                if peer.closed:
                    continue
                if allowed <= 0:  # the sibling is still admitting the last wave: the rest stay, subscribed
                    wake = min(wake, now + PACE_POLL, pace.next_due(flight.sent))
                    break
                if peer.id not in unsubscribed and not self.inflight.waits_before(peer.id, cutoff):
                    unsubscribed.add(peer.id)
                    await self.unicast.unsubscribe(CLIENT_CHANNEL + peer.id)
                if peer.id in unsubscribed and not self.inflight.busy_before(peer.id, cutoff):
                    now = self.clock.monotonic()
                    since = ready_since.setdefault(peer.id, now)
                    if (later := _moment(peer.last_heard, since, now)) is not None:
                        wake = min(wake, later)
                        continue  # it is sending: wait for a pause
                    peer.close(code, reason)  # written by its writer task: after depart() has begun
                    if await self.moves.depart(peer):
                        flight.add(peer.id, now)
                    allowed -= 1
            busy = [p for p in self.peers.values() if not p.closed]
            now = self.clock.monotonic()
            remaining = deadline - now
            if not busy or remaining <= 0:
                break
            if now - logged >= 1.0:
                logged = now
                self.log.info(
                    "draining: %d clients left (%d in flight to a sibling), %d calls in flight",
                    len(busy),
                    flight.count(now),
                    len(self.inflight),
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.inflight.changed(), max(0.0, min(wake - now, 0.5)))
        for peer in list(self.peers.values()):
            if not peer.closed:
                peer.close(code, reason)
                await self.moves.depart(peer)
        await self._hand_over()

    def holding_until(self, client: str) -> float | None:
        """Until when a frame for ``client``, here and waiting for its wave, may wait (the retry
        window's bound): the drain's end and the client's grace; ``None`` if it is not waiting."""
        if self._until is None:
            return None
        peer = self.peers.get(client)
        return None if peer is None or peer.closed else self._until

    async def _hand_over(self) -> None:
        """Until every client sent away is detached (what it sent before it saw the end is routed,
        what was still queued for it is held) and what is held or retried here for moved clients
        has been sent on, bounded by the grace. Alone, only until they are detached: nobody can take
        them in while this replica drains, and what it holds dies with it (waiting out their grace
        would only hold up the restart they wait for)."""
        deadline = self.clock.monotonic() + self.transit.grace

        def busy() -> bool:
            if self.alone:
                return bool(self.peers)
            return bool(self.peers) or bool(self.transit.holding) or not self.retry.idle()

        while busy() and self.clock.monotonic() < deadline:
            await self.clock.sleep(HANDOVER_POLL)
        if busy():
            self.log.info(
                "draining: %d clients not detached, %d frames held for clients that did not come back in time",
                len(self.peers),
                self.transit.holding,
            )


def _moment(last_heard: float, since: float, now: float) -> float | None:
    """``None``: send the client away now; else when to look again (see QUIET)."""
    quiet = now - last_heard
    if quiet >= IDLE or QUIET <= quiet < QUIET + PAUSE or now - since >= QUIET_WAIT:
        return None
    if quiet < QUIET:
        return min(last_heard + QUIET, since + QUIET_WAIT)
    return min(last_heard + IDLE, since + QUIET_WAIT)  # too late in this pause: the next one, or idle

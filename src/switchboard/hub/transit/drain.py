"""Draining on SIGTERM: finish what is under way, then send every client elsewhere.

A collaborator of :class:`~switchboard.hub.hub.Hub`: it tells the
:class:`~switchboard.hub.routing.router.Router` that the replica drains (new calls to
its clients then wait for them elsewhere), waits on the router's calls in
flight, and puts each client in transit (:class:`~switchboard.hub.transit.moves.Moves`)
as it sends it away.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
from collections import deque
from dataclasses import dataclass

from switchboard.clock import Clock
from switchboard.hub.routing.router import Router
from switchboard.hub.sessions.peer import Peer
from switchboard.hub.transit.drain_pace import DrainPace, SentAway
from switchboard.hub.transit.moves import Moves
from switchboard.hub.transit.retry import RetryWindow
from switchboard.hub.transit.retry_bound import DrainEnd
from switchboard.hub.transit.together import together
from switchboard.replicas.dataplane.inbound import CLIENT_CHANNEL
from switchboard.replicas.dataplane.unicast import Unicast

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
        peers: dict[str, Peer],
        retry: RetryWindow,
        calls_ended: asyncio.Event,
        window: int = 0,
        alone: bool = False,
        end: DrainEnd | None = None,
    ) -> None:
        self.window = window  # clients in flight at once (drain_pace.DrainPace); 0: all at once
        self.alone = alone  # no sibling can take a client in: nothing held here can follow it
        # until when frames for clients waiting for their wave may wait (set while draining; read by
        # the retry window's bound, hub/transit/retry_bound.py)
        self.end = end or DrainEnd()
        self.router = router
        self.inflight = router.inflight
        self.calls_ended = calls_ended  # set by the router's InFlight when a call ends
        self.moves = moves
        self.transit = moves.transit
        self.unicast = unicast
        self.clock = clock
        self.peers = peers
        self.retry = retry
        self.log = logging.LoggerAdapter(log, {"replica": router.replica_id})

    async def drain(self, timeout: float, *, code: int, reason: str) -> None:
        """Stop taking new calls, let calls in flight finish, then tell every client to move.

        A client's channel is unsubscribed when its turn comes and it waits for
        no reply: new calls from other replicas then wait in their senders'
        retry windows until the client has reconnected to a sibling, instead
        of landing here. A client still waiting for replies keeps its channel
        until they came. Each client is put in transit as it is closed (every
        replica then holds its frames and announces nothing). Clients are sent
        away in their order here, at the pace the sibling admits them
        (:mod:`~switchboard.hub.transit.drain_pace`), and whoever is left at
        ``timeout`` at once; a client waiting for its turn keeps its channel,
        and a new call to it waits here for it (:class:`~switchboard.hub.transit.retry_bound.RetryBound`). The
        drain ends once what this replica holds for the clients it sent away
        has followed them, bounded by the transit grace.

        A pass costs what its wave costs, not what the replica holds: the
        clients wait in a queue taken once, newcomers (a handshake that was
        under way) are found at the end of the table.
        """
        self.router.draining = True
        cutoff = self.inflight.opened_count  # only calls already under way are waited for
        started = self.clock.monotonic()
        deadline = started + timeout
        self.end.until = deadline + self.transit.grace
        queue = _Queue(self.peers)
        patience = self.transit.grace or PATIENCE
        pace = DrainPace(window=self.window, patience=patience, started=started, deadline=deadline, total=len(queue))
        flight = SentAway(patience)
        wave: dict[str, _Turn] = {}  # their turn came: each waits for its calls, or for a pause, then goes
        logged = warned = 0.0
        while True:
            now = self.clock.monotonic()
            if now >= deadline:
                break
            for client in flight.flying():  # the window at most
                if client not in self.transit:  # its "back" notice came: it is admitted elsewhere
                    flight.back(client, now)
            if fresh := queue.newcomers():  # a client taken over here meanwhile: it goes too
                pace = dataclasses.replace(pace, total=pace.total + fresh)
            rate = flight.rate(now)
            allowed = pace.allowance(now=now, sent=flight.sent, in_flight=flight.count(now), rate=rate)
            while len(wave) < allowed and (peer := queue.next()) is not None:
                wave.setdefault(peer.id, _Turn(peer))
            wake = now + PACE_POLL if len(queue) else deadline  # more to send: look at who is back soon
            wake = min(wake, await self._send_wave(wave, cutoff, code, reason, flight))
            if not wave and not len(queue):
                break
            now = self.clock.monotonic()
            if now - logged >= 1.0:
                logged = now
                self.log.info(
                    "draining: %d clients left (%d in flight to a sibling, %s admitted/s), %d calls in flight",
                    len(queue) + len(wave),
                    flight.count(now),
                    "?" if rate is None else f"{rate:.0f}",
                    len(self.inflight),
                )
            if not warned and (short := pace.short_by(now=now, sent=flight.sent, rate=rate)) > 0:
                warned = now
                self.log.warning(
                    "draining: at the %.0f clients/s the sibling admits, --drain-timeout is %.0f s short for "
                    "%d clients; those left at the deadline go at once, past their grace if it cannot take them",
                    rate,
                    short,
                    pace.total - flight.sent,
                )
            with contextlib.suppress(TimeoutError):
                self.calls_ended.clear()
                await asyncio.wait_for(self.calls_ended.wait(), max(0.0, min(wake - now, 0.5)))
        left = [peer for peer in self.peers.values() if not peer.closed]
        for peer in left:
            peer.close(code, reason)
        await together(left, self._depart)  # thousands, one after the other, took minutes (issue 26)
        await self._hand_over()

    async def _depart(self, peer: Peer) -> None:
        await self.moves.depart(peer)

    async def _send_wave(self, wave: dict[str, _Turn], cutoff: int, code: int, reason: str, flight: SentAway) -> float:
        """Send away those of ``wave`` that may go now, side by side (their Redis work then goes in a
        few pipelines; one after the other, each paid its round trips); when to look at the rest."""
        laters = [math.inf]

        async def turn_of(turn: _Turn) -> None:
            later = await self._send_away(turn, cutoff, code, reason, flight)
            if later is None:
                wave.pop(turn.peer.id, None)
            else:
                laters.append(later)

        await together(list(wave.values()), turn_of)
        return min(laters)

    async def _send_away(self, turn: _Turn, cutoff: int, code: int, reason: str, flight: SentAway) -> float | None:
        """Send ``turn``'s client away if it may go now: ``None`` once it went (or left by itself),
        else when to look again (it waits for its calls, or for a pause in what it sends)."""
        peer = turn.peer
        if peer.closed:
            return None
        if not turn.unsubscribed:
            if self.inflight.waits_before(peer.id, cutoff):
                return self.clock.monotonic() + 0.5  # or sooner: a call's end wakes the drain
            turn.unsubscribed = True
            await self.unicast.unsubscribe(CLIENT_CHANNEL + peer.id)
        if self.inflight.busy_before(peer.id, cutoff):
            return self.clock.monotonic() + 0.5
        now = self.clock.monotonic()
        if turn.ready_since is None:
            turn.ready_since = now
        if (later := _moment(peer.last_heard, turn.ready_since, now)) is not None:
            return later  # it is sending: wait for a pause
        peer.close(code, reason)  # written by its writer task: after depart() has begun
        if await self.moves.depart(peer):
            flight.add(peer.id, now)
        else:
            flight.skip()  # it left instead: it takes no place in the window
        return None

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


@dataclass(slots=True)
class _Turn:
    """A client whose turn to go came: it goes once it waits for no call and pauses."""

    peer: Peer
    unsubscribed: bool = False
    ready_since: float | None = None  # when it first had no call left to wait for


class _Queue:
    """The clients waiting for their turn, in their order here, taken from the table once; a
    newcomer (a handshake under way at the signal, a take-over) is found at the table's end."""

    def __init__(self, peers: dict[str, Peer]) -> None:
        self.peers = peers
        self._queue: deque[Peer] = deque(peers.values())
        self._seen: dict[str, Peer] = dict(peers)

    def __len__(self) -> int:
        return len(self._queue)

    def next(self) -> Peer | None:
        """The next client still here (its live copy, if it was taken over here meanwhile)."""
        while self._queue:
            peer = self.peers.get(self._queue.popleft().id)
            if peer is not None and not peer.closed:
                self._seen[peer.id] = peer
                return peer
        return None

    def newcomers(self) -> int:
        """Queue the clients that joined the table since the last look; how many. Costs the
        newcomers' number: the walk from the table's end stops at the first client seen."""
        fresh = 0
        for client in reversed(self.peers):
            peer = self.peers[client]
            if self._seen.get(client) is peer:
                break
            self._seen[client] = peer
            self._queue.append(peer)
            fresh += 1
        return fresh


def _moment(last_heard: float, since: float, now: float) -> float | None:
    """``None``: send the client away now; else when to look again (see QUIET)."""
    quiet = now - last_heard
    if quiet >= IDLE or QUIET <= quiet < QUIET + PAUSE or now - since >= QUIET_WAIT:
        return None
    if quiet < QUIET:
        return min(last_heard + QUIET, since + QUIET_WAIT)
    return min(last_heard + IDLE, since + QUIET_WAIT)  # too late in this pause: the next one, or idle

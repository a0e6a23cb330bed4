"""Clients in transit, the hub's side: the registry's mark, notices between replicas, the grace's end.

A collaborator of :class:`~switchboard.hub.hub.Hub`, doing the I/O of moves.
It decides nothing: what the I/O turns up (the registry marked the client or
refused, settled its transit, a notice came) goes to
:class:`~switchboard.hub.routing.transit_steps.TransitSteps` as a fact, and the
steps it returns (send on, fail, announce, notify, close a copy) are carried
out here, in order; for a frame, whether it is held is the router's
(:class:`~switchboard.hub.routing.actions.Hold`).

* A connection that ends without a goodbye (a drain's 1012, a drop) puts its
  client in transit (:meth:`Moves.depart`): the registry marks it (its
  registrations stay; the store's clock keeps the deadline) and every
  replica hears ``left`` on :data:`TRANSIT_CHANNEL`. From then on, frames for
  it are held where they are sent, and nothing announces a departure.
* The client reconnects with its reconnection token (:meth:`Moves.arrived`):
  the replica it reaches ends the mark, takes over its ownership, delivers
  what it held and says ``back``; every other replica then sends on what it held.
* Its grace runs out first (:meth:`Moves.settle_transits`): whichever replica
  ends the mark in the registry removes its registrations and announces the
  departure, as a clean disconnect would have at once, and says ``gone``;
  the held frames then fail everywhere and their callers get "not connected"
  (never routed again: the id is free, a newcomer may hold it).

Who may come back is the hub's decision (:func:`~switchboard.hub.gate.admission.take_over`):
only a connection that presented the client's reconnection token gets what
was held for it (:meth:`Moves.arrived`). The same user starting a new session
with the id instead ends the transit for good (:meth:`Moves.abandon`: what was
held fails, on every replica, ``abandoned``). A client id is live in one place:
a replica that takes a client over from another says ``taken``, and the
other closes the copy it still has (:meth:`Moves.taken`), unless that copy
resumed less than :data:`~switchboard.hub.sessions.life.FRESH_GOODBYE` ago (hypha-rpc
may reconnect twice at once, and closes one connection itself).

Notices are an optimisation over pub/sub (fire and forget): a replica holding
frames asks the registry every :data:`~switchboard.hub.routing.transit_steps.RECHECK` seconds whether the client is
still away, so a lost ``back`` or a ``left`` that overtook it costs a delay,
never a frame.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from typing import Any

from switchboard.backends.base import Registry
from switchboard.clock import Clock
from switchboard.errors import BackendError
from switchboard.hub.routing.actions import Fail
from switchboard.hub.routing.transit_steps import (
    AnnounceGone,
    CameBack,
    CloseCopy,
    FailWaiting,
    Forget,
    Notify,
    SendOn,
    Step,
    TransitSteps,
    WakeKeeper,
    WakeWaiting,
)
from switchboard.hub.routing.undelivered import Undelivered
from switchboard.hub.sessions.in_transit import Transit
from switchboard.hub.sessions.peer import Peer
from switchboard.hub.transit.retry import RetryWindow
from switchboard.hub.transit.together import together
from switchboard.metrics import HubMetrics
from switchboard.protocol.hypha.services import ServiceInfo
from switchboard.replicas.dataplane.inbound import TRANSIT_CHANNEL
from switchboard.replicas.dataplane.remote import Remote
from switchboard.tasks import cancel_and_wait, spawn

log = logging.getLogger(__name__)

# notices on TRANSIT_CHANNEL: {"left"|"back"|"gone"|"abandoned"|"taken": "<ws>/<cid>", "from": replica, ...}

Reroute = Callable[[str, Undelivered], Awaitable[None]]
GiveUp = Callable[[str, Undelivered], None]
AnnounceDeparture = Callable[[str, str, list[ServiceInfo]], Awaitable[int]]


class Moves:
    """Clients in transit, the I/O side (see the module docstring).

    ``peers`` is the hub's table of clients here (read only); ``deliver``
    routes a held frame again once its transit ended, ``announce_gone``
    tells a workspace a client left (its services, then the client), ``forget``
    drops what the router kept for a client's next connection (its uploads)
    once its transit ended and it is not connected here.
    """

    def __init__(
        self,
        *,
        registry: Registry,
        remote: Remote,
        clock: Clock,
        metrics: HubMetrics,
        peers: Mapping[str, Peer],
        transit: Transit[Undelivered],
        retry: RetryWindow,
        give_up: GiveUp,
        deliver: Reroute,
        announce_gone: AnnounceDeparture,
        forget: Callable[[str], None] = lambda client: None,
    ) -> None:
        self.registry = registry
        self.remote = remote
        self.clock = clock
        self.metrics = metrics
        self.peers = peers
        self.transit = transit
        self.retry = retry
        self.give_up = give_up  # fails a held frame: its caller is told the client is not connected
        self.deliver = deliver
        self.announce_gone = announce_gone
        self.forget = forget
        self.replica_id = remote.replica_id
        self.steps = TransitSteps(transit=transit, clock=clock, replica_id=self.replica_id, peers=peers)
        self.log = logging.LoggerAdapter(log, {"replica": self.replica_id})
        self._wakeup = asyncio.Event()
        self._keeper: asyncio.Task[None] | None = None
        self._stopping = False
        self._background: set[asyncio.Task[Any]] = set()

    # -- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        self.metrics.watch_transit(self.transit)
        await self.remote.bus.subscribe(TRANSIT_CHANNEL)  # its notices come to on_notice
        self._keeper = asyncio.create_task(self._keep_time(), name=f"{self.replica_id} transit")

    async def stop(self) -> None:
        """End the keeper for sure: a Redis command it is in may swallow one cancel (:mod:`switchboard.tasks`)."""
        self._stopping = True
        self._wake()
        if self._keeper is not None:
            await cancel_and_wait([self._keeper])

    # -- carrying out the steps ------------------------------------------------

    def _run(self, steps: Iterable[Step]) -> Coroutine[object, object, None] | None:
        """Carry ``steps`` out in order as far as they go without waiting; return the rest, to be awaited."""
        pending = iter(steps)
        for step in pending:
            if isinstance(step, Fail):
                self.give_up(step.target, step.item)
            elif isinstance(step, SendOn):
                self._send_on(step)
            elif isinstance(step, Forget):
                self.forget(step.client)
            elif isinstance(step, FailWaiting):
                self.retry.fail(step.client)
            elif isinstance(step, WakeWaiting):
                self.retry.wake(step.client)
            elif isinstance(step, WakeKeeper):
                self._wake()
            elif isinstance(step, CloseCopy):
                step.peer.close(step.code, step.reason)
            elif isinstance(step, CameBack):
                self._returned(step)
            elif isinstance(step, Notify | AnnounceGone):
                return self._then(step, pending)
            else:
                raise TypeError(f"not a transit step: {step!r}")
        return None

    async def _then(self, first: Notify | AnnounceGone, rest: Iterable[Step]) -> None:
        if isinstance(first, Notify):
            await self.remote.publish(TRANSIT_CHANNEL, self.steps.notice_bytes(first))
        else:
            self.metrics.transit_expiries.inc()
            self.log.info("%s did not come back within %gs: announced gone", first.client, self.transit.grace)
            ws, _, cid = first.client.partition("/")
            await self.announce_gone(ws, cid, list(first.removed))
        await self._carry(rest)

    async def _carry(self, steps: Iterable[Step]) -> None:
        rest = self._run(steps)
        if rest is not None:
            await rest

    def _carry_now(self, steps: Iterable[Step]) -> None:
        """:meth:`_run` where nothing can wait (a bus callback, the dispatch): what is left runs as a task."""
        rest = self._run(steps)
        if rest is not None:
            spawn(self._background, rest, "transit steps")

    def _send_on(self, step: SendOn) -> None:
        """Route a finished transit's frames again, in order, in a task of their own."""
        self.log.debug("sending on %d frames held for %s (away %.3f s)", len(step.frames), step.client, step.away)

        async def send_all() -> None:
            for item in step.frames:
                await self.deliver(step.client, item)

        spawn(self._background, send_all(), f"transit {step.client}")

    def _returned(self, step: CameBack) -> None:
        self.metrics.transit_seconds.observe(step.away)
        held = f", {step.held_here} frames held here" if step.held_here else ""
        step.peer.log.info("back after %.3f s in transit%s", step.away, held)

    def _wake(self) -> None:
        self._wakeup.set()

    # -- holding frames ------------------------------------------------------

    def may_return(self, peer: Peer) -> bool:
        """Whether this ended connection's client is expected back (:meth:`Life.expected_back`)."""
        return self.steps.may_return(peer)

    def hold(self, target: str, item: Undelivered, *, begins: bool = False) -> bool:
        """Keep a frame for a client in transit (the router's :class:`~switchboard.hub.routing.actions.Hold`);
        ``False``: its holding is full (the router's ``otherwise`` follows).

        ``begins``: the router found that the client's connection here has just
        ended in a way it comes back from; its transit begins now, before
        :meth:`depart` has told the registry.
        """
        held, steps = self.steps.hold(target, item, begins=begins)
        self._carry_now(steps)
        return held

    def expect(self, peer: Peer) -> None:
        """Hold frames for the client of this ended connection from now on, if it may return: the
        hub's clean-up waits on the store before :meth:`depart`, and frames still come meanwhile."""
        self._carry_now(self.steps.expect(peer))

    def taken_up(self, peer: Peer) -> None:
        """``peer`` attached while the client's previous connection here was still being cleaned up
        (:meth:`expect` had begun holding its frames): what was held goes to ``peer`` now, if its
        own attach has not taken it already (a resume does)."""
        self._carry_now(self.steps.taken_up(peer))

    def salvage(self, peer: Peer) -> None:
        """What an ended connection's client may still need (:meth:`Peer.leftovers`) waits for it,
        ahead of what was held for it since; what its holding has no room for fails now."""
        self._carry_now(self.steps.salvage(peer))

    # -- a client leaves and comes back --------------------------------------

    async def depart(self, peer: Peer) -> bool:
        """Put the client of a connection that ended in transit.

        ``False`` if it has left instead: it said goodbye or the hub dropped
        it, there is no grace, the registry cannot be reached, or another
        replica owns it already (it is back). Then the caller cleans up as for
        any departure.
        """
        departure = self.steps.departure(peer)
        if isinstance(departure, bool):
            return departure
        await self._carry(departure.steps)
        try:
            marked = await self.registry.begin_transit(
                peer.workspace, peer.client_id, owner=self.replica_id, grace=departure.grace
            )
        except BackendError as exc:
            peer.log.warning("cannot put the client in transit: %s", exc)
            marked = False
        in_transit, steps = self.steps.marked(peer, marked=marked, grace=departure.grace)
        await self._carry(steps)
        if in_transit:
            peer.log.info("in transit (back within %gs, or announced gone)", departure.grace)
        return in_transit

    async def arrived(self, peer: Peer) -> None:
        """A client reconnected here: its transit ends on every replica, and what waited for it comes."""
        self.steps.arriving(peer)  # also for a resume that finds no transit (a ``taken`` notice reads it)
        try:
            away = await self.registry.end_transit(peer.workspace, peer.client_id, owner=self.replica_id)
        except BackendError as exc:
            peer.log.warning("could not end the client's transit in the registry: %s", exc)
            away = None
        await self._carry(self.steps.arrived(peer, away=away))

    async def abandon(self, client: str) -> None:
        """A new session of ``client`` replaces the one in transit (it came without the reconnection
        token): what was held for the earlier session fails, here and on every replica."""
        await self._carry(self.steps.abandoned(client))

    async def taken(self, client: str) -> None:
        """``client`` was taken over here from another replica: a copy still live there is closed."""
        await self._carry(self.steps.taken(client))

    # -- the grace's end -----------------------------------------------------

    async def settle_transits(self) -> None:
        """End every transit whose grace is over, and ask about the clients we hold frames for
        (:meth:`TransitSteps.to_settle`); the registry decides, :meth:`TransitSteps.settled` says what follows."""
        await together(self.steps.to_settle(), self._settle)  # a crowd's scripts share pipelines

    async def _settle(self, client: str) -> None:
        ws, _, cid = client.partition("/")
        try:
            expiry = await self.registry.expire_transit(ws, cid)
        except BackendError as exc:
            self.log.warning("transit of %s not settled: %s", client, exc)
            return
        await self._carry(self.steps.settled(client, expiry))

    async def sweep_transits(self) -> int:
        """End transits whose grace is over that no replica here knew of (their notice was lost
        and the replica they left is gone); the cluster's leader calls this every few seconds."""
        swept = self.steps.swept(await self.registry.transits_due())
        if swept:
            await self.settle_transits()
        return swept

    async def _keep_time(self) -> None:
        """Sleep until the next grace ends (or a recheck while holding frames), then settle."""
        while not self._stopping:
            deadline = self.steps.next_wake()
            self._wakeup.clear()
            if deadline is None:
                await self._wakeup.wait()
                continue
            delay = deadline - self.clock.monotonic()
            if delay > 0:
                sleeper = asyncio.ensure_future(self.clock.sleep(delay))
                waker = asyncio.ensure_future(self._wakeup.wait())
                try:
                    done, _ = await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    sleeper.cancel()
                    waker.cancel()
                if waker in done and sleeper not in done:
                    continue  # a new, maybe earlier, deadline
            try:
                await self.settle_transits()
            except Exception:  # a bug must not stop every grace from ending
                self.log.exception("settling transits failed")

    # -- notices between replicas --------------------------------------------

    def on_notice(self, data: bytes) -> None:
        """Another replica's notice (or our own, ignored): what follows is :meth:`TransitSteps.on_notice`'s."""
        self._carry_now(self.steps.on_notice(data))

"""Clients in transit, the hub's side: the registry's mark, notices between replicas, the grace's end.

A collaborator of :class:`~switchboard.hub.hub.Hub`, doing the I/O of moves;
the decisions are :class:`~switchboard.hub.sessions.in_transit.Transit`'s, the connection's
:class:`~switchboard.hub.sessions.life.Life`'s and, for a frame, the router's
(:class:`~switchboard.hub.routing.actions.Hold`: whether it is held, and whether that
begins its client's transit).

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
frames asks the registry every :data:`RECHECK` seconds whether the client is
still away, so a lost ``back`` or a ``left`` that overtook it costs a delay,
never a frame.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from switchboard.backends.base import Registry
from switchboard.clock import Clock
from switchboard.errors import BackendError
from switchboard.hub.routing.undelivered import Undelivered, undelivered_of
from switchboard.hub.sessions.in_transit import Transit, TransitEnd
from switchboard.hub.sessions.peer import Peer
from switchboard.hub.transit.retry import RetryWindow
from switchboard.hub.transit.together import together
from switchboard.metrics import HubMetrics
from switchboard.replicas.dataplane.inbound import TRANSIT_CHANNEL
from switchboard.replicas.dataplane.remote import Remote
from switchboard.tasks import cancel_and_wait, spawn

log = logging.getLogger(__name__)

# notices on TRANSIT_CHANNEL: {"left"|"back"|"gone"|"abandoned"|"taken": "<ws>/<cid>", "from": replica, ...}
# Seconds between asking the registry whether a client we hold frames for is still away.
RECHECK = 0.5

Reroute = Callable[[str, Undelivered], Awaitable[None]]
GiveUp = Callable[[str, Undelivered], None]
AnnounceGone = Callable[[str, str, list[Any]], Awaitable[int]]


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
        announce_gone: AnnounceGone,
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

    # -- holding frames ------------------------------------------------------

    def may_return(self, peer: Peer) -> bool:
        """Whether this ended connection's client is expected back (:meth:`Life.expected_back`)."""
        return peer.life.expected_back(self.clock.monotonic(), grace=self.transit.grace)

    def hold(self, target: str, item: Undelivered, *, begins: bool = False) -> bool:
        """Keep a frame for a client in transit (the router's :class:`~switchboard.hub.routing.actions.Hold`);
        ``False``: its holding is full (the router's ``otherwise`` follows).

        ``begins``: the router found that the client's connection here has just
        ended in a way it comes back from; its transit begins now, before
        :meth:`depart` has told the registry.
        """
        if begins:
            self._begin(target)
        if not self.transit.hold(target, item, size=len(item.frame)):
            return False
        if self.transit.holding == 1:
            self._wake()  # the keeper now rechecks every RECHECK seconds
        return True

    def expect(self, peer: Peer) -> None:
        """Hold frames for the client of this ended connection from now on, if it may return: the
        hub's clean-up waits on the store before :meth:`depart`, and frames still come meanwhile."""
        if self.may_return(peer):
            self._begin(peer.id)

    def taken_up(self, peer: Peer) -> None:
        """``peer`` attached while the client's previous connection here was still being cleaned up
        (:meth:`expect` had begun holding its frames): what was held goes to ``peer`` now, if its
        own attach has not taken it already (a resume does)."""
        self._send_on(self.transit.back(peer.id))

    def _begin(self, client: str, remaining: float | None = None) -> None:
        if self.transit.left(client, remaining):
            self._wake()

    def _wake(self) -> None:
        self._wakeup.set()

    def _send_on(self, released: TransitEnd[Undelivered] | None, *, fail: bool = False) -> None:
        """Route a finished transit's frames again, in order: to the client if it is back, else they fail.
        With ``fail``, they fail at once: the client left, or a new session took its id.

        What the hub kept for the client's next connection here goes unless that came (``forget``).
        """
        if released is not None:
            self.forget(released.client)
        if released is None or not released.frames:
            return
        if fail:
            for item in released.frames:
                self.give_up(released.client, item)
            return
        self.log.debug(
            "sending on %d frames held for %s (away %.3f s)", len(released.frames), released.client, released.away
        )

        async def send_all() -> None:
            for item in released.frames:
                await self.deliver(released.client, item)

        spawn(self._background, send_all(), f"transit {released.client}")

    # -- a client leaves and comes back --------------------------------------

    async def depart(self, peer: Peer) -> bool:
        """Put the client of a connection that ended in transit.

        ``False`` if it has left instead: it said goodbye or the hub dropped
        it, there is no grace, the registry cannot be reached, or another
        replica owns it already (it is back). Then the caller cleans up as for
        any departure.
        """
        if peer.life.moving:
            return True
        if not self.may_return(peer):
            return False
        grace = self.transit.grace
        self._begin(peer.id)
        try:
            marked = await self.registry.begin_transit(
                peer.workspace, peer.client_id, owner=self.replica_id, grace=grace
            )
        except BackendError as exc:
            peer.log.warning("cannot put the client in transit: %s", exc)
            marked = False
        if not marked:
            # back elsewhere already (or the registry cannot say): what this connection still had
            # goes on with what was held here, to wherever the client is live now
            self.salvage(peer)
            self._send_on(self.transit.cancel(peer.id))
            return False
        peer.life.left_in_transit()
        await self._notice("left", peer.id, grace=grace)
        peer.log.info("in transit (back within %gs, or announced gone)", grace)
        return True

    async def arrived(self, peer: Peer) -> None:
        """A client reconnected here: its transit ends on every replica, and what waited for it comes."""
        peer.life.arrived(self.clock.monotonic())  # also for a resume that finds no transit (:meth:`on_notice`)
        try:
            away = await self.registry.end_transit(peer.workspace, peer.client_id, owner=self.replica_id)
        except BackendError as exc:
            peer.log.warning("could not end the client's transit in the registry: %s", exc)
            away = None
        released = self.transit.back(peer.id)
        self._send_on(released)  # the peer is attached: its frames queue behind connection_info
        self.retry.wake(peer.id)
        if away is None and released is not None:
            away = released.away
        if away is None:
            return
        peer.life.back()
        self.metrics.transit_seconds.observe(away)
        peer.log.info(
            "back after %.3f s in transit%s",
            away,
            f", {len(released.frames)} frames held here" if released and released.frames else "",
        )
        await self._notice("back", peer.id)

    async def abandon(self, client: str) -> None:
        """A new session of ``client`` replaces the one in transit (it came without the reconnection
        token): what was held for the earlier session fails, here and on every replica."""
        self._send_on(self.transit.cancel(client), fail=True)
        self.retry.fail(client)
        await self._notice("abandoned", client)

    async def taken(self, client: str) -> None:
        """``client`` was taken over here from another replica: a copy still live there is closed."""
        await self._notice("taken", client)

    def salvage(self, peer: Peer) -> None:
        """What an ended connection's client may still need (:meth:`Peer.leftovers`) waits for it,
        ahead of what was held for it since, the newest kept first: those past the holding's bound
        fail now (their callers are told), not at their timeout."""
        full = False
        for frame in reversed(peer.leftovers(self.clock.monotonic())):
            item = undelivered_of(frame, walked=True)
            if item is None:
                continue
            if full or not self.transit.hold(peer.id, item, size=len(frame), first=True):
                full = True
                self.give_up(peer.id, item)

    # -- the grace's end -----------------------------------------------------

    async def settle_transits(self) -> None:
        """End every transit whose grace is over, and ask about the clients we hold frames for.

        The registry decides (its clock, one winner): ``expired`` here
        announces the departure; ``none`` (back, or expired by another
        replica) sends the frames on; ``waiting`` keeps holding.
        """
        due = set(self.transit.due())
        for client in self.transit.holders():
            if client in due or self.clock.monotonic() - self.transit.since(client) >= RECHECK:
                due.add(client)
        await together(sorted(due), self._settle)  # a crowd's scripts share pipelines

    async def _settle(self, client: str) -> None:
        ws, _, cid = client.partition("/")
        try:
            expiry = await self.registry.expire_transit(ws, cid)
        except BackendError as exc:
            self.log.warning("transit of %s not settled: %s", client, exc)
            return
        if expiry.state == "waiting":
            self.transit.extend(client, expiry.remaining)
            return
        if expiry.state == "none":
            self._send_on(self.transit.cancel(client))
            return
        released = self.transit.expire(client)
        self.metrics.transit_expiries.inc()
        self.log.info("%s did not come back within %gs: announced gone", client, self.transit.grace)
        await self.announce_gone(ws, cid, expiry.removed)
        await self._notice("gone", client)
        self.retry.fail(client)
        self._send_on(released, fail=True)  # not routed again: the id is free, a newcomer may hold it

    async def sweep_transits(self) -> int:
        """End transits whose grace is over that no replica here knew of (their notice was lost
        and the replica they left is gone); the cluster's leader calls this every few seconds."""
        swept = 0
        for client in await self.registry.transits_due():
            if client in self.transit:
                continue  # the keeper settles it
            self.transit.left(client, 0.0)
            swept += 1
        if swept:
            await self.settle_transits()
        return swept

    async def _keep_time(self) -> None:
        """Sleep until the next grace ends (or :data:`RECHECK` while holding frames), then settle."""
        while not self._stopping:
            deadline = self.transit.next_deadline()
            if self.transit.holders():
                recheck = self.clock.monotonic() + RECHECK
                deadline = recheck if deadline is None else min(deadline, recheck)
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

    async def _notice(self, kind: str, client: str, **extra: Any) -> None:
        body = json.dumps({kind: client, "from": self.replica_id, **extra}).encode()
        await self.remote.publish(TRANSIT_CHANNEL, body)

    def on_notice(self, data: bytes) -> None:
        try:
            notice = json.loads(data)
            origin = notice["from"]
        except (ValueError, KeyError, TypeError):
            self.log.warning("dropped a malformed transit notice: %r", data[:200])
            return
        if origin == self.replica_id:
            return
        if isinstance(client := notice.get("left"), str):
            grace = notice.get("grace")
            self._begin(client, float(grace) if isinstance(grace, int | float) else None)
        elif isinstance(client := notice.get("back"), str):
            self._send_on(self.transit.back(client))
            self.retry.wake(client)  # frames sent before we heard it left: its new replica has it now
        elif isinstance(client := notice.get("gone"), str) or isinstance(client := notice.get("abandoned"), str):
            self.retry.fail(client)
            self._send_on(self.transit.cancel(client), fail=True)
        elif isinstance(client := notice.get("taken"), str):
            peer = self.peers.get(client)
            if peer is None or peer.closed:
                return
            if peer.life.just_arrived(self.clock.monotonic()):
                # hypha-rpc reconnecting may open two connections at once (through a balancer, to
                # two replicas) and closes one itself within the second: the client chooses
                return
            peer.log.info("superseded by a new connection on replica %s", origin)  # one live copy
            peer.close(1000, "Superseded by a new connection of the same client")

"""The router's part in balanced handles (:mod:`switchboard.hub.routing.balance`): which instance a
call through a handle goes to, and sending a call whose instance died to another one. Decisions
only, as the rest of the :class:`~switchboard.hub.routing.router.Router`, which this completes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from switchboard.hub.routing import balance
from switchboard.hub.routing.actions import Action, Send
from switchboard.hub.routing.inflight import InFlight
from switchboard.hub.routing.undelivered import Undelivered
from switchboard.hub.sessions.in_transit import Transit
from switchboard.protocol.hypha import envelope
from switchboard.protocol.hypha.calls import CALL, classify

if TYPE_CHECKING:
    from switchboard.clock import Clock
    from switchboard.hub.sessions.peer import Peer


class BalancedRoutes:
    """Balanced handles' routing, a part of :class:`~switchboard.hub.routing.router.Router`."""

    balanced: balance.Balanced
    clock: Clock
    peers: Mapping[str, Peer]
    transit: Transit[Undelivered]
    inflight: InFlight

    def toward(self, target: str, item: Undelivered, *, new_call: bool = False) -> Action | None:
        raise NotImplementedError  # the router's

    def _instance_for(self, peer: Peer, env: envelope.Envelope) -> str | None:
        """The instance a call through one of ``peer``'s balanced handles goes to (``None``: none).
        Only a call is balanced: its callbacks and generators then address the instance itself."""
        target = str(env.main.get("to"))
        if "/" not in target:
            target = f"{peer.workspace}/{target}"
        if classify(env.main.get("method"), env.session, env.rest).kind is not CALL:
            return None
        avoid = self.transit_instances(peer.id, target)
        suspects = self.balanced.suspects(self.clock.monotonic())
        if suspects and (pick := self.balanced.pick(peer.id, target, self._load, avoid=[*avoid, *suspects])):
            return pick
        return self.balanced.pick(peer.id, target, self._load, avoid=avoid)

    def transit_instances(self, caller: str, target: str) -> list[str]:
        """Instances of the handle that are moving between connections: new calls go to the others."""
        pool = self.balanced.pool(caller, target)
        return [i for i in pool.instances if i in self.transit] if pool is not None and len(self.transit) else []

    def _load(self, instance: str) -> int:
        """Calls in flight to ``instance``: all of them if it is here, else those sent from here."""
        if instance in self.peers:
            return self.inflight.load(instance)
        return self.balanced.sent_to(instance)

    def _balanced_elsewhere(self, target: str, item: Undelivered) -> Action | None:
        """A balanced call that reached no replica goes to another instance now (``None``: not one,
        or none other is left): its instance's replica may be dead, and it did not run."""
        if not self.balanced or not item.session:
            return None
        step = self.balanced.undelivered(item.caller, item.session, target, self.clock.monotonic())
        if step is None:
            return None
        self.inflight.closed(item.caller, item.session)
        return self._resent(step)

    def _resent(self, step: balance.Resend) -> Action | None:
        """A balanced call whose instance died, sent to another one."""
        env = envelope.decode(step.frame)
        env.main["to"] = step.instance
        frame = envelope.encode(env.main, env.rest)
        self.inflight.opened(step.caller, step.session, step.instance, self.peers)
        return self.toward(step.instance, Undelivered(frame, step.session, step.caller), new_call=True)

    def balanced_steps(self, steps: list[balance.Resend | balance.Refuse]) -> list[Action]:
        """What becomes of balanced calls whose instance left: resent, or their caller told why."""
        actions: list[Action] = []
        for step in steps:
            if isinstance(step, balance.Resend):
                action = self._resent(step)
            else:
                self.inflight.closed(step.caller, step.session)
                reject = envelope.reject_frame(
                    session=step.session, target=step.target, caller=step.caller, message=step.message
                )
                caller = self.peers.get(step.caller)
                action = Send(caller, reject) if caller is not None else None
            if action is not None:
                actions.append(action)
        return actions

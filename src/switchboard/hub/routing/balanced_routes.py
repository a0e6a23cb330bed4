"""The router's part in balanced handles (:mod:`switchboard.hub.routing.balance`): which instance a
call through a handle goes to, and sending a call whose instance died to another one. Decisions
only, as the rest of the :class:`~switchboard.hub.routing.router.Router`, which this completes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from switchboard.hub.routing import balance
from switchboard.hub.routing.actions import Action, BindFirst, Forward, RetryLater, Send
from switchboard.hub.routing.binds import BindWait, parse_virtual
from switchboard.hub.routing.router_base import RouterBase
from switchboard.hub.routing.undelivered import Undelivered
from switchboard.protocol.hypha import envelope
from switchboard.protocol.hypha.calls import CALL, classify
from switchboard.protocol.link import replica_wire

if TYPE_CHECKING:
    from switchboard.hub.sessions.peer import Peer


class BalancedRoutes(RouterBase):
    """Balanced handles' routing, a part of :class:`~switchboard.hub.routing.router.Router`."""

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

    def _bind_first(self, peer: Peer, env: envelope.Envelope, target: str, data: bytes) -> tuple[bool, Action | None]:
        """A call through a handle with no pool here for ``peer`` (it looked the service up on another
        replica, or here long ago) waits for the bind, the first asking for it
        (:mod:`~switchboard.hub.routing.binds`): ``(True, what to do now)``. ``(False, None)``:
        not such a call (refused as any frame the handle cannot take)."""
        if (
            not env.session
            or self.balanced.pool(peer.id, target) is not None
            or parse_virtual(target) is None
            or classify(env.main.get("method"), env.session, env.rest).kind is not CALL
        ):
            return False, None
        waiting = self.binds.wait(peer.id, target, env.session, data)
        if waiting is BindWait.FIRST:
            return True, BindFirst(peer, target)
        if waiting is BindWait.FULL:
            why = f"Too many calls wait for the balanced handle {target} to be bound here: at most {self.binds.limit}"
            return True, Send(peer, self._refusal(peer, env.session, target, why + "; retry"))
        return True, None

    def bound(self, peer: Peer, target: str, error: str | None) -> list[Action]:
        """The lookup :class:`BindFirst` asked for ended: the frames that waited are routed again,
        or each answered at once with the lookup's ``error`` (what ``get_service`` would have said)."""
        frames = self.binds.done(peer.id, target)
        if error is None and self.balanced.pool(peer.id, target) is None:
            error = f"{target} is a balanced handle that could not be bound here: look the service up again"
        actions: list[Action] = []
        for session, data in frames:
            action = (
                Send(peer, self._refusal(peer, session, target, error)) if error is not None else self.route(peer, data)
            )
            if action is not None:
                actions.append(action)
        return actions

    def handle_of(self, caller: str, method: object, sender: object) -> str | None:
        """The handle a frame ``sender`` sends ``caller`` within a balanced call speaks for: a call made
        here (:meth:`Balanced.relabel`), or one an instance here took from elsewhere (:class:`ServedHandles`)."""
        return self.balanced.relabel(caller, method, sender) or self.served.relabel(caller, method, sender)

    def with_handle(self, action: Action | None, handle: str) -> Action | None:
        """A balanced call on its way to its instance's replica carries its handle there
        (:mod:`~switchboard.hub.routing.served`): the instance's answers then speak for the handle
        wherever the caller is by then."""
        if type(action) is Forward:
            action.wire = replica_wire.wrap_balanced(handle, action.wire)
        elif type(action) is RetryLater:
            action.item = action.item._replace(frame=replica_wire.wrap_balanced(handle, action.item.frame))
        return action

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
        action = self.toward(step.instance, Undelivered(frame, step.session, step.caller), new_call=True)
        return self.with_handle(action, step.handle)

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

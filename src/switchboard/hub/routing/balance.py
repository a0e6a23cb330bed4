"""A service name, not an instance: the balanced handle's choice per call, and its failover, without I/O.

``get_service("calc", {"mode": "balance:round_robin"})`` (or ``balance:least_busy``)
returns a service whose functions address a *virtual* client,
``<workspace>/balance|<policy>|<name>``. No client has that address: the
router resolves it on every call of the caller that looked it up, to one
live instance of ``<name>`` among those the lookup let that caller use
(:class:`Pool`, refreshed by the manager as instances come and go), and
sends the call there stamped with the caller's identity, as a direct call.
The instance's replies, callbacks and generators go between the caller and
that instance directly, so one call stays with the instance that took it.

A call whose instance dies before it answers is sent to another instance if
the service's config declares the function idempotent (``config.idempotent``,
as the SDK's ``@idempotent`` writes it), and fails at once with a clear error
otherwise (:meth:`Balanced.gone`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

ROUND_ROBIN = "round_robin"
LEAST_BUSY = "least_busy"
POLICIES = (ROUND_ROBIN, LEAST_BUSY)
MODE_PREFIX = "balance:"
# The service config key listing the functions safe to run twice (the SDK's ``@idempotent`` writes it)
IDEMPOTENT_KEY = "idempotent"
# The client id of a virtual target: '|' is in the id grammar, and no hypha-rpc client id has this shape
_VIRTUAL = "balance|"
# Times one call is sent on after its instance died: each time to another instance, so a pool
# of a few is walked once; more would only resend a call every instance fails.
MAX_FAILOVERS = 3
# A call too large for one frame: hypha-rpc first asks the handle for the instance's built-in
# service, then sends it the pieces and ``process``; this many such asks are remembered at once.
MAX_PIECES_EXPECTED = 10_000
BUILT_IN_LOOKUP = "services.built-in.get_service"
# Seconds an instance a call could not reach is left out of new choices (unless every instance is):
# a replica SIGKILLed keeps its clients registered until its presence expires (6 s); its
# instances should not take new calls meanwhile. One merely moving is back within this.
SUSPECT_FOR = 2.0
# Balanced handles one connection may hold at once (one per name and policy looked up);
# a lookup beyond forgets the least recently bound.
MAX_POOLS_PER_CALLER = 64


def policy_of(mode: object) -> str | None:
    """``balance:<policy>`` → the policy; ``None`` for any other mode (an unknown policy is refused)."""
    if not isinstance(mode, str) or not mode.startswith(MODE_PREFIX):
        return None
    policy = mode[len(MODE_PREFIX) :]
    if policy not in POLICIES:
        raise ValueError(f"Unknown balance policy: {policy[:100]!r}: use 'balance:round_robin' or 'balance:least_busy'")
    return policy


def virtual_target(workspace: str, policy: str, name: str) -> str:
    """The address a balanced handle's functions call."""
    return f"{workspace}/{_VIRTUAL}{policy}|{name}"


def is_virtual(target: str) -> bool:
    return _VIRTUAL in target and target.partition("/")[2].startswith(_VIRTUAL)  # the first test, for every call


def idempotent_of(info: Mapping[str, object]) -> frozenset[str]:
    """The function paths a registered service declares idempotent: its ``config.idempotent`` list."""
    config = info.get("config")
    names = config.get(IDEMPOTENT_KEY) if isinstance(config, Mapping) else None
    if not isinstance(names, list | tuple):
        return frozenset()
    return frozenset(n for n in names if isinstance(n, str))


def function_of(method: object) -> str:
    """``services.calc.meta.describe`` → ``meta.describe``: the path ``config.idempotent`` names."""
    if not isinstance(method, str):
        return ""
    parts = method.split(".", 2)
    return parts[2] if len(parts) == 3 and parts[0] == "services" else ""


def choose(
    policy: str,
    instances: Sequence[str],
    *,
    cursor: int,
    loads: Mapping[str, int],
    avoid: Collection[str] = (),
) -> tuple[str | None, int]:
    """The instance (``ws/cid``) that takes the next call, and the pool's next cursor.

    ``instances`` in the pool's order; ``avoid``: instances not to use (the
    ones a call already failed on, ones in transit); if every instance is
    avoided, ``None``. ``round_robin`` takes them in turn; ``least_busy``
    the one with the fewest calls in flight (``loads``), ties in turn.
    """
    usable = [i for i in instances if i not in avoid]
    if not usable:
        return None, cursor
    if policy == LEAST_BUSY:
        least = min(loads.get(i, 0) for i in usable)
        usable = [i for i in usable if loads.get(i, 0) == least]
    pick = usable[cursor % len(usable)]
    return pick, cursor + 1


@dataclass(slots=True)
class Pool:
    """The instances one caller's balanced handle may reach, with the functions each declares idempotent."""

    policy: str
    name: str
    instances: dict[str, frozenset[str]]  # ws/cid -> idempotent function paths
    cursor: int = 0


@dataclass(slots=True)
class Call:
    """A balanced call waiting for its answer: where it went, and what to resend if it must."""

    target: str  # the virtual target
    instance: str
    function: str
    frame: bytes
    tried: set[str] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class Resend:
    """Send the call's ``frame`` to ``instance`` instead (its first instance died)."""

    caller: str
    session: str
    instance: str
    frame: bytes
    handle: str = field(default="", compare=False)  # the handle the call was made through


@dataclass(frozen=True, slots=True)
class Refuse:
    """Fail the caller's call with ``message`` (not idempotent, or no instance left)."""

    caller: str
    session: str
    target: str  # the handle's address: the caller's hypha-rpc takes the refusal only from it
    message: str


class Balanced:
    """Every balanced handle of this replica's callers, and their calls in flight (see the module docstring).

    Entries go with their caller (:meth:`forget_caller`); a call's entry with
    its answer (:meth:`closed`), so nothing accumulates.
    """

    def __init__(self) -> None:
        self._pools: dict[str, dict[str, Pool]] = {}  # caller -> virtual target -> pool
        self._calls: dict[tuple[str, str], Call] = {}  # (caller, session) -> call
        self._by_instance: dict[str, set[tuple[str, str]]] = {}
        self._suspects: dict[str, float] = {}  # instance -> until when no new call goes to it
        self._pieces: dict[tuple[str, str], str] = {}  # (caller, instance) -> handle: a call in pieces comes
        self.balanced_calls = 0  # ever sent, and resent after their instance died (for /metrics)
        self.failovers = 0
        self.per_instance: dict[str, int] = {}  # balanced calls sent to each instance still known

    # -- handles ---------------------------------------------------------------

    def bind(self, caller: str, target: str, pool: Pool) -> None:
        pools = self._pools.setdefault(caller, {})
        old = pools.pop(target, None)
        if old is not None:
            pool.cursor = old.cursor
        elif len(pools) >= MAX_POOLS_PER_CALLER:
            pools.pop(next(iter(pools)))
        pools[target] = pool

    def pool(self, caller: str, target: str) -> Pool | None:
        return self._pools.get(caller, {}).get(target)

    def pools_of(self, caller: str) -> bool:
        """Does ``caller`` hold a balanced handle?"""
        return caller in self._pools

    def pools(self) -> list[tuple[str, str, Pool]]:
        """Every (caller, target, pool): what the manager refreshes."""
        return [(c, t, p) for c, pools in self._pools.items() for t, p in pools.items()]

    def refreshed(self, caller: str, target: str, instances: dict[str, frozenset[str]]) -> list[Resend | Refuse]:
        """The instances the caller may reach now; the calls to one that left are resent or refused."""
        pool = self.pool(caller, target)
        if pool is None:
            return []
        before = pool.instances
        pool.instances = instances
        out: list[Resend | Refuse] = []
        for instance in [i for i in before if i not in instances]:
            out.extend(self.gone(instance, only_caller=caller, declared=before[instance]))
        return out

    # -- calls -------------------------------------------------------------------

    def pick(self, caller: str, target: str, loads: Callable[[str], int], avoid: Collection[str] = ()) -> str | None:
        """The instance the caller's next call through ``target`` goes to; ``None``: no handle, or none left."""
        pool = self.pool(caller, target)
        if pool is None:
            return None
        counts = {i: loads(i) for i in pool.instances} if pool.policy == LEAST_BUSY else {}
        pick, pool.cursor = choose(pool.policy, list(pool.instances), cursor=pool.cursor, loads=counts, avoid=avoid)
        return pick

    def opened(self, caller: str, session: str, target: str, instance: str, function: str, frame: bytes) -> None:
        key = (caller, session)
        self._drop(key)
        self._calls[key] = Call(target, instance, function, frame, {instance})
        self._by_instance.setdefault(instance, set()).add(key)
        self.balanced_calls += 1
        self.per_instance[instance] = self.per_instance.get(instance, 0) + 1

    def expect_pieces(self, caller: str, instance: str, target: str) -> None:
        """The handle gave ``caller`` ``instance``'s built-in service: a call in pieces may follow."""
        if len(self._pieces) >= MAX_PIECES_EXPECTED:
            self._pieces.pop(next(iter(self._pieces)))
        self._pieces[(caller, instance)] = target

    def expects_pieces(self, caller: str, instance: str) -> bool:
        return (caller, instance) in self._pieces

    def piece_header(self, caller: str, instance: str, header: Mapping[str, object]) -> None:
        """The header of the message ``caller`` sends ``instance`` in pieces (read from its first
        piece): a call through the handle whose built-in service the caller asked for is
        balanced like any other (its answer then speaks for the handle). It cannot be re-sent:
        its pieces are the instance's."""
        target = self._pieces.get((caller, instance))
        session, to = header.get("session"), header.get("to")
        if target is None or not isinstance(session, str) or not isinstance(to, str):
            return
        del self._pieces[(caller, instance)]
        if to == target or to.endswith("/" + target.partition("/")[2]):
            self.opened(caller, session, target, instance, function_of(header.get("method")), b"")

    def closed(self, caller: str, session: str) -> None:
        self._drop((caller, session))

    def relabel(self, caller: str, method: object, sender: object) -> str | None:
        """The handle's address for a frame ``sender`` sends ``caller`` within a balanced call's session
        (its answer, heartbeat, a callback): hypha-rpc takes them only from the target it called.
        ``None``: not such a frame."""
        if not isinstance(method, str):
            return None
        call = self._calls.get((caller, method.rpartition(".")[0]))
        # from the handle itself: the instance's replica labelled it (only replicas write that sender)
        return call.target if call is not None and sender in (call.instance, call.target) else None

    def sent_to(self, instance: str) -> int:
        """Balanced calls from here that wait for ``instance``."""
        return len(self._by_instance.get(instance, ()))

    def has(self, caller: str, session: str) -> bool:
        return (caller, session) in self._calls

    def gone(
        self,
        instance: str,
        *,
        loads: Callable[[str], int] = lambda _: 0,
        only_caller: str | None = None,
        declared: frozenset[str] | None = None,
    ) -> list[Resend | Refuse]:
        """``instance`` died with calls in flight: each is resent elsewhere or refused (``declared``:
        the functions it declared idempotent, if its handles no longer list it)."""
        out: list[Resend | Refuse] = []
        if only_caller is None:
            self.per_instance.pop(instance, None)
        for key in list(self._by_instance.get(instance, ())):
            if only_caller is None or key[0] == only_caller:
                out.append(self._failover(key, instance, loads, declared))
        return out

    def failed(self, caller: str, session: str, instance: str) -> Resend | Refuse | None:
        """A balanced call could not be delivered to ``instance`` (nobody has it): it did not run,
        so it goes to another instance, idempotent or not; refused if none is left."""
        key = (caller, session)
        call = self._calls.get(key)
        if call is None or call.instance != instance:
            return None
        return self._failover(key, instance, lambda _: 0, undelivered=True)

    def undelivered(self, caller: str, session: str, instance: str, now: float) -> Resend | None:
        """A balanced call never reached ``instance`` (no replica took it): it goes to another
        instance at once, idempotent or not, since it did not run; ``instance`` is left out of new
        choices for :data:`SUSPECT_FOR` seconds. ``None``: not such a call, or no other instance."""
        key = (caller, session)
        call = self._calls.get(key)
        if call is None or call.instance != instance or not call.frame:
            return None
        self._suspects[instance] = now + SUSPECT_FOR
        if len(self._suspects) > MAX_PIECES_EXPECTED:
            self._suspects = {i: t for i, t in self._suspects.items() if t > now}
        nxt = self.pick(caller, call.target, lambda _: 0, avoid=call.tried | self.suspects(now))
        if nxt is None:
            return None
        self._unindex(key, call.instance)
        call.instance = nxt
        call.tried.add(nxt)
        self._by_instance.setdefault(nxt, set()).add(key)
        self.per_instance[nxt] = self.per_instance.get(nxt, 0) + 1
        self.failovers += 1
        return Resend(caller, session, nxt, call.frame, call.target)

    def stranded(self, now: float) -> list[Resend | Refuse]:
        """The calls in flight to instances a later call could not reach: their replica is gone
        with them, so they are resent (idempotent) or refused now, not when the registry forgets
        the instance (a SIGKILLed replica's clients stay registered until its presence expires)."""
        out: list[Resend | Refuse] = []
        for instance in self.suspects(now):
            if instance in self._by_instance:
                out.extend(self.gone(instance))
        return out

    def suspects(self, now: float) -> set[str]:
        """Instances a call lately could not reach."""
        if not self._suspects:
            return set()
        return {i for i, until in self._suspects.items() if until > now}

    def _failover(
        self,
        key: tuple[str, str],
        instance: str,
        loads: Callable[[str], int],
        declared: frozenset[str] | None = None,
        *,
        undelivered: bool = False,
    ) -> Resend | Refuse:
        call = self._calls[key]
        caller, session = key
        pool = self.pool(caller, call.target)
        if declared is None:
            declared = pool.instances.get(instance, frozenset()) if pool is not None else frozenset()
        # never delivered: safe to send elsewhere; no frame: it was sent in pieces, to that instance
        idempotent = (undelivered or call.function in declared) and bool(call.frame)
        name = pool.name if pool is not None else call.target.rpartition("|")[2]
        if not idempotent:
            self._drop(key)
            return Refuse(
                caller,
                session,
                call.target,
                f"Instance {instance} of service {name} left during the call to {call.function}; "
                f"not re-sent: the service does not declare {call.function} idempotent",
            )
        nxt = self.pick(caller, call.target, loads, avoid=call.tried) if len(call.tried) <= MAX_FAILOVERS else None
        if nxt is None:
            self._drop(key)
            return Refuse(
                caller,
                session,
                call.target,
                f"Instance {instance} of service {name} left during the call to {call.function}, "
                "and no other instance is left to take it",
            )
        self._unindex(key, call.instance)
        call.instance = nxt
        call.tried.add(nxt)
        self._by_instance.setdefault(nxt, set()).add(key)
        self.per_instance[nxt] = self.per_instance.get(nxt, 0) + 1
        self.failovers += 1
        return Resend(caller, session, nxt, call.frame, call.target)

    def forget_caller(self, caller: str) -> None:
        """``caller`` left: its handles, and its calls in flight (none has a handle-less call)."""
        if self._pools.pop(caller, None) is None:
            return
        for pair in [p for p in self._pieces if p[0] == caller]:
            del self._pieces[pair]
        for key in [k for k in self._calls if k[0] == caller]:
            self._drop(key)

    def _drop(self, key: tuple[str, str]) -> None:
        call = self._calls.pop(key, None)
        if call is not None:
            self._unindex(key, call.instance)

    def _unindex(self, key: tuple[str, str], instance: str) -> None:
        keys = self._by_instance.get(instance)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_instance[instance]

    def __len__(self) -> int:
        return len(self._calls)

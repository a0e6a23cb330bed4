"""Balanced handles: the lookup that makes one, and the refresh that keeps its instances current.

``get_service(name, {"mode": "balance:<policy>"})`` finds every instance the
caller may use, exactly as a direct lookup would (visibility, permissions,
``authorized_workspaces``), binds them to the caller's connection in the
router (:class:`~switchboard.hub.routing.balance.Balanced`), and returns the
service of one of them with its functions addressed to the handle's virtual
target. While handles exist, each is looked up again for its caller every
:data:`REFRESH` seconds: a new instance is used from then on, and calls in
flight to one that left are resent (idempotent) or failed.

A caller that comes back on another replica calls a handle that replica has
not bound: its first call there binds it, by the same lookup as the caller
itself (:meth:`BalancedLookups.bind_later`, :mod:`switchboard.hub.routing.binds`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from switchboard.clock import Clock
from switchboard.errors import BackendError, NotFound, PermissionDenied, ProtocolError
from switchboard.hub.routing import balance
from switchboard.hub.routing.binds import parse_virtual
from switchboard.protocol.hypha import ids
from switchboard.protocol.hypha.services import ServiceInfo
from switchboard.tasks import cancel_and_wait, spawn

if TYPE_CHECKING:
    from switchboard.hub.sessions.peer import Peer

log = logging.getLogger(__name__)

# Seconds between two refreshes of the handles' instances: a new instance gets calls within
# about this long (the issue asks for 1 s), for one registry read per handle.
REFRESH = 0.25

# The instances a caller may use for a query: (service id, info) of each, or NotFound/PermissionDenied.
Instances = Callable[[str, str, Any], Awaitable[list[ServiceInfo]]]


class BalancedLookups:
    """Makes balanced handles and refreshes them (see the module docstring)."""

    def __init__(
        self, balanced: balance.Balanced, *, clock: Clock, instances: Instances, present: Callable[[str], bool]
    ) -> None:
        self.balanced = balanced
        self.clock = clock
        self._instances = instances
        self._present = present  # is the caller connected here, or in transit (its calls' answers held)?
        # (caller, target) -> (query, caller's workspace, caller's user)
        self._users: dict[tuple[str, str], tuple[str, str, Any]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._binding: set[asyncio.Task[Any]] = set()  # handles being bound on a caller's first call here
        self.on_steps: Callable[[list[balance.Resend | balance.Refuse]], None] = lambda steps: None
        # a handle bound (error None) or not for a caller's first call here: what waited for it goes on
        self.on_bound: Callable[[Peer, str, str | None], None] = lambda peer, target, error: None

    async def bind(self, caller: str, workspace: str, service_id: str, policy: str, user: Any) -> tuple[str, str]:
        """Bind a handle for ``caller``; return its virtual target and the id of one instance."""
        found = await self._instances(service_id, workspace, user)
        ws = found[0]["id"].partition("/")[0]
        name = found[0]["id"].partition(":")[2].partition("@")[0]
        target = balance.virtual_target(ws, policy, name)
        if not ids.is_id(target.partition("/")[2]):
            raise ProtocolError(f"service name {name[:100]!r} cannot be balanced: names are {ids.GRAMMAR}")
        pool = balance.Pool(policy, name, _instances_of(found))
        self.balanced.bind(caller, target, pool)
        self._users[(caller, target)] = (service_id, workspace, user)
        if not self._tasks:
            spawn(self._tasks, self._refresh_while_bound(), "balanced handles refresh")
        return target, found[0]["id"]

    def bind_later(self, peer: Peer, target: str) -> None:
        """Bind the handle ``target`` (``<ws>/balance|<policy>|<name>``) for ``peer``, which calls it
        here without having looked it up here: the lookup is its own, as it is now (its
        workspace and user), exactly as ``get_service(<ws>/<name>, {"mode": "balance:<policy>"})``."""
        spawn(self._binding, self._bind_virtual(peer, target), f"bind {target[:200]} for {peer.id}")

    async def _bind_virtual(self, peer: Peer, target: str) -> None:
        error: str | None = None
        try:
            parsed = parse_virtual(target)
            if parsed is None:  # the router binds only what parses
                raise ProtocolError(f"{target[:200]} is not a balanced handle")
            ws, policy, name = parsed
            made, _ = await self.bind(peer.id, peer.workspace, f"{ws}/{name}", policy, peer.user)
            if made != target:  # cannot be: the lookup of <ws>/<name> names that handle
                raise NotFound(f"{target[:200]} names no service the caller may use")
        except (NotFound, PermissionDenied, ProtocolError, BackendError) as exc:
            error = str(exc)
        except Exception as exc:  # the caller's calls must not wait for their timeout
            log.exception("binding balanced handle %s for %s failed", target[:200], peer.id)
            error = f"Balanced handle not bound: {exc}"
        self.on_bound(peer, target, error)

    def forget(self, caller: str) -> None:
        """``caller``'s handles and calls in flight go (it left)."""
        self.balanced.forget_caller(caller)
        for key in [k for k in self._users if k[0] == caller]:
            del self._users[key]

    async def refresh(self) -> None:
        """Look every handle's instances up again for its caller."""
        for (caller, target), known in list(self._users.items()):
            if not self._present(caller):  # gone for good (or moved to another replica): its handles go
                self.forget(caller)
                continue
            if self.balanced.pool(caller, target) is None:  # forgotten meanwhile
                self._users.pop((caller, target), None)
                continue
            try:
                found = await self._instances(*known)
            except (NotFound, PermissionDenied):
                found = []
            except BackendError as exc:  # the registry is away: the handle keeps what it had
                log.info("balanced handle %s not refreshed: %s", target, exc)
                continue
            steps = self.balanced.refreshed(caller, target, _instances_of(found))
            if steps:
                self.on_steps(steps)

    async def _refresh_while_bound(self) -> None:
        while self._users:
            await self.clock.sleep(REFRESH)
            try:
                if steps := self.balanced.stranded(self.clock.monotonic()):
                    self.on_steps(steps)
                await self.refresh()
            except Exception:  # one bad round must not end the refreshes
                log.exception("balanced handles refresh failed")

    async def close(self) -> None:
        await cancel_and_wait([*self._tasks, *self._binding])


def _instances_of(found: list[ServiceInfo]) -> dict[str, frozenset[str]]:
    return {info["id"].partition(":")[0]: balance.idempotent_of(info) for info in found}


def handle(service: dict[str, Any], *, target: str, name: str) -> dict[str, Any]:
    """``service`` (one instance's, as fetched) with every function addressed to ``target``."""

    def walk(value: Any, path: str) -> Any:
        if callable(value):
            method: dict[str, Any] = {
                "_rtype": "method",
                "_rtarget": target,
                "_rmethod": f"services.{name}.{path}",
                "_rpromise": "*",
                "_rname": path.rpartition(".")[2],
                "_rdoc": getattr(value, "__doc__", None),
            }
            schema = getattr(value, "__schema__", None)
            if schema is not None:
                method["_rschema"] = schema
            return method
        if isinstance(value, dict) and "_rtype" not in value:
            return {k: walk(v, f"{path}.{k}" if path else str(k)) for k, v in dict.items(value)}
        return value

    out: dict[str, Any] = {}
    for key, value in dict.items(service):
        out[key] = value if key == "config" else walk(value, str(key))
    out["id"] = f"{target}:{name}"
    return out

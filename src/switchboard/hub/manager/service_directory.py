"""The manager's service methods: announcing, withdrawing, finding and fetching services.

Every method acts for the connection that made the call
(:func:`~switchboard.hub.manager.manager_door.calling_peer`), never for whoever the
message says it is from. What a client announces is bounded in count and
size (it lives in the shared registry until the client leaves), and what a
caller may find follows the visibility rules of
:mod:`switchboard.protocol.hypha.services`. The HTTP gateway resolves and fetches
services through the same methods (:mod:`switchboard.server.http.http_services`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, Protocol

from hypha_rpc import RPC

from switchboard.backends.base import Registry
from switchboard.clock import Clock
from switchboard.config import Settings
from switchboard.errors import BackendError, LimitExceeded, NotFound, PermissionDenied, ProtocolError
from switchboard.hub.identity.users import Permission, User
from switchboard.hub.manager.acting import Acting
from switchboard.hub.manager.announced import Announced
from switchboard.hub.manager.balanced_lookup import BalancedLookups
from switchboard.hub.manager.balanced_lookup import handle as balanced_handle
from switchboard.hub.manager.builtin_services import BuiltIns
from switchboard.hub.manager.manager_door import calling_peer, require
from switchboard.hub.manager.shared_values import SharedValues
from switchboard.hub.routing import balance
from switchboard.hub.routing.limits import Allowance, TokenBucket
from switchboard.hub.sessions.peer import Peer
from switchboard.protocol.hypha import selection
from switchboard.protocol.hypha import services as svc_ids
from switchboard.protocol.hypha.services import ServiceInfo, ServiceQuery, list_query
from switchboard.protocol.hypha.values import plain

log = logging.getLogger(__name__)


# Admits ``calls`` more calls of the asker for a ``with`` block (raises RateLimited): see resolve.
Charge = Callable[[int], contextlib.AbstractContextManager[None]]


class ProviderLoads(Protocol):
    """Calls in flight to providers (:class:`switchboard.hub.routing.loads.Loads`)."""

    async def of(self, providers: Collection[str]) -> Mapping[str, int]: ...


# Right after Redis lost its data (restarted empty), the registry is re-filled by every replica
# within seconds; meanwhile a lookup waits this long at most for it, then answers "please retry"
# (an empty answer would tell the caller that services which are there are gone).
SETTLE_WAIT = 2.0
SETTLE_POLL = 0.1
# Distinct service schemas kept to be shared (hub/manager/shared_values.py): a few hypha-rpc versions'
# built-in schemas and the services many clients register alike fit; at most ~1 MiB of keys.
SHARED_SCHEMAS = 256
REFILLING = "Hub backend unavailable, please retry: the registry is being re-filled after Redis lost its data"


class DirectoryHost(Protocol):
    """What the service methods need of the hub (the hub is :class:`switchboard.hub.hub.Hub`)."""

    settings: Settings
    registry: Registry
    clock: Clock
    registry_dirty: bool  # set when a registration could not be written: the cluster loop re-asserts
    manager_address: str
    announced: Announced  # what each connection announced: written here only

    @property
    def rates(self) -> Mapping[Peer, TokenBucket]:
        """Each connection's frame rate (the gatekeeper's): its select: calls take from it."""
        ...

    @property
    def loads(self) -> ProviderLoads: ...

    def peer_for(self, address: str) -> Peer | None: ...

    def acting_as(self, user: dict[str, Any], workspace: str) -> contextlib.AbstractAsyncContextManager[Acting]: ...

    async def emit_event(self, workspace: str, event_type: str, data: object) -> None: ...


class ServiceDirectory:
    """The ``default`` service's methods about services (see the module docstring).

    ``rpc`` gives the manager's RPC once it runs: a service object is fetched
    from its provider through it. What each connection announced is kept in
    the host's :class:`~switchboard.hub.manager.announced.Announced`, and the
    bounds on each caller's ``select:`` calls here, both until the connection
    is detached (:meth:`forget`).
    """

    def __init__(self, hub: DirectoryHost, *, rpc: Callable[[], RPC | None], builtins: BuiltIns | None = None) -> None:
        self.hub = hub
        self._rpc = rpc
        self.builtins = builtins  # the hub's built-in services, found before the registry
        self._rng = random.Random()
        self._schemas = SharedValues(SHARED_SCHEMAS)
        self.balancing: BalancedLookups | None = None  # set by the manager: balanced handles
        self._allowances: dict[Peer, Allowance] = {}  # each caller's select: calls (made at its first)

    async def register_service(self, service: Any, config: Any = None, context: dict[str, Any] | None = None) -> None:
        """Announce a service of the calling client to its workspace."""
        peer = calling_peer()
        # A schema seen before (every hypha-rpc client's built-in one) is neither copied nor encoded again
        schema = self._schemas.known(service.get("service_schema")) if type(service) is dict else None
        if schema is not None:
            raw = svc_ids.plain_copy({k: v for k, v in service.items() if k != "service_schema"})
            raw["service_schema"] = schema
        else:
            raw = svc_ids.plain_copy(service)
        if not isinstance(raw, dict):
            raise ProtocolError("register_service expects a service info object")
        short = str(raw.get("id", "")).rpartition(":")[2]
        # A read-only client may still announce its own built-in service: that
        # is its presence (listings, duplicate-id check), not a capability.
        need = Permission.READ if short == "built-in" else Permission.READ_WRITE
        require(peer, peer.workspace, need)
        if short.startswith("_rintf_") or (raw.get("config") or {}).get("_local_only"):
            return None
        info = svc_ids.prepare_registration(
            raw, workspace=peer.workspace, client_id=peer.client_id, user_wire=peer.user_wire, copy=False
        )
        if schema is None and "service_schema" in info:  # alike for every client of one hypha-rpc version: kept once
            info["service_schema"] = self._schemas.share(info["service_schema"])
        limit = self.hub.settings.max_services_per_client
        held = self.hub.announced.of(peer)
        if len(held) >= limit and info["id"] not in held:  # counted here: no Redis trip
            raise LimitExceeded(f"Too many services: a client may register at most {limit}")
        if short != "built-in":  # a client's presence is never a singleton, and every client has one
            await self._check_singleton(info)
        encoded, size = self._check_size(peer, info)
        if self._detached_later(peer):
            self.hub.announced.add(peer, info, size)
        try:
            previous = await self.hub.registry.register(info, encoded=encoded)
        except BackendError as exc:
            # The shared registry is away. The client keeps working with its
            # peers here, and the cluster loop writes the registration back.
            peer.log.warning("registration of %s deferred: %s", info["id"], exc)
            self.hub.registry_dirty = True
            return None
        if peer.closed or self.hub.peer_for(peer.id) is not peer:
            await self.hub.registry.unregister(info["id"])  # lost a race with disconnect
            return None
        ws = peer.workspace
        if peer.life.returned and previous == info:
            return None  # re-registered, unchanged, after a transit: nothing changed for the workspace
        if info["id"].endswith(":built-in"):
            event = "client_updated" if previous else "client_connected"
            await self.hub.emit_event(ws, event, {"id": peer.id, "workspace": ws})
        else:
            if previous is not None:
                await self.hub.emit_event(ws, "service_removed", previous)
            await self.hub.emit_event(ws, "service_added", info)
        return None

    async def unregister_service(self, service_id: Any, context: dict[str, Any] | None = None) -> None:
        """Withdraw one of the caller's services (a bare id is the caller's own)."""
        peer = calling_peer()
        require(peer, peer.workspace, Permission.READ_WRITE)
        if not isinstance(service_id, str) or not service_id:
            raise ProtocolError("service_id must be a non-empty string")
        sid = service_id.partition("@")[0]
        if "/" not in sid:
            sid = f"{peer.id}:{sid.rpartition(':')[2]}"
        ws, cid, _ = svc_ids.split_full_id(sid)
        if ws != peer.workspace or cid != peer.client_id:
            raise PermissionDenied(f"Permission denied: {service_id} is not a service of {peer.id}")
        removed = await self.hub.registry.unregister(sid)
        self.hub.announced.remove(peer, sid)
        if removed is None:
            raise NotFound(f"Service not found: {service_id}")
        if sid.endswith(":built-in"):
            await self.hub.emit_event(ws, "client_disconnected", {"id": cid, "workspace": ws})
        else:
            await self.hub.emit_event(ws, "service_removed", removed)

    async def get_service_info(
        self, service_id: Any, config: Any = None, context: dict[str, Any] | None = None
    ) -> ServiceInfo:
        """The registered info of one service (``"~"``: the workspace manager's)."""
        peer = calling_peer()
        config = plain(config) or {}
        if _names_manager(service_id):
            return self.manager_info()
        if (
            self.builtins is not None
            and (key := self.builtins.named(service_id, peer.workspace, peer.user)) is not None
        ):
            return self.builtins.info(key)
        return await self.resolve(
            service_id,
            workspace=peer.workspace,
            user=peer.user,
            mode=config.get("mode"),
            select_timeout=config.get("select_timeout"),
            charge=lambda calls: self._asking_for(peer, calls),
        )

    async def get_service(self, service_id: Any, config: Any = None, context: dict[str, Any] | None = None) -> Any:
        """A service object whose methods the caller can call directly (``"~"``: the workspace manager)."""
        peer = calling_peer()
        config = plain(config) or {}
        if _names_manager(service_id):
            return self._manager_service()
        if (
            self.builtins is not None
            and (key := self.builtins.named(service_id, peer.workspace, peer.user)) is not None
        ):
            return self.builtins.service(key, self.hub.settings.public_base_url)

        if (policy := _balance_policy(config.get("mode"))) is not None and self.balancing is not None:
            return await self._balanced(peer, service_id, policy, config)
        info = await self.resolve(
            service_id,
            workspace=peer.workspace,
            user=peer.user,
            mode=config.get("mode"),
            select_timeout=config.get("select_timeout"),
            charge=lambda calls: self._asking_for(peer, calls),
        )
        timeout = float(config.get("timeout") or 10.0)
        try:
            return await self.fetch_service(
                info,
                timeout=timeout,
                case_conversion=config.get("case_conversion"),
                has_read=peer.user.can(info["id"].partition("/")[0], Permission.READ),
            )
        except Exception:
            # The provider may have left while we asked it (a dropped client stays listed
            # until its transit grace ends): then the service is gone, and the caller is
            # told so, as if it had looked a moment later (the chosen one only: a select:
            # mode does not ask the candidates again).
            await self.resolve(info["id"], workspace=peer.workspace, user=peer.user, mode=None)
            raise

    async def _balanced(self, peer: Peer, service_id: Any, policy: str, config: dict[str, Any]) -> Any:
        """A balanced handle: one instance's service, its functions addressed to the handle
        (:mod:`switchboard.hub.manager.balanced_lookup`)."""
        assert self.balancing is not None
        target, first = await self.balancing.bind(peer.id, peer.workspace, service_id, policy, peer.user)
        info = await self.resolve(first, workspace=peer.workspace, user=peer.user, mode=None)
        service = await self.fetch_service(
            info,
            timeout=float(config.get("timeout") or 10.0),
            case_conversion=config.get("case_conversion"),
            has_read=peer.user.can(info["id"].partition("/")[0], Permission.READ),
        )
        return balanced_handle(service, target=target, name=target.rpartition("|")[2])

    async def list_services(
        self, query: Any = None, include_unlisted: bool = False, context: dict[str, Any] | None = None
    ) -> list[ServiceInfo]:
        """Services visible to the caller, filtered by ``query`` (whose values may hold ``*``)."""
        peer = calling_peer()
        listing = list_query(plain(query), peer.workspace)
        svc_ids.check_listing_everywhere(listing)
        if include_unlisted:
            svc_ids.check_include_unlisted(listing, peer.workspace)
        await self._settled()
        found = await self.hub.registry.find(listing.lookup)
        everywhere = listing.patterns.get("workspace", "*") == "*"
        result = []
        for info in self.builtins.listed(peer.user) if self.builtins is not None else ():
            ws = info["id"].partition("/")[0]
            if listing.admits(info) and not (
                everywhere and ws != peer.workspace and svc_ids.visibility(info) != "public"
            ):
                result.append(info)
        for info in found:
            ws = info["id"].partition("/")[0]
            if everywhere and ws != peer.workspace and svc_ids.visibility(info) != "public":
                continue
            if not svc_ids.may_list(
                info,
                caller_workspace=peer.workspace,
                has_read=peer.user.can(ws, Permission.READ),
                include_unlisted=include_unlisted,
            ):
                continue
            if listing.admits(info):
                result.append(svc_ids.shown(info, has_read=peer.user.can(ws, Permission.READ)))
        return result

    async def _settled(self) -> None:
        """Return once the registry holds what it should (at once, unless Redis just lost its data:
        then at most :data:`SETTLE_WAIT` later); raise a retryable error if it still does not."""
        registry, clock = self.hub.registry, self.hub.clock
        deadline = clock.monotonic() + SETTLE_WAIT
        while await registry.lost_data():
            if clock.monotonic() >= deadline:
                raise BackendError(REFILLING)
            await clock.sleep(SETTLE_POLL)

    async def _find_once_settled(self, query: svc_ids.ServiceQuery) -> list[ServiceInfo]:
        """Nothing found while the registry is being re-filled: look again until it is, or it is found."""
        registry, clock = self.hub.registry, self.hub.clock
        deadline = clock.monotonic() + SETTLE_WAIT
        while True:
            if found := await registry.find(query):
                return found
            if not await registry.lost_data():
                return []
            if clock.monotonic() >= deadline:
                raise BackendError(REFILLING)
            await clock.sleep(SETTLE_POLL)

    def _check_size(self, peer: Peer, info: ServiceInfo) -> tuple[str | None, int]:
        """Bound what one client's registrations hold (they live in the registry until it leaves);
        return ``info`` as the JSON measured, for the registry to store (``None``: not JSON), and its size."""
        s = self.hub.settings
        try:
            encoded: str | None = registration_json(info, self._schemas)
        except (TypeError, ValueError):
            encoded = None  # measured as before; the registry refuses it as it always did
        size = len(encoded) if encoded is not None else len(json.dumps(info, separators=(",", ":"), default=repr))
        if size > s.max_service_bytes:
            raise LimitExceeded(
                f"Service info too large: {size} bytes, at most {s.max_service_bytes} (--max-service-bytes)"
            )
        total = self.hub.announced.bytes_besides(peer, info["id"]) + size
        if total > s.max_registration_bytes:
            raise LimitExceeded(
                f"Registrations too large: this client's services would hold {total} bytes, "
                f"at most {s.max_registration_bytes} (--max-registration-bytes)"
            )
        return encoded, size

    async def resolve(
        self,
        service_id: str,
        *,
        workspace: str,
        user: User,
        mode: Any,
        select_timeout: Any = None,
        charge: Charge | None = None,
    ) -> ServiceInfo:
        """The single service ``service_id`` names for a caller, chosen by ``mode`` among several
        (:mod:`switchboard.protocol.hypha.selection`), or a clear error.

        A ``select:`` mode's every candidate asked is a call of the asker:
        ``charge`` admits them (its rate and calls in flight) for as long as
        they run, or refuses the lookup (:class:`~switchboard.errors.RateLimited`);
        never more are asked than its burst or calls in flight let through.
        """
        query = svc_ids.parse_query(service_id, workspace)
        if query.workspace == "*":
            raise ProtocolError("workspace '*' is not allowed here: use list_services")
        chosen = selection.parse_mode(mode, workspace=query.workspace)  # refused even for one match
        wait = selection.parse_select_timeout(select_timeout)
        allowed, has_read = await self._allowed(query, workspace=workspace, user=user)
        by_id = {i["id"]: i for i in allowed}
        ids = list(by_id)
        loads: Mapping[str, int] = {}
        local: set[str] = set()
        answers: list[tuple[str, Any]] = []
        if len(ids) > 1:
            providers = {selection.client_of(i) for i in ids}
            if chosen.kind == "min_load":
                loads = await self.hub.loads.of(providers)
            elif chosen.kind == "native:random":
                local = {c for c in providers if self.hub.peer_for(c) is not None}
            elif chosen.kind == "select":
                s = self.hub.settings
                most = min(selection.MAX_ASKED, s.message_burst, s.max_pending_calls)
                asked = [by_id[i] for i in selection.to_ask(ids, self._rng, limit=most)]
                with charge(len(asked)) if charge is not None else contextlib.nullcontext():
                    answers = await self._ask(asked, chosen, wait, user=user, workspace=workspace)
        pick = selection.choose(ids, chosen, rng=self._rng, query=str(query), loads=loads, local=local, answers=answers)
        return svc_ids.shown(by_id[pick], has_read=has_read)

    async def _allowed(self, query: ServiceQuery, *, workspace: str, user: User) -> tuple[list[ServiceInfo], bool]:
        """The services ``query`` matches that a caller of ``workspace`` may use (at least one, or a
        clear error), and whether it has read on the services' workspace."""
        found = await self.hub.registry.find(query)
        if not found and await self.hub.registry.lost_data():
            found = await self._find_once_settled(query)
        has_read = user.can(query.workspace, Permission.READ)
        # A client the caller may not list (its built-in service: svc_ids.may_use) is not there for it,
        # by any id or mode: refused as absent, not as forbidden, which would tell that it is there.
        found = [i for i in found if has_read or not svc_ids.is_presence(i)]
        allowed = [i for i in found if svc_ids.may_use(i, caller_workspace=workspace, has_read=has_read)]
        if not allowed:
            if found:
                raise PermissionDenied(f"Permission denied for non-public service in workspace {query.workspace}")
            raise NotFound(f"Service not found: {query}")
        return allowed, has_read

    async def instances(self, service_id: Any, workspace: str, user: User) -> list[ServiceInfo]:
        """Every service ``service_id`` names that a caller of ``workspace`` may use, as for a direct lookup."""
        query = svc_ids.parse_query(service_id, workspace)
        if query.workspace == "*":
            raise ProtocolError("workspace '*' is not allowed here: use list_services")
        allowed, _ = await self._allowed(query, workspace=workspace, user=user)
        return allowed

    def _asking_for(self, peer: Peer, calls: int) -> contextlib.AbstractContextManager[None]:
        """A caller's select: calls: a connection's are taken from its own frame rate and counted
        in flight (at most --max-pending-calls) while they run; an HTTP caller's from its request's."""
        allowance = self._allowances.get(peer)
        if allowance is None:
            s = self.hub.settings
            # the peer's own frame rate when it has one (a connection's, given by the gatekeeper)
            bucket = self.hub.rates.get(peer)
            if bucket is None:
                bucket = TokenBucket(rate=s.max_messages_per_second, burst=s.message_burst, clock=self.hub.clock)
            allowance = Allowance(bucket, s.max_pending_calls, peer.id)
            if self._detached_later(peer):
                self._allowances[peer] = allowance
        return allowance.holding(calls)

    def _detached_later(self, peer: Peer) -> bool:
        """Whether what is kept for ``peer`` is freed by the hub's detach (:meth:`forget`): it is the live
        connection of its client here. A closed one is being detached, and a superseded one's
        registration is undone (as is anything an HTTP caller might leave)."""
        return not peer.closed and self.hub.peer_for(peer.id) is peer

    @contextlib.contextmanager
    def charging(self, caller: Peer, allowance: Allowance) -> Iterator[None]:
        """Within the block, ``caller``'s select: calls are admitted by ``allowance`` (an HTTP
        request's: its user's or address's, :mod:`switchboard.server.http.http_services`)."""
        self._allowances[caller] = allowance
        try:
            yield
        finally:
            self._allowances.pop(caller, None)

    def services_of(self, peer: Peer) -> Mapping[str, ServiceInfo]:
        """What ``peer`` announced, by service id."""
        return self.hub.announced.of(peer)

    def keeps(self, peer: Peer) -> bool:
        """Whether anything is kept here for ``peer`` (its services, its select: allowance)."""
        return bool(self.hub.announced.of(peer)) or peer in self._allowances

    def forget(self, peer: Peer) -> None:
        """``peer`` was detached: what it announced and its select: allowance are no longer kept."""
        self.hub.announced.forget(peer)
        self._allowances.pop(peer, None)

    async def _ask(
        self, candidates: list[ServiceInfo], mode: selection.Mode, timeout: float, *, user: User, workspace: str
    ) -> list[tuple[str, Any]]:
        """Call ``mode.function`` on every candidate at once; the answers that came within ``timeout``,
        in the order they came (for ``first_success``, only the first).

        Hypha asks one candidate after another, each with the whole timeout;
        here they are asked in parallel and the whole selection takes at most
        ``timeout``. The function is called as the caller, never as the
        manager: a provider sees who asked, as it would for a direct call.
        """
        answers: list[tuple[str, Any]] = []

        async def ask(info: ServiceInfo) -> tuple[str, Any]:
            service = await self.fetch_service(info, timeout=timeout, has_read=False)  # not shown to anyone
            function = dict.get(service, mode.function)  # dict.get: a service may have a method "get"
            if not callable(function):
                raise NotFound(f"{info['id']} has no function {mode.function}")
            return info["id"], await function()

        ws = candidates[0]["id"].partition("/")[0]
        acting_ws = ws if user.can(ws, Permission.READ) else workspace
        async with self.hub.acting_as(user.to_wire(acting_ws, "select"), acting_ws):
            calls = [asyncio.ensure_future(ask(i)) for i in candidates]
            try:
                async with asyncio.timeout(timeout):
                    for next_answer in asyncio.as_completed(calls):
                        try:
                            answers.append(await next_answer)
                        except Exception as exc:  # a candidate that fails is left out, as in Hypha
                            log.info("select: a candidate's %s failed: %s", mode.function, exc)
                            continue
                        if mode.criteria == "first_success":
                            break
            except TimeoutError:
                log.info("select: %d of %d candidates answered within %gs", len(answers), len(calls), timeout)
            finally:
                for call in calls:
                    call.cancel()
                await asyncio.gather(*calls, return_exceptions=True)
        return answers

    def manager_info(self) -> ServiceInfo:
        """What ``get_service_info("~")`` returns: the manager's service, as Hypha shows it (id ``~``)."""
        service = self._manager_service()
        config = dict(dict.get(service, "config") or {})
        return {
            "id": "~",
            "name": service.get("name"),
            "type": "generic",
            "description": service.get("description"),
            "config": config,
            "app_id": "*",
            "service_schema": {k: v.__schema__ for k, v in service.items() if callable(v) and hasattr(v, "__schema__")},
        }

    def _manager_service(self) -> dict[str, Any]:
        """The manager's ``default`` service itself: its methods go back to the manager as the
        ``services.default.*`` calls a client makes anyway."""
        rpc = self._rpc()
        assert rpc is not None
        address = self.hub.manager_address
        service: dict[str, Any] = rpc.get_local_service("default", context={"to": address, "ws": "*"})
        return service

    async def fetch_service(
        self, info: ServiceInfo, *, timeout: float, has_read: bool, case_conversion: Any = None
    ) -> Any:
        """Ask the provider for its service object and address it for a caller (``has_read``: one
        with read on the service's workspace, who alone sees ``config.authorized_workspaces``)."""
        rpc = self._rpc()
        assert rpc is not None
        config: dict[str, Any] = {"timeout": timeout, "_no_retry": True}
        if case_conversion:
            config["case_conversion"] = case_conversion
        service = await rpc.get_remote_service(info["id"], config)
        ws = info["id"].partition("/")[0]
        service["id"] = info["id"]
        # dict.get, not service.get: a service may have a method named "get"
        service_config = dict.get(service, "config") or {}
        if not has_read:
            service_config = svc_ids.without_authorized(dict(service_config))
        service_config["workspace"] = ws
        service_config["url"] = f"{self.hub.settings.public_base_url}/{ws}/services/{info['id'].partition('/')[2]}"
        service["config"] = service_config
        return service

    async def _check_singleton(self, info: ServiceInfo) -> None:
        """A ``singleton`` service is the only one of its name in its workspace (Hypha's rule, both ways).

        A check before the write, as in Hypha: two registrations racing on two
        replicas can both pass.
        """
        ws, _, name = svc_ids.split_full_id(info["id"])
        singleton = bool((info.get("config") or {}).get("singleton"))
        registry = self.hub.registry
        try:  # only a singleton's registration reads its namesakes: a crowd's same-named services cost nothing
            found = await (registry.find(ServiceQuery(ws, "*", name)) if singleton else registry.singletons(ws, name))
        except BackendError as exc:  # the registry is away or saturated: written or deferred unchecked
            log.info("singleton check of %s skipped: %s", info["id"], exc)
            return
        others = [i for i in found if i["id"] != info["id"]]
        if not others:
            return
        if singleton:
            raise ProtocolError(
                f"A singleton service with the same name ({name}) already exists in the workspace ({ws}), "
                "please remove it first or use a different name."
            )
        if any((i.get("config") or {}).get("singleton") for i in others):
            raise ProtocolError(
                f"A singleton service with the same name ({name}) has already exists in the workspace ({ws}), "
                "please remove it first or use a different name."
            )

    def __repr__(self) -> str:
        return f"<ServiceDirectory registry={type(self.hub.registry).__name__}>"


def _balance_policy(mode: Any) -> str | None:
    try:
        return balance.policy_of(mode)
    except ValueError as exc:
        raise ProtocolError(str(exc)) from None


def _names_manager(service_id: Any) -> bool:
    """``"~"`` (or ``"<workspace>/~"``, as the HTTP routes put it) is the workspace manager, as in Hypha."""
    return service_id == "~" or (isinstance(service_id, str) and service_id.endswith("/~"))


def registration_json(info: ServiceInfo, schemas: SharedValues) -> str:
    """``info`` as compact JSON, exactly as ``json.dumps`` writes it, with a shared schema's text
    (encoded once for every client that announces it) spliced in when the schema is the last key,
    as a registration's is."""
    schema = info.get("service_schema")
    if schema is None or next(reversed(info)) != "service_schema":
        return json.dumps(info, separators=(",", ":"))
    rest = json.dumps({k: v for k, v in info.items() if k != "service_schema"}, separators=(",", ":"))
    return f'{rest[:-1]}{"," if len(rest) > 2 else ""}"service_schema":{schemas.json(schema)}}}'

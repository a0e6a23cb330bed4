"""The manager's service methods: announcing, withdrawing, finding and fetching services.

Every method acts for the connection that made the call
(:func:`~switchboard.hub.manager_door.calling_peer`), never for whoever the
message says it is from. What a client announces is bounded in count and
size (it lives in the shared registry until the client leaves), and what a
caller may find follows the visibility rules of
:mod:`switchboard.protocol.services`. The HTTP gateway resolves and fetches
services through the same methods (:mod:`switchboard.server.http_services`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any, Protocol

from hypha_rpc import RPC

from switchboard.backends.base import Registry
from switchboard.clock import Clock
from switchboard.config import Settings
from switchboard.errors import BackendError, LimitExceeded, NotFound, PermissionDenied, ProtocolError
from switchboard.hub.auth import Permission
from switchboard.hub.manager_door import calling_peer, require
from switchboard.hub.peer import Peer
from switchboard.protocol import services as svc_ids
from switchboard.protocol.services import ServiceInfo, field_of, list_query
from switchboard.protocol.values import plain

# Right after Redis lost its data (restarted empty), the registry is re-filled by every replica
# within seconds; meanwhile a lookup waits this long at most for it, then answers "please retry"
# (an empty answer would tell the caller that services which are there are gone).
SETTLE_WAIT = 2.0
SETTLE_POLL = 0.1
REFILLING = "Hub backend unavailable, please retry: the registry is being re-filled after Redis lost its data"


class DirectoryHost(Protocol):
    """What the service methods need of the hub (the hub is :class:`switchboard.hub.hub.Hub`)."""

    settings: Settings
    registry: Registry
    clock: Clock
    registry_dirty: bool  # set when a registration could not be written: the cluster loop re-asserts

    def peer_for(self, address: str) -> Peer | None: ...

    async def emit_event(self, workspace: str, event_type: str, data: Any) -> None: ...


class ServiceDirectory:
    """The ``default`` service's methods about services (see the module docstring).

    ``rpc`` gives the manager's RPC once it runs: a service object is fetched
    from its provider through it.
    """

    def __init__(self, hub: DirectoryHost, *, rpc: Callable[[], RPC | None]) -> None:
        self.hub = hub
        self._rpc = rpc

    async def register_service(self, service: Any, config: Any = None, context: dict[str, Any] | None = None) -> None:
        """Announce a service of the calling client to its workspace."""
        peer = calling_peer()
        raw = plain(service)
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
            raw, workspace=peer.workspace, client_id=peer.client_id, user_wire=peer.user_wire
        )
        limit = self.hub.settings.max_services_per_client
        if len(peer.services) >= limit and info["id"] not in peer.services:  # counted here: no Redis trip
            raise LimitExceeded(f"Too many services: a client may register at most {limit}")
        self._check_size(peer, info)
        peer.services[info["id"]] = info
        try:
            previous = await self.hub.registry.register(info)
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
        if peer.returned and previous == info:
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
        peer.services.pop(sid, None)
        peer.service_bytes.pop(sid, None)
        if removed is None:
            raise NotFound(f"Service not found: {service_id}")
        if sid.endswith(":built-in"):
            await self.hub.emit_event(ws, "client_disconnected", {"id": cid, "workspace": ws})
        else:
            await self.hub.emit_event(ws, "service_removed", removed)

    async def get_service_info(
        self, service_id: Any, config: Any = None, context: dict[str, Any] | None = None
    ) -> ServiceInfo:
        """The registered info of one service."""
        peer = calling_peer()
        config = plain(config) or {}
        return await self.resolve(service_id, workspace=peer.workspace, user=peer.user, mode=config.get("mode"))

    async def get_service(self, service_id: Any, config: Any = None, context: dict[str, Any] | None = None) -> Any:
        """A service object whose methods the caller can call directly."""
        peer = calling_peer()
        config = plain(config) or {}
        info = await self.resolve(service_id, workspace=peer.workspace, user=peer.user, mode=config.get("mode"))
        timeout = float(config.get("timeout") or 10.0)
        try:
            return await self.fetch_service(info, timeout=timeout, case_conversion=config.get("case_conversion"))
        except Exception:
            # The provider may have left while we asked it (a dropped client stays listed
            # until its transit grace ends): then the service is gone, and the caller is
            # told so, as if it had looked a moment later.
            await self.resolve(service_id, workspace=peer.workspace, user=peer.user, mode=config.get("mode"))
            raise

    async def list_services(
        self, query: Any = None, include_unlisted: bool = False, context: dict[str, Any] | None = None
    ) -> list[ServiceInfo]:
        """Services visible to the caller, filtered by ``query``."""
        peer = calling_peer()
        q, filters = list_query(plain(query), peer.workspace)
        await self._settled()
        found = await self.hub.registry.find(q)
        result = []
        for info in found:
            ws = info["id"].partition("/")[0]
            if q.workspace == "*" and ws != peer.workspace and svc_ids.visibility(info) != "public":
                continue
            if not svc_ids.may_list(
                info,
                caller_workspace=peer.workspace,
                has_read=peer.user.can(ws, Permission.READ),
                include_unlisted=include_unlisted,
            ):
                continue
            if all(field_of(info, k) == v for k, v in filters.items()):
                result.append(info)
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

    def _check_size(self, peer: Peer, info: ServiceInfo) -> None:
        """Bound what one client's registrations hold (they live in the registry until it leaves)."""
        s = self.hub.settings
        size = len(json.dumps(info, separators=(",", ":"), default=repr))
        if size > s.max_service_bytes:
            raise LimitExceeded(
                f"Service info too large: {size} bytes, at most {s.max_service_bytes} (--max-service-bytes)"
            )
        total = sum(peer.service_bytes.values()) - peer.service_bytes.get(info["id"], 0) + size
        if total > s.max_registration_bytes:
            raise LimitExceeded(
                f"Registrations too large: this client's services would hold {total} bytes, "
                f"at most {s.max_registration_bytes} (--max-registration-bytes)"
            )
        peer.service_bytes[info["id"]] = size

    async def resolve(self, service_id: str, *, workspace: str, user: Any, mode: str | None) -> ServiceInfo:
        """The single service ``service_id`` names for a caller, or a clear error."""
        query = svc_ids.parse_query(service_id, workspace)
        if query.workspace == "*":
            raise ProtocolError("workspace '*' is not allowed here: use list_services")
        found = await self.hub.registry.find(query)
        if not found and await self.hub.registry.lost_data():
            found = await self._find_once_settled(query)
        allowed = [
            i
            for i in found
            if svc_ids.may_use(i, caller_workspace=workspace, has_read=user.can(query.workspace, Permission.READ))
        ]
        if not allowed:
            if found:
                raise PermissionDenied(f"Permission denied for non-public service in workspace {query.workspace}")
            raise NotFound(f"Service not found: {query}")
        if len(allowed) == 1:
            return allowed[0]
        mode = mode or ("random" if query.workspace == "public" else "exact")
        if mode == "random":
            return random.choice(allowed)
        if mode == "first":
            return allowed[0]
        if mode == "last":
            return allowed[-1]
        raise ProtocolError(f"Multiple services found for {query} (use mode 'random', 'first' or 'last')")

    async def fetch_service(self, info: ServiceInfo, *, timeout: float, case_conversion: Any = None) -> Any:
        """Ask the provider for its service object and address it for any caller."""
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
        service_config["workspace"] = ws
        service_config["url"] = f"{self.hub.settings.public_base_url}/{ws}/services/{info['id'].partition('/')[2]}"
        service["config"] = service_config
        return service

    def __repr__(self) -> str:
        return f"<ServiceDirectory registry={type(self.hub.registry).__name__}>"

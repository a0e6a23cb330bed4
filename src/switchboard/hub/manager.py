"""The workspace manager: the server's own RPC peer, ``*/<manager_id>:default``.

It is hosted with ``hypha_rpc.RPC`` (protocol §4.2), which gives chunking,
heartbeats and callback handling for free; this module supplies the link that
plugs that RPC into the hub's router, and the methods of the ``default``
service. Each replica answers the manager calls of its own clients, so every
caller is a local :class:`~switchboard.hub.peer.Peer` whose user we know.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Callable
from typing import Any, Protocol

from hypha_rpc import RPC
from hypha_rpc.utils.schema import schema_function

from switchboard.backends.base import Registry
from switchboard.clock import Clock
from switchboard.config import Settings
from switchboard.errors import (
    BackendError,
    LimitExceeded,
    NotFound,
    PermissionDenied,
    ProtocolError,
)
from switchboard.hub.auth import Permission, TokenIssuer, child_user
from switchboard.hub.manager_door import CALLER, ManagerDoor
from switchboard.hub.peer import Peer
from switchboard.hub.uploads import MAX_OPEN_UPLOADS, UPLOAD_IDLE_TIMEOUT, Uploads
from switchboard.protocol import envelope, ids
from switchboard.protocol import services as svc_ids
from switchboard.protocol.handshake import HYPHA_VERSION
from switchboard.protocol.services import ServiceInfo, ServiceQuery, field_of, list_query
from switchboard.protocol.values import plain
from switchboard.tasks import spawn

log = logging.getLogger(__name__)


class Hub(Protocol):
    """What the manager needs of the hub that hosts it (the hub is :class:`switchboard.hub.hub.Hub`)."""

    settings: Settings
    clock: Clock
    registry: Registry
    issuer: TokenIssuer
    manager_id: str
    registry_dirty: bool  # set when a registration could not be written: the cluster loop re-asserts

    def peer_for(self, address: str) -> Peer | None: ...

    async def emit_event(self, workspace: str, event_type: str, data: Any) -> None: ...

    async def route_from_manager(self, data: bytes) -> None: ...


# A year: long-lived service tokens fit; an infinite or absurd expiry is a mistake.
MAX_TOKEN_LIFETIME = 365 * 24 * 3600.0


class _RouterLink:
    """The duck-typed connection ``hypha_rpc.RPC`` expects, wired to the hub."""

    manager_id = None  # the manager does not register itself with a manager

    def __init__(self, hub: Hub) -> None:
        self._hub = hub
        self.handler: Callable[[bytes | dict[str, Any]], None] | None = None  # hypha-rpc takes both

    def on_message(self, handler: Callable[[bytes | dict[str, Any]], None]) -> None:
        self.handler = handler

    def on_connected(self, handler: Any) -> None:
        """The manager never reconnects; nothing to remember."""

    def on_disconnected(self, handler: Any) -> None:
        """The manager never reconnects; nothing to remember."""

    async def emit_message(self, data: bytes) -> None:
        await self._hub.route_from_manager(data)

    async def disconnect(self, reason: str | None = None) -> None:
        self.handler = None


class WorkspaceManager:
    """The ``default`` service every client talks to, and the hub's own RPC peer."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.link = _RouterLink(hub)
        self.rpc: RPC | None = None
        self._sending: set[asyncio.Task[Any]] = set()  # answers the door sends
        s = hub.settings
        self.door = ManagerDoor(
            handler=lambda: self.link.handler,
            send=lambda frame: spawn(self._sending, hub.route_from_manager(frame)),
            uploads=Uploads(
                clock=hub.clock,
                keep=True,
                max_bytes=s.max_upload_bytes,
                max_uploads=MAX_OPEN_UPLOADS,
                idle_timeout=UPLOAD_IDLE_TIMEOUT,
            ),
        )

    async def start(self) -> None:
        hub = self.hub
        self.rpc = RPC(
            self.link,
            client_id=hub.manager_id,
            workspace="*",
            server_base_url=hub.settings.public_base_url,
            silent=True,
            method_timeout=hub.settings.call_timeout,
        )
        await self.rpc.register_service(self._service(), {"notify": False})

    async def stop(self) -> None:
        if self.rpc is not None:
            self.rpc.close()
            self.rpc = None

    def receive(self, frame: bytes, caller: Peer | None = None) -> None:
        """Hand a frame addressed to the manager to its RPC, through the door's checks.

        ``caller`` is the local client that sent it; the manager's services
        act for that client alone (``None``: a provider's reply, or our own).
        """
        self.door.receive(frame, caller)

    def _service(self) -> dict[str, Any]:
        s = self.hub.settings
        methods: dict[str, tuple[Callable[..., Any], dict[str, Any]]] = {
            "echo": (self.echo, {"data": {}}),
            "log": (self.log_message, {"msg": {"type": "string"}}),
            "register_service": (self.register_service, {"service": {"type": "object"}, "config": {}}),
            "unregister_service": (self.unregister_service, {"service_id": {"type": "string"}}),
            "get_service_info": (self.get_service_info, {"service_id": {"type": "string"}, "config": {}}),
            "get_service": (self.get_service, {"service_id": {"type": "string"}, "config": {}}),
            "list_services": (self.list_services, {"query": {}, "include_unlisted": {"type": "boolean"}}),
            "list_clients": (self.list_clients, {"workspace": {"type": "string"}}),
            "ping": (self.ping, {"client_id": {"type": "string"}, "timeout": {"type": "number"}}),
            "generate_token": (self.generate_token, {"config": {"type": "object"}}),
            "parse_token": (self.parse_token, {"token": {"type": "string"}}),
            "subscribe": (self.subscribe, {"event_type": {}}),
            "unsubscribe": (self.unsubscribe, {"event_type": {}}),
            "get_workspace_info": (self.get_workspace_info, {"workspace": {"type": "string"}}),
            "check_status": (self.check_status, {}),
        }
        service: dict[str, Any] = {
            "id": "default",
            "name": "Default workspace management service",
            "description": "Services for managing workspace.",
            "config": {
                "require_context": True,
                "visibility": "public",
                "server_id": s.server_id,
                "public_base_url": s.public_base_url,
                "hypha_version": HYPHA_VERSION,
            },
        }
        for name, (fn, props) in methods.items():
            doc = (fn.__doc__ or name).strip().splitlines()[0]
            service[name] = schema_function(
                fn, name=name, description=doc, parameters={"type": "object", "properties": props}
            )
        return service

    # -- helpers -------------------------------------------------------------

    def _caller(self, context: dict[str, Any] | None) -> Peer:
        """The connection that sent the call; never who the message says it is from."""
        peer = CALLER.get()
        if peer is None or peer.closed:
            raise PermissionDenied("Permission denied: the manager serves only calls of connected clients")
        return peer

    def _require(self, peer: Peer, workspace: str, need: Permission) -> None:
        if not peer.user.can(workspace, need):
            raise PermissionDenied(f"Permission denied for workspace {workspace}")

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

    async def answers_ping(self, address: str, timeout: float = 2.0) -> bool:
        try:
            assert self.rpc is not None
            await self.rpc.ping(address, timeout)
        except Exception:
            return False
        return True

    async def resolve(self, service_id: str, *, workspace: str, user: Any, mode: str | None) -> ServiceInfo:
        """The single service ``service_id`` names for a caller, or a clear error."""
        query = svc_ids.parse_query(service_id, workspace)
        if query.workspace == "*":
            raise ProtocolError("workspace '*' is not allowed here: use list_services")
        found = await self.hub.registry.find(query)
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
        assert self.rpc is not None
        config: dict[str, Any] = {"timeout": timeout, "_no_retry": True}
        if case_conversion:
            config["case_conversion"] = case_conversion
        service = await self.rpc.get_remote_service(info["id"], config)
        ws = info["id"].partition("/")[0]
        service["id"] = info["id"]
        # dict.get, not service.get: a service may have a method named "get"
        service_config = dict.get(service, "config") or {}
        service_config["workspace"] = ws
        service_config["url"] = f"{self.hub.settings.public_base_url}/{ws}/services/{info['id'].partition('/')[2]}"
        service["config"] = service_config
        return service

    # -- the default service -------------------------------------------------

    async def echo(self, data: Any, context: dict[str, Any] | None = None) -> Any:
        """Return ``data`` unchanged (a round-trip test)."""
        peer = self._caller(context)
        self._require(peer, peer.workspace, Permission.READ_WRITE)
        return data

    async def log_message(self, msg: Any, context: dict[str, Any] | None = None) -> None:
        """Write a line to the server log on behalf of the caller."""
        peer = self._caller(context)
        self._require(peer, peer.workspace, Permission.READ_WRITE)
        peer.log.info("client log: %.1000s", msg)

    async def register_service(self, service: Any, config: Any = None, context: dict[str, Any] | None = None) -> None:
        """Announce a service of the calling client to its workspace."""
        peer = self._caller(context)
        raw = plain(service)
        if not isinstance(raw, dict):
            raise ProtocolError("register_service expects a service info object")
        short = str(raw.get("id", "")).rpartition(":")[2]
        # A read-only client may still announce its own built-in service: that
        # is its presence (listings, duplicate-id check), not a capability.
        need = Permission.READ if short == "built-in" else Permission.READ_WRITE
        self._require(peer, peer.workspace, need)
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
        peer = self._caller(context)
        self._require(peer, peer.workspace, Permission.READ_WRITE)
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
        peer = self._caller(context)
        config = plain(config) or {}
        return await self.resolve(service_id, workspace=peer.workspace, user=peer.user, mode=config.get("mode"))

    async def get_service(self, service_id: Any, config: Any = None, context: dict[str, Any] | None = None) -> Any:
        """A service object whose methods the caller can call directly."""
        peer = self._caller(context)
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
        peer = self._caller(context)
        q, filters = list_query(plain(query), peer.workspace)
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

    async def list_clients(self, workspace: Any = None, context: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Every client of a workspace (those that registered their built-in service)."""
        peer = self._caller(context)
        ws = ids.check_id(workspace or peer.workspace, "workspace")
        self._require(peer, ws, Permission.READ)
        found = await self.hub.registry.find(ServiceQuery(ws, "*", "built-in"))
        return [{"id": i["id"].rpartition(":")[0], "user": i["config"].get("created_by")} for i in found]

    async def ping(self, client_id: Any, timeout: float = 5, context: dict[str, Any] | None = None) -> str:
        """``"pong"`` if the client answers, else a string saying why not (never raises)."""
        peer = self._caller(context)
        if not isinstance(client_id, str):
            return f"Failed to ping client {client_id!r}: client_id must be a string"
        ws, slash, cid = client_id.rpartition("/")
        if not ids.is_id(cid) or (slash and not ids.is_id(ws)):
            return f"Failed to ping client {client_id[:140]!r}: ids are {ids.GRAMMAR}"
        target = client_id if slash else f"{peer.workspace}/{client_id}"
        try:
            assert self.rpc is not None
            await self.rpc.ping(target, float(timeout))
        except Exception as exc:
            return f"Failed to ping client {client_id}: {exc or type(exc).__name__}"
        return "pong"

    async def generate_token(self, config: Any = None, context: dict[str, Any] | None = None) -> str:
        """A token for another client to join a workspace with a given permission."""
        peer = self._caller(context)
        config = plain(config) or {}
        if not isinstance(config, dict):
            raise ProtocolError("generate_token expects a config object")
        ws = ids.check_id(config.get("workspace") or peer.workspace, "workspace")
        if not peer.user.can(ws, Permission.ADMIN):
            raise PermissionDenied("Only admin can generate token.")
        client_id = config.get("client_id")
        if client_id is not None:
            ids.check_id(client_id, "client id")
        permission_name = config.get("permission") or "read_write"
        if not isinstance(permission_name, str):
            raise ProtocolError("permission must be one of read, read_write or admin")
        try:
            permission = Permission.parse(permission_name)
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None
        expires_in = config.get("expires_in") or 3600
        if (
            not isinstance(expires_in, int | float)
            or isinstance(expires_in, bool)
            or not 0 < expires_in <= MAX_TOKEN_LIFETIME
        ):
            raise ProtocolError(f"expires_in must be a number of seconds from 0 to {MAX_TOKEN_LIFETIME:g}")
        user = child_user(peer.user, workspace=ws, permission=permission)
        return self.hub.issuer.issue(
            user,
            workspace=ws,
            permission=permission,
            expires_in=float(expires_in),
            client_id=client_id,
        )

    async def parse_token(self, token: Any, context: dict[str, Any] | None = None) -> dict[str, Any]:
        """The user a token issued by this hub stands for."""
        self._caller(context)
        user = self.hub.issuer.verify(token)
        return user.to_wire(user.current_workspace, user.client_id)

    async def subscribe(self, event_type: Any, context: dict[str, Any] | None = None) -> bool:
        """Receive workspace broadcasts of these event types on this connection."""
        peer = self._caller(context)
        for name in _event_names(event_type):
            if name not in envelope.SERVER_EVENT_TYPES and (name.startswith("ws-") or "/" in name):
                raise PermissionDenied(f"Cannot subscribe to events of another workspace: {name}")
            peer.subscriptions.add(name)
        return True

    async def unsubscribe(self, event_type: Any, context: dict[str, Any] | None = None) -> bool:
        """Stop receiving these event types."""
        peer = self._caller(context)
        peer.subscriptions.difference_update(_event_names(event_type))
        return True

    async def get_workspace_info(self, workspace: Any = None, context: dict[str, Any] | None = None) -> dict[str, Any]:
        """What this hub knows of a workspace."""
        peer = self._caller(context)
        ws = ids.check_id(workspace or peer.workspace, "workspace")
        self._require(peer, ws, Permission.READ)
        return {
            "type": "workspace",
            "id": ws,
            "name": ws,
            "description": "",
            "persistent": False,
            "owners": [],
            "read_only": False,
            "icon": None,
            "covers": [],
            "docs": None,
            "service_types": {},
            "config": {},
            "status": {"ready": True},
        }

    async def check_status(self, context: dict[str, Any] | None = None) -> dict[str, Any]:
        """Whether the workspace is ready, and the caller's permission in it."""
        peer = self._caller(context)
        return {"status": "ready", "user_permission": peer.user.permission(peer.workspace).code}


def _event_names(event_type: Any) -> list[str]:
    names = [event_type] if isinstance(event_type, str) else plain(event_type)
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise ProtocolError("event_type must be a non-empty string or list of strings")
    return names

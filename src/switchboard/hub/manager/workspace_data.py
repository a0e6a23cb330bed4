"""A workspace's environment variables and service types, kept in the shared
:class:`~switchboard.backends.base.WorkspaceStore` (the manager's ``set_env``,
``get_env``, ``register_service_type``, ``get_service_type``, ``list_service_types``).
"""

from __future__ import annotations

import json
from typing import Any

from switchboard.backends.base import WorkspaceStore
from switchboard.errors import LimitExceeded, NotFound, PermissionDenied, ProtocolError
from switchboard.hub.identity.users import Permission
from switchboard.hub.manager.data_charges import may_store, value_limit
from switchboard.hub.manager.manager_door import calling_peer
from switchboard.hub.manager.workspace_records import WorkspaceRecords, json_text
from switchboard.protocol.hypha import ids
from switchboard.protocol.hypha.values import plain

# Environment variables: configuration, not a database (Hypha keeps them in the record).
MAX_ENV_ENTRIES = 256
MAX_ENV_KEY_LENGTH = 256
MAX_ENV_VALUE_BYTES = 16 << 10
# Service types: interface definitions, a few per workspace, each a JSON schema.
MAX_SERVICE_TYPES = 256
MAX_SERVICE_TYPE_BYTES = 64 << 10


class WorkspaceData:
    """The manager's methods about a workspace's environment and service types."""

    def __init__(self, store: WorkspaceStore, records: WorkspaceRecords) -> None:
        self.store = store
        self.records = records
        self.require = records.require
        self.keep = records.keep
        self.events = records.events

    async def set_env(self, key: Any, value: Any = None, context: dict[str, Any] | None = None) -> None:
        """Set (``None``: remove) an environment variable of the caller's workspace."""
        peer = calling_peer()
        ws = peer.workspace
        await self.require(peer, ws, Permission.READ_WRITE)
        may_store(peer.user, ws)  # a removal too: it writes the event log
        if not isinstance(key, str) or not 0 < len(key) <= MAX_ENV_KEY_LENGTH:
            raise ProtocolError(f"key must be a string of 1 to {MAX_ENV_KEY_LENGTH} characters")
        encoded = None if value is None else json_text(plain(value), "value", value_limit(ws, MAX_ENV_VALUE_BYTES))
        if not await self.store.table_set(
            ws, "env", key, encoded, max_entries=MAX_ENV_ENTRIES, keep=await self.keep(ws), only_new=False
        ):
            raise LimitExceeded(f"Too many environment variables: a workspace holds at most {MAX_ENV_ENTRIES}")
        await self.events.record(peer, "env_set" if value is not None else "env_removed", {"key": key})

    async def get_env(self, key: Any = None, context: dict[str, Any] | None = None) -> Any:
        """One environment variable of the caller's workspace, or all of them."""
        peer = calling_peer()
        ws = peer.workspace
        await self.require(peer, ws, Permission.READ_WRITE)
        environs = {k: json.loads(v) for k, v in (await self.store.table(ws, "env")).items()}
        if key is None:
            return environs
        if key not in environs:
            raise NotFound(f"Environment variable '{key}' not found in workspace {ws}")
        return environs[key]

    # -- service types ------------------------------------------------------------

    async def register_service_type(self, type_info: Any, context: dict[str, Any] | None = None) -> dict[str, Any]:
        """Register an interface (a service type) in the caller's workspace."""
        peer = calling_peer()
        ws = peer.workspace
        await self.require(peer, ws, Permission.READ_WRITE)
        may_store(peer.user, ws)
        info = plain(type_info)
        if not isinstance(info, dict) or not isinstance(info.get("id"), str):
            raise ProtocolError("type_info must be an object with an 'id', a 'name' and a 'definition'")
        owner_ws, slash, type_id = info["id"].rpartition("/")
        if slash and owner_ws != ws:
            raise PermissionDenied(f"Workspace mismatch: {owner_ws} != {ws}, register service types in your own.")
        ids.check_id(type_id, "service type id")
        if not isinstance(info.get("name"), str) or not isinstance(info.get("definition"), dict):
            raise ProtocolError("type_info needs a 'name' (string) and a 'definition' (object)")
        if not await self.store.table_set(
            ws,
            "types",
            type_id,
            json_text(info, "type_info", value_limit(ws, MAX_SERVICE_TYPE_BYTES)),
            max_entries=MAX_SERVICE_TYPES,
            keep=await self.keep(ws),
            only_new=True,
        ):
            if type_id in await self.store.table(ws, "types"):
                raise ProtocolError(f"Service type already exists: {type_id}")
            raise LimitExceeded(f"Too many service types: a workspace holds at most {MAX_SERVICE_TYPES}")
        return info

    async def get_service_type(self, type_id: Any, context: dict[str, Any] | None = None) -> dict[str, Any]:
        """A service type, by ``id`` in the caller's workspace or ``workspace/id``."""
        peer = calling_peer()
        if not isinstance(type_id, str):
            raise ProtocolError("type_id must be a string")
        ws, slash, tid = type_id.rpartition("/")
        ws = ids.check_id(ws, "workspace") if slash else peer.workspace
        ids.check_id(tid, "service type id")
        raw = (await self.store.table(ws, "types")).get(tid)
        allowed = peer.user.can(ws, Permission.READ)
        if raw is None:
            if not allowed:
                raise PermissionDenied(f"Permission denied for workspace {ws}")
            raise NotFound(f"Service type not found: {tid}")
        info = dict(json.loads(raw))
        if (info.get("config") or {}).get("visibility") != "public" and not allowed:
            raise PermissionDenied(f"Permission denied for workspace {ws}")
        return info | {"id": f"{ws}/{tid}"}

    async def list_service_types(self, workspace: Any = None, context: dict[str, Any] | None = None) -> list[Any]:
        """Every service type of a workspace."""
        peer = calling_peer()
        ws = ids.check_id(workspace or peer.workspace, "workspace")
        await self.require(peer, ws, Permission.READ)
        return [json.loads(v) for v in (await self.store.table(ws, "types")).values()]

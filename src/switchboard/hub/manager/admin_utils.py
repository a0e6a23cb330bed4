"""``admin-utils``: Hypha's root service, in the root user's workspace (``ws-user-root/admin-utils``).

Only the root user reaches it: a first-hand credential of the user ``root``
holding ``admin`` on every workspace (``switchboard token --root``). Nobody
else can have that id: a provider's ``root`` is hashed
(:func:`~switchboard.hub.identity.oidc.subject_user_id`), a generated token
stands for a new id and names its maker as ``parent``, an anonymous user's id
starts with ``anonymouz-``. An admin of a workspace, and a token root
generated (whatever rights it carries), are refused.

Each function is carried out on the hub's own parts: the replicas' presence
records (``list_servers``), the workspace store (``list_workspaces``), the
metrics registry (``get_metrics``), and the replica holding a client, told
over the bus when it is another (``kickout_client``, ``unload_workspace``).
Hypha's blocking of users and addresses has no counterpart here: those
functions say so (revoke the user's tokens instead).
"""

from __future__ import annotations

from typing import Any, Protocol

from switchboard.backends.base import Registry, WorkspaceStore
from switchboard.errors import NotFound, PermissionDenied, ProtocolError
from switchboard.hub.identity.users import Permission, User, user_workspace
from switchboard.hub.manager.manager_door import calling_peer
from switchboard.metrics import HubMetrics
from switchboard.protocol.hypha import ids
from switchboard.protocol.hypha.services import ServiceQuery

ROOT_WORKSPACE = user_workspace("root")
# Workspaces every hub has though nobody created them: shown by list_workspaces with the records.
_ALWAYS = ("public", ROOT_WORKSPACE)
# Records list_workspaces reads at most (the store's bound on a listing).
MAX_LISTED = 10_000
# Close codes an operator may send: normal, going away, policy, and the application's own range.
_CLOSE_CODES = frozenset({1000, 1001, 1008}) | frozenset(range(3000, 5000))
MAX_REASON = 120  # a WebSocket close reason holds at most 123 bytes


def is_root(user: User) -> bool:
    """Whether ``user`` is the hub's root: the operator's first-hand ``root`` credential over every workspace."""
    return (
        user.id == "root"
        and user.parent is None
        and not user.is_anonymous
        and user.grants.get("*", Permission.NONE) >= Permission.ADMIN
    )


def require_root(user: User) -> None:
    if not is_root(user):
        raise PermissionDenied("Permission denied: admin-utils serves only the root user")


def check_close(code: object, reason: object) -> tuple[int, str]:
    if not isinstance(code, int) or isinstance(code, bool) or code not in _CLOSE_CODES:
        raise ProtocolError("code must be 1000, 1001, 1008 or from 3000 to 4999")
    if not isinstance(reason, str) or len(reason.encode()) > MAX_REASON:
        raise ProtocolError(f"reason must be a string of at most {MAX_REASON} bytes")
    return code, reason


class AdminHost(Protocol):
    """What the service needs of the hub (:class:`switchboard.hub.hub.Hub`)."""

    replica_id: str
    registry: Registry
    workspaces: WorkspaceStore
    metrics: HubMetrics

    async def replica_ids(self) -> list[str]: ...

    async def kick(self, workspace: str, client_id: str | None, code: int, reason: str) -> None: ...


class AdminUtils:
    """The ``admin-utils`` service's functions (see the module docstring)."""

    def __init__(self, hub: AdminHost) -> None:
        self.hub = hub

    def service(self) -> dict[str, Any]:
        ws: dict[str, Any] = {"workspace": {"type": "string"}}
        user: dict[str, Any] = {"user_id": {"type": "string"}}
        ip: dict[str, Any] = {"ip": {"type": "string"}}
        return {
            "id": "admin-utils",
            "name": "Admin Utilities",
            "description": "The hub's administration, for the root user.",
            "config": {"visibility": "public", "require_context": True},
            "list_servers": (self.list_servers, {}),
            "kickout_client": (
                self.kickout_client,
                {**ws, "client_id": {"type": "string"}, "code": {"type": "integer"}, "reason": {"type": "string"}},
            ),
            "list_workspaces": (self.list_workspaces, {}),
            "unload_workspace": (self.unload_workspace, {**ws, "wait": {"type": "boolean"}, "timeout": {}}),
            "get_metrics": (self.get_metrics, {}),
            "get_resource_usage": (self.get_resource_usage, {}),
            "block_user": (self.block_user, {**user, "duration": {}, "reason": {}}),
            "unblock_user": (self.block_user, user),
            "block_ip": (self.block_ip, {**ip, "duration": {}, "reason": {}}),
            "unblock_ip": (self.block_ip, ip),
            "list_blocked": (self.list_blocked, {}),
        }

    @staticmethod
    def _root() -> None:
        require_root(calling_peer().user)

    async def list_servers(self, context: dict[str, Any] | None = None) -> list[str]:
        """The ids of the hub's live replicas."""
        self._root()
        return await self.hub.replica_ids()

    async def list_workspaces(self, context: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Every workspace record, and the workspaces with clients connected now."""
        self._root()
        found: dict[str, dict[str, Any]] = {ws: {"id": ws, "name": ws, "persistent": True} for ws in _ALWAYS}
        for info in await self.hub.registry.find(ServiceQuery("*", "*", "built-in")):
            ws = info["id"].partition("/")[0]
            found.setdefault(ws, {"id": ws, "name": ws, "persistent": False})
        fields = ("id", "name", "description", "persistent", "owners", "read_only")
        for record in await self.hub.workspaces.records(MAX_LISTED):
            found[record["id"]] = {k: record.get(k) for k in fields}
        return sorted(found.values(), key=lambda r: str(r["id"]))

    async def get_metrics(self, context: dict[str, Any] | None = None) -> dict[str, Any]:
        """This replica's figures: its frames and clients (``rpc``), and its bus (``eventbus``)."""
        self._root()
        m = self.hub.metrics
        figures: dict[str, dict[str, Any]] = {"rpc": {}, "eventbus": {}}
        for family in m.registry.collect():
            part = "eventbus" if any(w in family.name for w in ("bus", "publish", "redis")) else "rpc"
            for sample in family.samples:
                figures[part][sample.name] = sample.value
        return {"replica": self.hub.replica_id, **figures}

    async def get_resource_usage(self, context: dict[str, Any] | None = None) -> dict[str, Any]:
        """What this replica holds: clients, services, frames (as ``get_metrics``)."""
        return await self.get_metrics()

    async def kickout_client(
        self,
        workspace: Any,
        client_id: Any,
        code: Any = 1000,
        reason: Any = "Admin requested disconnect",
        context: dict[str, Any] | None = None,
    ) -> None:
        """Close a client's connection, on whichever replica holds it."""
        self._root()
        ws = ids.check_id(workspace, "workspace")
        cid = ids.check_id(client_id, "client id")
        code, reason = check_close(code, reason)
        if await self.hub.registry.holder(ws, cid) is None:
            raise NotFound(f"Client not connected: {ws}/{cid}")
        await self.hub.kick(ws, cid, code, reason)

    async def unload_workspace(
        self, workspace: Any, wait: Any = False, timeout: Any = 10, context: dict[str, Any] | None = None
    ) -> None:
        """Close every connection of a workspace, on every replica; a non-persistent record goes too
        (as ``cleanup`` removes an empty one), a persistent one stays."""
        self._root()
        ws = ids.check_id(workspace, "workspace")
        await self.hub.kick(ws, None, 1001, f"Workspace unloaded: {ws}")
        record = await self.hub.workspaces.get(ws)
        if record is not None and not record.get("persistent"):
            await self.hub.workspaces.remove(ws)

    async def block_user(self, user_id: Any = None, *_: Any, context: dict[str, Any] | None = None, **__: Any) -> str:
        """Not offered: revoke the user's tokens (``revoke_token``) instead."""
        self._root()
        raise ProtocolError("Blocking users is not offered by Switchboard: revoke the user's tokens (revoke_token)")

    async def block_ip(self, ip: Any = None, *_: Any, context: dict[str, Any] | None = None, **__: Any) -> str:
        """Not offered: block addresses at the proxy or firewall in front of the hub."""
        self._root()
        raise ProtocolError("Blocking addresses is not offered by Switchboard: block them in front of the hub")

    async def list_blocked(self, context: dict[str, Any] | None = None) -> dict[str, Any]:
        """Nothing is blocked by the hub (see block_user)."""
        self._root()
        return {"users": [], "ips": []}

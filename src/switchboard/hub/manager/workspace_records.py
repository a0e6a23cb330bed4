"""Workspaces as records: the manager's methods that create, list, describe and delete them,
and the small data a workspace keeps (environment, service types, bookmarks).

A record names a workspace's owners; an owner holds ``admin`` there (the
gatekeeper grants it at admission, :func:`owns`). Records and their data live
in the :class:`~switchboard.backends.base.WorkspaceStore` every replica shares.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import re
from typing import Any, Protocol

from switchboard.backends.base import Registry, WorkspaceStore
from switchboard.clock import Clock
from switchboard.errors import LimitExceeded, NotFound, PermissionDenied, ProtocolError
from switchboard.hub.identity.credentials import payer
from switchboard.hub.identity.users import Permission, User, user_workspace
from switchboard.hub.manager.data_charges import may_store, refusal_to_store
from switchboard.hub.manager.manager_door import calling_peer
from switchboard.hub.manager.ownership import (
    Naming,
    check_may_create,
    naming_after,
    record_payer,
    workspace_id_in,
)
from switchboard.hub.sessions.peer import Peer
from switchboard.protocol.hypha import ids
from switchboard.protocol.hypha.services import ServiceQuery
from switchboard.protocol.hypha.values import plain

# Hypha's per-user quota (HYPHA_MAX_WORKSPACES_PER_USER): one user cannot fill the store.
MAX_WORKSPACES_PER_USER = 100
# Records read to list or count workspaces: a page is at most 256 (Hypha's bound), and the
# scan stops here so one call costs bounded time whatever the store holds.
MAX_RECORDS_SCANNED = 10_000
# Owners (and invited) one record may name: each is an admin, a list is for a team, not a directory.
MAX_OWNERS = 32
MAX_BOOKMARKS = 256


def owns(user: User, record: dict[str, Any] | None) -> bool:
    """Whether ``user`` is named among the record's owners (by id, or by the email its token carries)."""
    return record is not None and user.named_in(record.get("owners"))


class RecordsHost(Protocol):
    """What the record methods need of the hub (the hub is :class:`switchboard.hub.hub.Hub`)."""

    clock: Clock
    registry: Registry
    workspaces: WorkspaceStore

    async def emit_event(self, workspace: str, event_type: str, data: object) -> None: ...

    async def end_workspace(self, workspace: str) -> None: ...

    async def purge(self, workspace: str, client_id: str, *, owner: str | None = None) -> int: ...


class WorkspaceRecords:
    """The manager's methods about workspace records and workspace data (each checks its caller)."""

    def __init__(self, hub: RecordsHost, *, events: Any, directory: Any, ping: Any, tombstone_ttl: float) -> None:
        self.hub = hub
        # how long a deletion is remembered: as long as the longest-lived token that could grant the
        # workspace (a generated or CLI token, a reconnection token), so none of them re-enters it
        self.tombstone_ttl = tombstone_ttl
        self.store = hub.workspaces
        self.events = events  # EventLog: what a change writes in the workspace's log
        self.directory = directory  # ServiceDirectory: services for summaries and bookmarks
        self.ping = ping  # the manager's ping(client_id, timeout) -> "pong" | why not

    async def permission(self, user: User, workspace: str) -> Permission:
        """The user's permission, with ``admin`` for an owner named in the record (as at admission)."""
        have = user.permission(workspace)
        if have >= Permission.ADMIN:
            return have
        return user.with_ownership(workspace, await self.store.get(workspace)).permission(workspace)

    async def require(self, peer: Peer, workspace: str, need: Permission) -> None:
        if await self.permission(peer.user, workspace) < need:
            raise PermissionDenied(f"Permission denied for workspace {workspace}")

    async def keep(self, workspace: str) -> bool:
        """Whether the workspace's data outlives its TTL (a persistent record)."""
        record = await self.store.get(workspace)
        return bool(record and record.get("persistent"))

    # -- records ----------------------------------------------------------------

    async def create_workspace(
        self, config: Any, overwrite: Any = False, context: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Create (or, ``overwrite``, rewrite) a workspace record; the creator is its owner (:mod:`.ownership`)."""
        peer = calling_peer()
        user = peer.user
        if user.is_anonymous:
            raise PermissionDenied("Only registered user can create workspace.")
        config = plain(config)
        if not isinstance(config, dict):
            raise ProtocolError("create_workspace expects a config object with an 'id' or a 'name'")
        ws = ids.check_id(workspace_id_in(config), "workspace")
        existing = await self.store.get(ws)
        have = Permission.ADMIN if owns(user, existing) else user.permission(ws)
        check_may_create(user, ws, have, new=existing is None)
        if existing is not None and not overwrite:
            raise ProtocolError(f"Workspace already exists: {ws}")
        naming = naming_after(user, _named_owners(config), existing, admin=have >= Permission.ADMIN)
        if existing is None:
            # a workspace in use without a record is its members': only its admin may claim it
            if have < Permission.ADMIN and await self.hub.registry.find(ServiceQuery(ws, "*", "built-in")):
                raise PermissionDenied(f"Workspace {ws} is in use: only its admin can create its record")
            await self._within_quota(user)
        if naming.accepting and existing is not None:
            record = {**existing, "owners": naming.owners, "invited": naming.invited}
        else:
            record = self._record(config, ws, user, existing, naming)
        # a record that appeared since it was read is not overwritten: its creator did not see this call
        if not await self.store.put(record, overwrite=existing is not None):
            raise ProtocolError(f"Workspace already exists: {ws}")
        await self.hub.emit_event(peer.workspace, "workspace_loaded", record)
        if ws != user_workspace(user.id) and refusal_to_store(user, user_workspace(user.id)) is None:
            await self._bookmark(
                user,
                {"bookmark_type": "workspace", "id": ws, "name": record["name"], "description": record["description"]},
            )
        return record

    def _record(
        self, config: dict[str, Any], ws: str, user: User, existing: dict[str, Any] | None, naming: Naming
    ) -> dict[str, Any]:
        text: dict[str, str | None] = {}
        for name in ("name", "description", "icon", "docs"):
            value = config.get(name)
            if value is not None and (not isinstance(value, str) or len(value) > 4096):
                raise ProtocolError(f"{name} must be a string of at most 4096 characters")
            text[name] = value
        created = existing.get("created_at") if existing else None
        return {
            "type": "workspace",
            "id": ws,
            "name": text["name"] or ws,
            "description": text["description"] or "",
            "persistent": bool(config.get("persistent")),
            "owners": naming.owners,
            "invited": naming.invited,
            "created_by": record_payer(existing) if existing else user.accountable,
            "read_only": bool(config.get("read_only")),
            "icon": text["icon"],
            "covers": [],
            "docs": text["docs"],
            "config": {},
            "created_at": created or _iso(self.hub.clock.time()),
            "status": {"ready": True},
        }

    async def _within_quota(self, user: User) -> None:
        """At most :data:`MAX_WORKSPACES_PER_USER` records per accountable principal (the root of a
        token chain: every generated token is a new user id, its maker answers for it)."""
        if "admin" in user.roles:
            return
        principal = user.accountable
        made = sum(record_payer(r) == principal for r in await self.store.records(MAX_RECORDS_SCANNED))
        if made >= MAX_WORKSPACES_PER_USER:
            raise LimitExceeded(
                f"Workspace quota exceeded: user {principal} already created {made} workspaces "
                f"(max {MAX_WORKSPACES_PER_USER}, counting those made with tokens it generated). "
                "Delete unused workspaces before creating new ones."
            )

    async def delete_workspace(self, workspace: Any, context: dict[str, Any] | None = None) -> None:
        """Delete a workspace record and its data; its clients' sessions end."""
        peer = calling_peer()
        ws = ids.check_id(workspace, "workspace")
        record = await self.store.get(ws)
        if record is None:
            if not peer.user.can(ws, Permission.READ):
                raise PermissionDenied(f"Permission denied for workspace {ws}")
            raise NotFound(f"Workspace not found: {ws}")
        if not owns(peer.user, record) and not peer.user.can(ws, Permission.ADMIN):
            raise PermissionDenied(f"Permission denied for workspace {ws}")
        # the tombstone first: if it cannot be written, nothing is deleted (the caller may retry)
        if not ws.startswith("ws-user-"):  # a personal workspace stays its user's: no tombstone locks it out
            await self.store.mark_deleted(ws, self.hub.clock.time(), ttl=self.tombstone_ttl, principal=payer(peer.user))
        await self.store.remove(ws)
        await self.hub.emit_event(peer.workspace, "workspace_deleted", record)
        await self.store.table_set(
            user_workspace(peer.user.id), "bookmarks", ws, None, max_entries=MAX_BOOKMARKS, keep=False, only_new=False
        )
        await self.hub.end_workspace(ws)
        peer.log.info("deleted workspace %s", ws)

    async def list_workspaces(
        self, match: Any = None, offset: Any = 0, limit: Any = 256, context: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        """The workspace records the caller may read (or owns), a page at a time."""
        peer = calling_peer()
        match = plain(match) or {}
        if not isinstance(match, dict):
            raise ProtocolError("match must be an object of field values")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise ProtocolError("Offset number must be greater than or equal to 0")
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 256:
            raise ProtocolError("Limit must be greater than 0 and less than 256")
        seen = [
            r
            for r in await self.store.records(MAX_RECORDS_SCANNED)
            if (peer.user.can(r["id"], Permission.READ) or owns(peer.user, r))
            and all(r.get(k) == v for k, v in match.items())
        ]
        seen.sort(key=lambda r: str(r["id"]))
        fields = ("id", "name", "description", "read_only", "persistent", "owners")
        return [{k: r.get(k) for k in fields} | {"name": r["id"]} for r in seen[offset : offset + limit]]

    async def get_workspace_info(self, workspace: Any = None, context: dict[str, Any] | None = None) -> dict[str, Any]:
        """The workspace's record (owners, persistence, description, creation time)."""
        peer = calling_peer()
        ws = ids.check_id(workspace or peer.workspace, "workspace")
        record = await self.store.get(ws)
        if not (peer.user.can(ws, Permission.READ) or owns(peer.user, record)):
            raise PermissionDenied(f"Permission denied for workspace {ws}")
        info = dict(record) if record else implicit_record(ws)
        info["service_types"] = {k: json.loads(v) for k, v in (await self.store.table(ws, "types")).items()}
        bookmarks = await self.store.table(ws, "bookmarks")
        if bookmarks:
            info["config"] = {**info.get("config", {}), "bookmarks": [json.loads(b) for b in bookmarks.values()]}
        return info

    async def get_summary(self, context: dict[str, Any] | None = None) -> dict[str, Any]:
        """Name, description, clients and services of the caller's workspace."""
        peer = calling_peer()
        ws = peer.workspace
        await self.require(peer, ws, Permission.READ)
        info = await self.store.get(ws) or implicit_record(ws)
        clients = sorted(
            i["id"].rpartition(":")[0] for i in await self.hub.registry.find(ServiceQuery(ws, "*", "built-in"))
        )
        services = await self.directory.list_services()
        fields = ("id", "name", "type", "description", "config")
        return {
            "name": info["name"],
            "description": info["description"],
            "client_count": len(clients),
            "clients": clients,
            "service_count": len(services),
            "services": [{k: s[k] for k in fields if k in s} for s in services],
        }

    async def cleanup(
        self, workspace: Any = None, timeout: Any = 5, context: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Remove the clients that no longer answer a ping; delete an empty non-persistent record."""
        peer = calling_peer()
        ws = ids.check_id(workspace or peer.workspace, "workspace")
        await self.require(peer, ws, Permission.ADMIN)
        record = await self.store.get(ws)
        clients = [i["id"].rpartition(":")[0] for i in await self.hub.registry.find(ServiceQuery(ws, "*", "built-in"))]
        if not clients and record is not None and not record.get("persistent"):
            await self.store.remove(ws)
            await self.hub.emit_event(peer.workspace, "workspace_deleted", record)
            return {"removed_workspace": ws, "removed_clients": []}
        answers = await asyncio.gather(*(self.ping(c, timeout) for c in clients))
        removed = [c for c, answer in zip(clients, answers, strict=True) if answer != "pong"]
        for address in removed:
            await self.hub.purge(ws, address.partition("/")[2])
        return {"removed_clients": removed} if removed else {}

    # -- bookmarks (kept in the caller's personal workspace, as Hypha does) -----------

    async def bookmark(self, item: Any, context: dict[str, Any] | None = None) -> None:
        """Bookmark a workspace or a service in the caller's personal workspace."""
        peer = calling_peer()
        may_store(peer.user, user_workspace(peer.user.id))
        item = plain(item)
        kind, target = _bookmark_item(item)
        if kind == "workspace":
            ws = ids.check_id(target, "workspace")
            record = await self.store.get(ws)
            if record is None or not (peer.user.can(ws, Permission.READ) or owns(peer.user, record)):
                raise NotFound(f"Workspace not found: {ws}")
            mark = {"bookmark_type": kind, "id": ws, "name": record["name"], "description": record["description"]}
        else:
            info = await self.directory.get_service_info(target)  # one the caller may see
            mark = {"bookmark_type": kind, "id": info["id"]}  # a reference: the service's info is not copied
        await self._bookmark(peer.user, mark)

    async def _bookmark(self, user: User, mark: dict[str, Any]) -> None:
        ws = user_workspace(user.id)
        if not await self.store.table_set(
            ws,
            "bookmarks",
            mark["id"],
            json.dumps(mark),
            max_entries=MAX_BOOKMARKS,
            keep=await self.keep(ws),
            only_new=False,
        ):
            raise LimitExceeded(f"Too many bookmarks: at most {MAX_BOOKMARKS}; remove some first")

    async def unbookmark(self, item: Any, context: dict[str, Any] | None = None) -> None:
        """Remove a bookmark from the caller's personal workspace."""
        peer = calling_peer()
        _, target = _bookmark_item(plain(item))
        await self.store.table_set(
            user_workspace(peer.user.id),
            "bookmarks",
            target,
            None,
            max_entries=MAX_BOOKMARKS,
            keep=False,
            only_new=False,
        )


def _named_owners(config: dict[str, Any]) -> list[str] | None:
    """The ``owners`` a config names, checked (``None``: it names none, so they stay as they are)."""
    owners = config.get("owners")
    if owners is None:
        return None
    if not isinstance(owners, list) or len(owners) > MAX_OWNERS or not all(_owner_ok(o) for o in owners):
        raise ProtocolError(
            f"owners must be a list of at most {MAX_OWNERS} user ids ({ids.GRAMMAR}) or email addresses"
        )
    return [o.strip() for o in owners]


def _owner_ok(owner: object) -> bool:
    if not isinstance(owner, str):
        return False
    owner = owner.strip()
    if ids.is_id(owner):
        return True
    local, at, domain = owner.partition("@")
    return bool(at and local and "." in domain and len(owner) <= 254 and not re.search(r"\s", owner))


def _bookmark_item(item: Any) -> tuple[str, str]:
    if not isinstance(item, dict) or item.get("bookmark_type") not in ("workspace", "service"):
        raise ProtocolError("Bookmark type must be provided: 'workspace' or 'service'")
    target = item.get("id")
    if not isinstance(target, str) or not 0 < len(target) <= 512:
        raise ProtocolError("a bookmark needs the 'id' of its workspace or service")
    return str(item["bookmark_type"]), target


def json_text(value: Any, what: str, limit: int) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        raise ProtocolError(f"{what} must be JSON data (strings, numbers, lists, objects)") from None
    if len(text.encode()) > limit:
        raise LimitExceeded(f"{what} too large: at most {limit} bytes as JSON")
    return text


def implicit_record(ws: str) -> dict[str, Any]:
    """What a workspace nobody created is: it exists while it is used, owned by nobody."""
    personal = ws.removeprefix("ws-user-") if ws.startswith("ws-user-") else None
    return {
        "type": "workspace",
        "id": ws,
        "name": ws,
        "description": "",
        "persistent": False,
        "owners": [personal] if personal else [],
        "read_only": False,
        "icon": None,
        "covers": [],
        "docs": None,
        "config": {},
        "created_at": None,
        "status": {"ready": True},
    }


def _iso(epoch: float) -> str:
    """Naive UTC ISO time, as Hypha writes its timestamps."""
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).replace(tzinfo=None).isoformat()

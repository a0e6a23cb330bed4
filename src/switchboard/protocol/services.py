"""Service ids, partial-id resolution and visibility (protocol §5), as pure functions."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from switchboard.errors import PermissionDenied, ProtocolError
from switchboard.protocol import ids

ServiceInfo = dict[str, Any]

VISIBILITIES = ("protected", "public", "unlisted")


@dataclass(frozen=True, slots=True)
class ServiceQuery:
    """A possibly partial service id; ``*`` matches anything."""

    workspace: str
    client_id: str = "*"
    service_id: str = "*"
    app_id: str = "*"

    def __str__(self) -> str:
        return f"{self.workspace}/{self.client_id}:{self.service_id}@{self.app_id}"


def full_id(workspace: str, client_id: str, service_id: str) -> str:
    return f"{workspace}/{client_id}:{service_id}"


def split_full_id(full: str) -> tuple[str, str, str]:
    """``ws/cid:svc[@app]`` → ``(ws, cid, svc)``, each in the id grammar (§5.1)."""
    ws, slash, rest = full.partition("/")
    cid, colon, svc = rest.partition(":")
    svc = svc.partition("@")[0]
    if not (slash and colon) or not ((ws == "*" or ids.is_id(ws)) and ids.is_id(cid) and ids.is_id(svc)):
        raise ProtocolError(
            f"invalid service id {full[:200]!r}: expected '<workspace>/<client>:<service>', ids of {ids.GRAMMAR}"
        )
    return ws, cid, svc


def _part(value: str, what: str) -> str:
    """A part of a service query: ``*`` (any) or an id."""
    return value if value == "*" else ids.check_id(value, what)


def parse_query(text: str, default_workspace: str) -> ServiceQuery:
    """Resolve the id forms ``get_service`` accepts (protocol §5.2)."""
    if not isinstance(text, str) or not text:
        raise ProtocolError("service id must be a non-empty string")
    original = text
    app = "*"
    if "@" in text:
        text, _, app = text.partition("@")
        app = app or "*"
    ws = default_workspace
    if "/" in text:
        ws, _, text = text.partition("/")
        if not ws or "/" in text:
            raise ProtocolError(f"invalid service id {original!r}")
    cid = "*"
    if ":" in text:
        cid, _, text = text.partition(":")
        cid = cid or "*"
    if not text or ":" in text:
        raise ProtocolError(f"invalid service id {original[:200]!r}: no service name")
    return ServiceQuery(
        _part(ws, "workspace"), _part(cid, "client id"), _part(text, "service id"), _part(app, "app id")
    )


def matches(info: ServiceInfo, query: ServiceQuery) -> bool:
    ws, cid, svc = split_full_id(info["id"])
    return (
        (query.workspace in ("*", ws))
        and (query.client_id in ("*", cid))
        and (query.service_id in ("*", svc))
        and (query.app_id in ("*", info.get("app_id", "*")))
    )


def visibility(info: ServiceInfo) -> str:
    vis = (info.get("config") or {}).get("visibility", "protected")
    return vis if vis in VISIBILITIES else "protected"


def may_use(info: ServiceInfo, *, caller_workspace: str, has_read: bool) -> bool:
    """May a caller in ``caller_workspace`` get or call this service by id?"""
    if visibility(info) in ("public", "unlisted"):
        return True
    if has_read:
        return True
    authorized = (info.get("config") or {}).get("authorized_workspaces") or []
    return caller_workspace in authorized


def may_list(info: ServiceInfo, *, caller_workspace: str, has_read: bool, include_unlisted: bool) -> bool:
    """Listings show less than ids reach: unlisted only on request, in one's own workspace.

    A client's ``built-in`` service only says that the client is there (its
    presence, which ``list_clients`` shows with ``read`` on the workspace): it
    is listed to readers alone, whatever visibility the client gave it.
    """
    vis = visibility(info)
    own = info["id"].startswith(caller_workspace + "/")
    if info["id"].endswith(":built-in"):
        return has_read
    if vis == "public":
        return True
    if vis == "unlisted":
        return include_unlisted and own
    return has_read or caller_workspace in ((info.get("config") or {}).get("authorized_workspaces") or [])


def check_use(info: ServiceInfo, *, caller_workspace: str, has_read: bool) -> None:
    if not may_use(info, caller_workspace=caller_workspace, has_read=has_read):
        ws = info["id"].partition("/")[0]
        raise PermissionDenied(f"Permission denied for non-public service in workspace {ws}")


def prepare_registration(service: Any, *, workspace: str, client_id: str, user_wire: dict[str, Any]) -> ServiceInfo:
    """Normalise what ``register_service`` received into the stored service info."""
    if not isinstance(service, dict):
        raise ProtocolError("register_service expects a service info object")
    try:
        info = copy.deepcopy(service)
    except RecursionError:
        raise ProtocolError("service info is nested too deeply") from None
    raw_id = info.get("id")
    if not isinstance(raw_id, str) or not raw_id:
        raise ProtocolError("service info has no 'id'")
    if "/" in raw_id:
        ws, cid, svc = split_full_id(raw_id)
        if ws != workspace:
            raise PermissionDenied(f"Permission denied: service {raw_id} is not in your workspace {workspace}")
        if cid != client_id:
            raise PermissionDenied(f"Permission denied: service {raw_id} belongs to another client than {client_id}")
    else:
        svc = raw_id.rpartition(":")[2] if ":" in raw_id else raw_id
    svc = svc.partition("@")[0]
    if not ids.is_id(svc):
        raise ProtocolError(f"invalid service id {raw_id[:200]!r}: service names are {ids.GRAMMAR}")
    app_id = info.get("app_id") or "*"
    if app_id != "*" and not ids.is_id(app_id):
        raise ProtocolError(f"invalid app_id {str(app_id)[:64]!r}: use {ids.GRAMMAR}")
    config = info.get("config")
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise ProtocolError("service 'config' must be an object")
    vis = config.get("visibility", "protected")
    if vis not in VISIBILITIES:
        raise ProtocolError(f"invalid visibility {vis!r}: use one of {', '.join(VISIBILITIES)}")
    config.setdefault("visibility", "protected")
    config.setdefault("require_context", False)
    config.setdefault("flags", [])
    config.setdefault("singleton", False)
    config.setdefault("authorized_workspaces", None)
    config["workspace"] = workspace
    config["created_by"] = user_wire if svc == "built-in" else {"id": user_wire["id"]}
    info["config"] = config
    info["id"] = full_id(workspace, client_id, svc)
    info.setdefault("name", svc)
    info.setdefault("type", "generic")
    info.setdefault("description", None)
    info.setdefault("docs", None)
    info["app_id"] = app_id
    return info


_LIST_KEYS = {"workspace", "client_id", "service_id", "id", "type", "visibility", "app_id"}


def list_query(query: Any, workspace: str) -> tuple[ServiceQuery, dict[str, Any]]:
    """The registry query and the extra field filters of a ``list_services`` call."""
    if query is None:
        return ServiceQuery(workspace), {}
    if isinstance(query, str):
        if "/" not in query and ":" not in query:
            return ServiceQuery(_part(query, "workspace")), {}
        q = parse_query(query, workspace)
        return q, ({"visibility": "public"} if q.workspace == "*" else {})
    if isinstance(query, dict):
        unknown = set(query) - _LIST_KEYS
        if unknown:
            raise ProtocolError(f"Unknown list_services keys: {', '.join(sorted(unknown))}")
        parts = (
            query.get("workspace") or workspace,
            query.get("client_id") or "*",
            query.get("service_id") or query.get("id") or "*",
            query.get("app_id") or "*",
        )
        if not all(isinstance(p, str) for p in parts):
            raise ProtocolError("list_services query values must be strings")
        q = ServiceQuery(
            _part(parts[0], "workspace"),
            _part(parts[1], "client id"),
            _part(parts[2], "service id"),
            _part(parts[3], "app id"),
        )
        filters = {k: query[k] for k in ("type", "visibility") if query.get(k) not in (None, "*")}
        return q, filters
    raise ProtocolError("list_services query must be null, a string or an object")


def field_of(info: ServiceInfo, key: str) -> Any:
    return visibility(info) if key == "visibility" else info.get(key)

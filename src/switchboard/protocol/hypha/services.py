"""Service ids, partial-id resolution and visibility (protocol §5), as pure functions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from switchboard.errors import PermissionDenied, ProtocolError
from switchboard.protocol.hypha import ids
from switchboard.protocol.hypha.values import plain

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


def _glob_part(value: str, what: str) -> str:
    """A part of a listing query: an id in which ``*`` stands for any run of characters (Hypha's
    Redis glob; ``?`` and ``[`` are not id characters, so ``*`` is the only wildcard)."""
    if "*" not in value:
        return ids.check_id(value, what)
    for piece in value.split("*"):
        if piece and not ids.is_id(piece):
            raise ProtocolError(f"invalid {what} pattern {value[:64]!r}: use {ids.GRAMMAR}, and '*' for any run")
    if len(value) > 2 * ids.MAX_ID_LENGTH:
        raise ProtocolError(f"invalid {what} pattern {value[:64]!r}: too long")
    return value


def glob_match(pattern: str, value: str) -> bool:
    """Does ``value`` match ``pattern``, where ``*`` is any run of characters?

    Linear in the length of both: the pieces between stars are found left to
    right (the first must start ``value``, the last must end it), so a
    pattern with many stars cannot make the matching backtrack.
    """
    if "*" not in pattern:
        return pattern == value
    pieces = pattern.split("*")
    head, tail = pieces[0], pieces[-1]
    if len(head) + len(tail) > len(value) or not value.startswith(head) or not value.endswith(tail):
        return False
    at, end = len(head), len(value) - len(tail)
    for piece in pieces[1:-1]:
        found = value.find(piece, at, end)
        if found < 0:
            return False
        at = found + len(piece)
    return True


def parse_query(text: str, default_workspace: str, *, globs: bool = False) -> ServiceQuery:
    """Resolve the id forms ``get_service`` accepts (protocol §5.2); with ``globs``, those of a
    listing, whose parts may hold ``*`` (:func:`glob_match`)."""
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
    part = _glob_part if globs else _part
    return ServiceQuery(part(ws, "workspace"), part(cid, "client id"), part(text, "service id"), part(app, "app id"))


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


def is_presence(info: ServiceInfo) -> bool:
    """Is this a client's ``built-in`` service: its presence in its workspace (who it is, its user)?"""
    return str(info["id"]).endswith(":built-in")


def may_use(info: ServiceInfo, *, caller_workspace: str, has_read: bool) -> bool:
    """May a caller in ``caller_workspace`` get or call this service by id?

    A client's ``built-in`` service is its presence, whatever visibility the
    client gave it: only a reader of its workspace (who may list its clients)
    finds it, by any id or mode.
    """
    if is_presence(info):
        return has_read
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
    if is_presence(info):
        return has_read
    if vis == "public":
        return True
    if vis == "unlisted":
        return include_unlisted and own
    return has_read or caller_workspace in ((info.get("config") or {}).get("authorized_workspaces") or [])


def shown(info: ServiceInfo, *, has_read: bool) -> ServiceInfo:
    """``info`` as a caller sees it: ``config.authorized_workspaces`` only within the service's
    workspace (``has_read`` there), as in Hypha; a workspace the list admits does not learn the others."""
    config = info.get("config")
    if has_read or not isinstance(config, dict) or "authorized_workspaces" not in config:
        return info
    return {**info, "config": without_authorized(config)}


def without_authorized(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of a service's ``config`` without its ``authorized_workspaces``."""
    return {k: v for k, v in config.items() if k != "authorized_workspaces"}


def check_use(info: ServiceInfo, *, caller_workspace: str, has_read: bool) -> None:
    if not may_use(info, caller_workspace=caller_workspace, has_read=has_read):
        ws = info["id"].partition("/")[0]
        raise PermissionDenied(f"Permission denied for non-public service in workspace {ws}")


def plain_copy(service: Any) -> Any:
    """A copy of every dict and list (what msgpack decodes), faster than deepcopy."""
    try:
        return plain(service)
    except RecursionError:
        raise ProtocolError("service info is nested too deeply") from None


def prepare_registration(
    service: Any, *, workspace: str, client_id: str, user_wire: dict[str, Any], copy: bool = True
) -> ServiceInfo:
    """Normalise what ``register_service`` received into the stored service info.

    ``copy=False``: ``service`` is already a copy of its own (:func:`plain`'s), changed in place.
    """
    if not isinstance(service, dict):
        raise ProtocolError("register_service expects a service info object")
    info: ServiceInfo = plain_copy(service) if copy else service
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


@dataclass(frozen=True, slots=True)
class Listing:
    """A ``list_services`` query: ``lookup`` for the registry (a part holding a pattern is
    widened to ``*``), ``patterns`` for each field a service must match (``*`` = any)."""

    lookup: ServiceQuery
    patterns: dict[str, str]

    def admits(self, info: ServiceInfo) -> bool:
        ws, cid, svc = split_full_id(info["id"])
        fields = {
            "workspace": ws,
            "client_id": cid,
            "service_id": svc,
            "app_id": str(info.get("app_id") or "*"),
            "type": str(info.get("type") or ""),
            "visibility": visibility(info),
        }
        return all(glob_match(p, fields[k]) for k, p in self.patterns.items())


def _listing(query: ServiceQuery, **extra: str) -> Listing:
    parts = {
        "workspace": query.workspace,
        "client_id": query.client_id,
        "service_id": query.service_id,
        "app_id": query.app_id,
        **extra,
    }
    patterns = {k: v for k, v in parts.items() if v != "*"}
    wide = {k: ("*" if "*" in v else v) for k, v in parts.items() if k in ("workspace", "client_id", "service_id")}
    lookup = ServiceQuery(wide["workspace"], wide["client_id"], wide["service_id"], "*")
    return Listing(lookup, patterns)


def list_query(query: Any, workspace: str) -> Listing:
    """The registry query and the field patterns of a ``list_services`` call.

    Each value may hold ``*`` for any run of characters, as in Hypha
    (``{"service_id": "calc*"}``, ``"ws-*/*:echo"``).
    """
    if query is None:
        return _listing(ServiceQuery(workspace))
    if isinstance(query, str):
        if "/" not in query and ":" not in query:
            return _listing(ServiceQuery(_glob_part(query, "workspace")))
        q = parse_query(query, workspace, globs=True)
        return _listing(q, **({"visibility": "public"} if q.workspace == "*" else {}))
    if isinstance(query, dict):
        unknown = set(query) - _LIST_KEYS
        if unknown:
            raise ProtocolError(f"Unknown list_services keys: {', '.join(sorted(unknown))}")
        if query.get("id") not in (None, "*") and query.get("service_id") not in (None, "*"):
            raise ProtocolError("Cannot specify both 'id' and 'service_id' in the query.")
        values = {
            "workspace": query.get("workspace") or workspace,
            "client_id": query.get("client_id") or "*",
            "service_id": query.get("service_id") or query.get("id") or "*",
            "app_id": query.get("app_id") or "*",
            "type": query.get("type") or "*",
            "visibility": query.get("visibility") or "*",
        }
        if not all(isinstance(v, str) for v in values.values()):
            raise ProtocolError("list_services query values must be strings")
        service, at, app = values["service_id"].partition("@")
        if at:
            if values["app_id"] not in ("*", app):
                raise ProtocolError(f"App id mismatch: {values['app_id'][:64]} != {app[:64]}")
            values["service_id"], values["app_id"] = service, app or "*"
        for key, what in (("workspace", "workspace"), ("client_id", "client id"), ("service_id", "service id")):
            values[key] = _glob_part(values[key], what)
        for key in ("app_id", "type", "visibility"):
            if values[key] != "*":
                values[key] = _glob_part(values[key], key.replace("_", " "))
        q = ServiceQuery(values["workspace"], values["client_id"], values["service_id"], values["app_id"])
        return _listing(q, type=values["type"], visibility=values["visibility"])
    raise ProtocolError("list_services query must be null, a string or an object")


def check_include_unlisted(listing: Listing, caller_workspace: str) -> None:
    """Refuse a listing that asks for unlisted services where it may not have them, as Hypha does.

    Unlisted services are listed only in the caller's own workspace; asking for
    them in another workspace, or in every one, is refused rather than filtered,
    so the caller learns it asked for what it may not have. ``public`` is
    filtered, not refused, as in Hypha.
    """
    ws = listing.patterns.get("workspace", "*")
    if ws == "*":
        raise PermissionDenied("Cannot include unlisted services when searching all workspaces.")
    if ws not in (caller_workspace, "public"):
        raise PermissionDenied(
            f"Cannot include unlisted services from workspace {ws}. "
            f"Only services from your current workspace ({caller_workspace}) can include unlisted services."
        )


def check_listing_everywhere(listing: Listing) -> None:
    """Refuse, as Hypha does, a search of every workspace for protected or unlisted services: such a
    search answers public services only, so the caller learns it asked for what it cannot have there."""
    if listing.patterns.get("workspace", "*") == "*" and listing.patterns.get("visibility") in (
        "protected",
        "unlisted",
    ):
        raise ProtocolError("Cannot list protected or unlisted services in all workspaces.")

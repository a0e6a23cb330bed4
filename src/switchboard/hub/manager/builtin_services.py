"""The hub's built-in services besides the manager's ``default``: where each lives, and how it is found.

They are services of the manager's own RPC, as ``default`` is: a caller's
calls go to the manager of its replica, which acts for that caller alone
(:mod:`~switchboard.hub.manager.manager_door`) and checks its rights in each
function. They are not in the registry (every replica serves them, and no
client could withdraw or replace them): ``get_service`` and
``get_service_info`` find them here first, by the ids Hypha gives them:

* ``public/queue`` (:mod:`~switchboard.hub.manager.task_queue`), public;
* ``public/hypha-login`` (:mod:`~switchboard.hub.manager.login_service`), public;
* ``ws-user-root/admin-utils`` (:mod:`~switchboard.hub.manager.admin_utils`),
  for the root user alone, who reaches it as ``admin-utils`` from its own workspace.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from hypha_rpc import RPC
from hypha_rpc.utils.schema import schema_function

from switchboard.errors import PermissionDenied, ProtocolError
from switchboard.hub.identity.users import User
from switchboard.hub.manager.admin_utils import ROOT_WORKSPACE, is_root
from switchboard.protocol.hypha import services as svc_ids
from switchboard.protocol.hypha.services import ServiceInfo

# (workspace, service name) -> the id of the manager's local service
BUILT_IN: Mapping[tuple[str, str], str] = MappingProxyType(
    {
        ("public", "queue"): "queue",
        ("public", "hypha-login"): "hypha-login",
        (ROOT_WORKSPACE, "admin-utils"): "admin-utils",
    }
)


def schema_service(spec: dict[str, Any]) -> dict[str, Any]:
    """A service to register: each ``(function, parameters)`` of ``spec`` becomes a schema function
    described by the first line of its docstring; the other entries are kept as they are."""
    service: dict[str, Any] = {}
    for key, value in spec.items():
        if isinstance(value, tuple):
            fn, props = value
            doc = (fn.__doc__ or key).strip().splitlines()[0]
            value = schema_function(fn, name=key, description=doc, parameters={"type": "object", "properties": props})
        service[key] = value
    return service


class BuiltIns:
    def __init__(self, manager_id: str, manager_address: str, *, rpc: Callable[[], RPC | None]) -> None:
        self.manager_id = manager_id
        self.manager_address = manager_address
        self._rpc = rpc

    def named(self, service_id: Any, workspace: str, user: User) -> tuple[str, str] | None:
        """The built-in ``(workspace, name)`` that ``service_id`` names for ``user``, a caller in ``workspace``,
        if any; :class:`PermissionDenied` if it names ``admin-utils`` and ``user`` is not root (a protected
        service of another workspace, as Hypha refuses it)."""
        key = self._named(service_id, workspace)
        if key is not None and key[0] == ROOT_WORKSPACE and not is_root(user):
            raise PermissionDenied(f"Permission denied for non-public service in workspace {ROOT_WORKSPACE}")
        return key

    def _named(self, service_id: Any, workspace: str) -> tuple[str, str] | None:
        if not isinstance(service_id, str):
            return None
        try:
            query = svc_ids.parse_query(service_id, workspace)
        except ProtocolError:
            return None
        key = (query.workspace, query.service_id)
        if key in BUILT_IN and query.client_id in ("*", self.manager_id) and query.app_id == "*":
            return key
        return None

    def listed(self, user: User) -> list[ServiceInfo]:
        """The built-in services ``user`` may see in a listing: the public ones; ``admin-utils`` for root."""
        return [self.info(key) for key in BUILT_IN if key[0] != ROOT_WORKSPACE or is_root(user)]

    def _local(self, key: tuple[str, str]) -> dict[str, Any]:
        rpc = self._rpc()
        assert rpc is not None
        service: dict[str, Any] = rpc.get_local_service(BUILT_IN[key], context={"to": self.manager_address, "ws": "*"})
        return service

    def info(self, key: tuple[str, str]) -> ServiceInfo:
        """What ``get_service_info`` answers for a built-in service."""
        service = self._local(key)
        ws, name = key
        return {
            "id": svc_ids.full_id(ws, self.manager_id, name),
            "name": service.get("name"),
            "type": "generic",
            "description": service.get("description"),
            "config": {
                **dict.get(service, "config", {}),
                "workspace": ws,
                # admin-utils is shown as Hypha shows it: a protected service of the root user's workspace
                **({"visibility": "protected"} if ws == ROOT_WORKSPACE else {}),
            },
            "app_id": "*",
            "service_schema": {k: v.__schema__ for k, v in service.items() if callable(v) and hasattr(v, "__schema__")},
        }

    def service(self, key: tuple[str, str], public_base_url: str) -> dict[str, Any]:
        """What ``get_service`` answers: the local service (its functions call this replica's manager),
        addressed as the built-in's id; the registered service itself is left unchanged."""
        ws, name = key
        service = dict(self._local(key))
        service["id"] = svc_ids.full_id(ws, self.manager_id, name)
        service["config"] = {
            **dict.get(service, "config", {}),
            "workspace": ws,
            "url": f"{public_base_url}/{ws}/services/{name}",
        }
        return service

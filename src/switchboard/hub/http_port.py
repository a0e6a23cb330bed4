"""The HTTP layer's port to the hub: who a caller is, where it may go, and the manager's services.

The server's HTTP routes (``server/http/``) are handed this, not the hub's
parts: they verify a token, check ownership and deletion as an admission
does, act for a caller through the manager's RPC, look services up and fetch
them, and call the manager's functions. The sign-in page keeps its own
service (:class:`~switchboard.hub.manager.login_service.LoginService`) and
a few routes read workspace records (``workspaces``). Built by
:mod:`switchboard.hub.assemble`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from switchboard.backends.base import Registry, WorkspaceStore
from switchboard.hub.gate.admission import Gatekeeper
from switchboard.hub.identity.credentials import Credentials
from switchboard.hub.identity.users import User
from switchboard.hub.manager.acting import Acting
from switchboard.hub.manager.login_service import LoginService
from switchboard.hub.manager.manager import WorkspaceManager
from switchboard.hub.manager.service_directory import Charge
from switchboard.hub.manager_port import ManagerPort
from switchboard.hub.routing.limits import Allowance
from switchboard.hub.sessions.peer import Peer
from switchboard.protocol.hypha.services import ServiceInfo, ServiceQuery

Methods = dict[str, tuple[Callable[..., Any], dict[str, Any]]]


class HttpPort:
    """What the HTTP routes use of the hub (see the module docstring)."""

    def __init__(
        self,
        *,
        credentials: Credentials,
        gate: Gatekeeper,
        registry: Registry,
        workspaces: WorkspaceStore,
        manager: WorkspaceManager,
        for_manager: ManagerPort,
        registered: Callable[[], int],
    ) -> None:
        self._credentials = credentials
        self._gate = gate
        self._registry = registry
        self._manager = manager
        self._for_manager = for_manager
        self._registered = registered
        self.workspaces = workspaces  # workspace records, for the routes that read them
        self.login: LoginService = manager.login  # public/hypha-login, for the sign-in page

    async def verify(self, token: object) -> User:
        """The user ``token`` stands for, or :class:`~switchboard.errors.AuthError` (a 401)."""
        return await self._credentials.verify(token)

    async def as_owner(self, user: User, workspace: str) -> User:
        """``user`` as it stands in ``workspace``: its admin if the record names it an owner."""
        return await self._gate.as_owner(user, workspace)

    async def deletion(self, user: User, workspace: str) -> str | None:
        """Why ``user`` may not enter ``workspace`` because it was deleted, if so."""
        return await self._gate.deletion(user, workspace)

    def acting_as(self, user: dict[str, Any], workspace: str) -> contextlib.AbstractAsyncContextManager[Acting]:
        """Calls the manager's RPC makes inside the block carry the HTTP caller's identity."""
        return self._for_manager.acting_as(user, workspace)

    def charging(self, caller: Peer, allowance: Allowance) -> contextlib.AbstractContextManager[None]:
        """Within the block, the ``select:`` lookups ``caller`` makes are calls of ``allowance``'s principal."""
        return self._manager.directory.charging(caller, allowance)

    def registered_services(self) -> int:
        """How many services the clients connected here have announced."""
        return self._registered()

    async def find(self, query: ServiceQuery) -> list[ServiceInfo]:
        """The registered services ``query`` matches, on every replica."""
        return await self._registry.find(query)

    def manager_info(self) -> ServiceInfo:
        """The workspace manager's own service, as ``get_service_info("~")`` answers it."""
        return self._manager.directory.manager_info()

    def built_in(self, service_id: Any, workspace: str, user: User) -> tuple[str, str] | None:
        """The built-in service ``service_id`` names for ``user`` in ``workspace``, if any."""
        return self._manager.builtins.named(service_id, workspace, user)

    def built_in_info(self, key: tuple[str, str]) -> ServiceInfo:
        return self._manager.builtins.info(key)

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
        """The single service ``service_id`` names for a caller, chosen by ``mode`` among several."""
        return await self._manager.directory.resolve(
            service_id, workspace=workspace, user=user, mode=mode, select_timeout=select_timeout, charge=charge
        )

    async def fetch_service(self, info: ServiceInfo, *, timeout: float, has_read: bool) -> Any:
        """The provider's service object, addressed for a caller (its functions called through the manager)."""
        return await self._manager.directory.fetch_service(info, timeout=timeout, has_read=has_read)

    def methods(self) -> Methods:
        """The ``default`` service's functions by name, with their parameters' schema."""
        return self._manager.methods()

    def built_in_methods(self, key: tuple[str, str]) -> Methods:
        """The functions of the built-in service ``key``, by name."""
        return self._manager.built_in_methods(key)

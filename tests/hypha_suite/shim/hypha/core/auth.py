"""Hypha's token helpers as its tests call them, minting the same claims with Switchboard's
issuer and the secret of the hubs ``scripts/hypha-suite`` started (``SWITCHBOARD_JWT_SECRET``)."""

from __future__ import annotations

import os

from hypha.core import ScopeInfo, UserInfo, UserPermission
from switchboard.clock import SystemClock
from switchboard.hub.identity.auth import TokenIssuer
from switchboard.hub.identity.users import Permission, User

# Hypha's tests assign it; Switchboard's issuer reads the hubs' secret instead
JWT_SECRET = os.environ.get("JWT_SECRET", "")


def create_scope(
    workspaces: str | dict[str, UserPermission | str] | None = None,
    client_id: str | None = None,
    current_workspace: str | None = None,
    extra_scopes: list[str] | None = None,
) -> ScopeInfo:
    """A scope from ``{workspace: permission}`` or Hypha's short form ``"ws#rw,other#r"``."""
    if isinstance(workspaces, str):
        pairs = [entry.split("#") for entry in workspaces.split(",")]
        grants = {ws: UserPermission(code) for ws, code in pairs}
    else:
        grants = {ws: UserPermission(p) for ws, p in (workspaces or {}).items()}
    return ScopeInfo(
        current_workspace=current_workspace, workspaces=grants, client_id=client_id, extra_scopes=extra_scopes
    )


def switchboard_user(user_info: UserInfo) -> tuple[User, str]:
    """The Switchboard user ``user_info`` describes, and the workspace its token is for."""
    scope = user_info.scope or ScopeInfo()
    grants = {ws: Permission.parse(UserPermission(p).value) for ws, p in scope.workspaces.items()}
    roles = list(user_info.roles) + (["anonymous"] if user_info.is_anonymous else [])
    user = User(
        id=user_info.id,
        roles=tuple(roles),
        grants=grants,
        email=user_info.email,
        parent=user_info.parent,
        extra_scopes=tuple(scope.extra_scopes or ()),
    )
    return user, scope.current_workspace or user_info.current_workspace or f"ws-user-{user_info.id}"


async def generate_auth_token(user_info: UserInfo, expires_in: float) -> str:
    user, workspace = switchboard_user(user_info)
    issuer = TokenIssuer(secret=os.environ["SWITCHBOARD_JWT_SECRET"], clock=SystemClock())
    scope = user_info.scope or ScopeInfo()
    return issuer.issue(
        user,
        workspace=workspace,
        permission=user.grants.get(workspace, Permission.NONE),
        expires_in=expires_in,
        client_id=scope.client_id,
    )

"""Hypha's token helpers as its tests call them, minting the same claims with Switchboard's
issuer and the secret of the hubs ``scripts/hypha-suite`` started (``SWITCHBOARD_JWT_SECRET``)."""

from __future__ import annotations

import os

import jwt

from hypha.core import ScopeInfo, UserInfo, UserPermission
from switchboard.clock import SystemClock
from switchboard.hub.identity.auth import AUDIENCE, ISSUER, TokenIssuer
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


def switchboard_user(user_info: UserInfo) -> tuple[User, str | None]:
    """The Switchboard user ``user_info`` describes, and the workspace its token names (if any)."""
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
    return user, scope.current_workspace or user_info.current_workspace


async def generate_auth_token(user_info: UserInfo, expires_in: float) -> str:
    """A token with the claims Hypha's helper would give ``user_info``, signed by Switchboard's issuer.

    Hypha's tests mint their users' tokens without a current workspace (the user picks one at
    connect); Switchboard's issuer always names one, so for those the ``wid:`` entry is taken out
    of the scope it signed and the claims are signed again with the same secret.
    """
    user, workspace = switchboard_user(user_info)
    secret = os.environ["SWITCHBOARD_JWT_SECRET"]
    issuer = TokenIssuer(secret=secret, clock=SystemClock())
    named = workspace or f"ws-user-{user.id}"
    token = issuer.issue(
        user,
        workspace=named,
        permission=user.grants.get(named, Permission.NONE),
        expires_in=expires_in,
        client_id=(user_info.scope or ScopeInfo()).client_id,
    )
    if workspace is not None:
        return token
    claims = jwt.decode(token, secret, algorithms=["HS256"], audience=AUDIENCE, issuer=ISSUER)
    claims["scope"] = " ".join(part for part in claims["scope"].split(" ") if not part.startswith("wid:"))
    return jwt.encode(claims, secret, algorithm="HS256")

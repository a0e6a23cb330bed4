"""The names Hypha's tests import from ``hypha.core``: the values they build (users and
scopes for the token helpers of :mod:`hypha.core.auth`, a service config), and placeholders
for server classes."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

from hypha import internal


class UserPermission(enum.StrEnum):
    read = "r"
    read_write = "rw"
    admin = "a"


class VisibilityEnum(enum.StrEnum):
    public = "public"
    protected = "protected"
    unlisted = "unlisted"


@dataclass
class ScopeInfo:
    current_workspace: str | None = None
    workspaces: dict[str, UserPermission] = field(default_factory=dict)
    client_id: str | None = None
    extra_scopes: list[str] | None = None


@dataclass
class UserInfo:
    id: str
    roles: list[str]
    is_anonymous: bool
    scope: ScopeInfo | None = None
    email: str | None = None
    parent: str | None = None
    expires_at: float | None = None
    current_workspace: str | None = None

    def get_workspace(self) -> str:
        return f"ws-user-{self.id}"

    def model_copy(self, **kwargs: Any) -> UserInfo:
        return dataclasses.replace(self)


@dataclass
class ServiceConfig:
    """A service's ``config`` as the tests build it (the fields they set)."""

    visibility: VisibilityEnum = VisibilityEnum.protected
    require_context: bool = False
    authorized_workspaces: list[str] | None = None


RedisRPCConnection = internal("hypha.core.RedisRPCConnection")

from hypha.core import auth  # noqa: E402  (it imports the values above)

__all__ = ["RedisRPCConnection", "ScopeInfo", "ServiceConfig", "UserInfo", "UserPermission", "VisibilityEnum", "auth"]

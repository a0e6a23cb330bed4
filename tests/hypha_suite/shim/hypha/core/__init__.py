"""The names Hypha's tests import from ``hypha.core``: the user and scope values the
token helpers take (:mod:`hypha.core.auth`), and placeholders for server classes."""

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


RedisRPCConnection = internal("hypha.core.RedisRPCConnection")
ServiceConfig = internal("hypha.core.ServiceConfig")

from hypha.core import auth  # noqa: E402  (it imports the values above)

__all__ = ["RedisRPCConnection", "ScopeInfo", "ServiceConfig", "UserInfo", "UserPermission", "VisibilityEnum", "auth"]

"""Who a connection is: users, their grants by workspace, and what a permission allows.

Pure values: the router and the manager decide with them, and nothing here
reads or signs a token (:mod:`switchboard.hub.identity.auth` does, with PyJWT).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any

import shortuuid


class Permission(enum.IntEnum):
    """Ordered so that ``have >= need`` answers "is this enough?"."""

    NONE = 0
    READ = 1
    READ_WRITE = 2
    ADMIN = 3

    @classmethod
    def parse(cls, text: str) -> Permission:
        try:
            return _PERM_NAMES[text]
        except KeyError:
            raise ValueError(f"unknown permission {text!r}: use read, read_write or admin") from None

    @property
    def code(self) -> str:
        return {1: "r", 2: "rw", 3: "a"}.get(self.value, "")


_PERM_NAMES = {
    "r": Permission.READ,
    "read": Permission.READ,
    "rw": Permission.READ_WRITE,
    "read_write": Permission.READ_WRITE,
    "a": Permission.ADMIN,
    "admin": Permission.ADMIN,
}


# The users of ``switchboard token`` (an operator's) have ids ``op.<name>``; a provider's subject
# never keeps this prefix (hashed instead: :func:`switchboard.hub.identity.oidc.subject_user_id`),
# so the operator's ``alice`` and the provider's ``alice`` are two users.
OPERATOR_PREFIX = "op."


def operator_user_id(name: str) -> str:
    """The user id ``switchboard token --user <name>`` stands for."""
    return name if name.startswith(OPERATOR_PREFIX) else OPERATOR_PREFIX + name


def user_workspace(user_id: str) -> str:
    """Every user owns one workspace, created on demand."""
    return f"ws-user-{user_id}"


@dataclass(frozen=True)
class User:
    """An authenticated principal and its grants, keyed by workspace (``*`` = all)."""

    id: str
    roles: tuple[str, ...] = ()
    grants: dict[str, Permission] = field(default_factory=dict)
    email: str | None = None
    parent: str | None = None
    expires_at: float | None = None
    client_id: str | None = None  # a token bound to one client id
    current_workspace: str | None = None  # the token's wid
    # when the credential this identity stands on expires: a reconnection token never
    # outlives it; None only for an anonymous user, who has no credential
    credential_expires_at: float | None = None
    # labels for applications (Hypha's ``extra_scopes``); the hub itself grants nothing by them
    extra_scopes: tuple[str, ...] = ()
    token_id: str | None = None  # the id (jti) of the token this identity was read from
    origin: str | None = None  # on a reconnection token: the id of the credential it descends from
    # the ids of the credentials its credential was minted from (``generate_token``), nearest first
    chain: tuple[str, ...] = ()
    # when the credential it descends from was issued (its ``iat``; a reconnection token carries its
    # credential's): a credential older than a workspace's deletion grants nothing there
    issued_at: float | None = None

    @property
    def revocation_ids(self) -> tuple[str, ...]:
        """The ids whose revocation ends this identity: its token's own, its credential's, and those
        its credential descends from."""
        return tuple(i for i in (self.token_id, self.origin, *self.chain) if i)

    @property
    def lineage(self) -> tuple[str, ...]:
        """The credential this identity stands on and its ancestors, nearest first: the ancestry a
        token minted from it carries."""
        own = self.origin or self.token_id
        return (own, *self.chain) if own else self.chain

    @property
    def accountable(self) -> str:
        """Who answers for what this identity does: the root of its token chain (a generated
        token's user names it as ``parent``), else itself."""
        return self.parent or self.id

    @property
    def is_anonymous(self) -> bool:
        return "anonymous" in self.roles

    def permission(self, workspace: str) -> Permission:
        if "admin" in self.roles:
            return Permission.ADMIN
        if workspace == user_workspace(self.id):
            return Permission.ADMIN
        return max(self.grants.get(workspace, Permission.NONE), self.grants.get("*", Permission.NONE))

    def can(self, workspace: str, need: Permission) -> bool:
        return self.permission(workspace) >= need

    def named_in(self, owners: object) -> bool:
        """Whether a workspace record's ``owners`` name this user: by id, or by email for a
        first-hand credential only (a generated token inherits its maker's email, not its rights)."""
        if not isinstance(owners, list):
            return False
        return self.id in owners or (self.parent is None and bool(self.email) and self.email in owners)

    def with_ownership(self, workspace: str, record: dict[str, Any] | None) -> User:
        """This user as it stands in ``workspace`` whose record is ``record``: with ``admin`` there
        if the record names it an owner (a registered user only). Every door decides with this:
        the WebSocket and ``/rpc`` admission, the HTTP routes, the manager's checks."""
        if self.is_anonymous or self.can(workspace, Permission.ADMIN):
            return self
        if record is not None and self.named_in(record.get("owners")):
            return replace(self, grants={**self.grants, workspace: Permission.ADMIN})
        return self

    def to_wire(self, workspace: str | None = None, client_id: str | None = None) -> dict[str, Any]:
        """The user object stamped on messages and shown in ``connection_info``."""
        grants = {ws: p.code for ws, p in self.grants.items()}
        grants.setdefault(user_workspace(self.id), "a")
        return {
            "id": self.id,
            "roles": list(self.roles),
            "is_anonymous": self.is_anonymous,
            "scope": {
                "current_workspace": workspace,
                "workspaces": grants,
                "client_id": client_id,
                "extra_scopes": list(self.extra_scopes) if self.extra_scopes else None,
            },
            "email": self.email,
            "parent": self.parent,
            "expires_at": self.expires_at,
            "current_workspace": workspace,
        }


ROOT = User(id="root", roles=("admin",), grants={"*": Permission.ADMIN})


ANONYMOUS_PREFIX = "anonymouz-"  # Hypha's spelling: an anonymous user's id, and so its workspace, start with it


def new_anonymous_user() -> User:
    return User(id=f"{ANONYMOUS_PREFIX}{shortuuid.uuid()[:12].lower()}", roles=("anonymous",))

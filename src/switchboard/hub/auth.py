"""Users, permissions and tokens (protocol §6).

Tokens are HS256 JWTs in the reference's claim layout so the HTTP-streaming
client, which reads the ``wid:`` scope out of the payload, finds its
workspace. Verification never trusts a claim it did not sign.
"""

from __future__ import annotations

import enum
import secrets
from dataclasses import dataclass, field
from typing import Any

import jwt
import shortuuid

from switchboard.clock import Clock
from switchboard.errors import AuthError

ISSUER = "https://switchboard.invalid/"
AUDIENCE = "switchboard"
_ROLES = "https://amun.ai/roles"
_EMAIL = "https://amun.ai/email"
_PARENT = "https://amun.ai/parent"


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
            raise ValueError(
                f"unknown permission {text!r}: use read, read_write or admin"
            ) from None

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
                "extra_scopes": None,
            },
            "email": self.email,
            "parent": self.parent,
            "expires_at": self.expires_at,
            "current_workspace": workspace,
        }


ROOT = User(id="root", roles=("admin",), grants={"*": Permission.ADMIN})


def new_anonymous_user() -> User:
    return User(id=f"anonymouz-{shortuuid.uuid()[:12].lower()}", roles=("anonymous",))


@dataclass(frozen=True)
class TokenIssuer:
    """Signs and verifies tokens with one shared secret.

    Replicas of one hub share the secret, so a token from one is valid on all
    and a client keeps its identity across a restart.
    """

    secret: str
    clock: Clock

    @staticmethod
    def generate_secret() -> str:
        return secrets.token_urlsafe(32)

    def issue(
        self,
        user: User,
        *,
        workspace: str,
        permission: Permission,
        expires_in: float,
        client_id: str | None = None,
    ) -> str:
        now = self.clock.time()
        scope = [f"ws:{ws}#{p.code}" for ws, p in user.grants.items() if ws != workspace]
        scope.append(f"ws:{workspace}#{permission.code}")
        if client_id:
            scope.append(f"cid:{client_id}")
        scope.append(f"wid:{workspace}")
        claims = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "sub": user.id,
            "iat": int(now),
            "exp": int(now + expires_in),
            "scope": " ".join(scope),
            "gty": "client-credentials",
            _ROLES: list(user.roles),
            _EMAIL: user.email,
            _PARENT: user.parent,
        }
        return jwt.encode(claims, self.secret, algorithm="HS256")

    def verify(self, token: str) -> User:
        """Decode a token into the user it stands for, or raise :class:`AuthError`."""
        if not isinstance(token, str) or token.count(".") != 2:
            raise AuthError("token is not a JWT")
        try:
            claims = jwt.decode(
                token,
                self.secret,
                algorithms=["HS256"],
                audience=AUDIENCE,
                issuer=ISSUER,
                # expiry is checked below against the injected clock, not the system's
                options={"require": ["exp", "sub"], "verify_iat": False, "verify_exp": False},
                leeway=0,
            )
        except jwt.ExpiredSignatureError:
            raise AuthError("token has expired") from None
        except jwt.InvalidTokenError as exc:
            raise AuthError(f"invalid token: {exc}") from None
        if claims["exp"] <= self.clock.time():
            raise AuthError("token has expired")
        return _user_from_claims(claims)


def _user_from_claims(claims: dict[str, Any]) -> User:
    grants: dict[str, Permission] = {}
    client_id = None
    wid = None
    for part in str(claims.get("scope", "")).split():
        if part.startswith("ws:") and "#" in part:
            ws, _, perm = part[3:].rpartition("#")
            try:
                grants[ws] = max(grants.get(ws, Permission.NONE), Permission.parse(perm))
            except ValueError:
                raise AuthError(f"invalid token: bad permission in scope {part!r}") from None
        elif part.startswith("cid:"):
            client_id = part[4:]
        elif part.startswith("wid:"):
            wid = part[4:]
    roles = claims.get(_ROLES) or []
    if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
        raise AuthError("invalid token: roles must be a list of strings")
    return User(
        id=str(claims["sub"]),
        roles=tuple(roles),
        grants=grants,
        email=claims.get(_EMAIL),
        parent=claims.get(_PARENT),
        expires_at=float(claims["exp"]),
        client_id=client_id,
        current_workspace=wid,
    )


def child_user(parent: User, *, workspace: str, permission: Permission) -> User:
    """The user a generated token stands for: a new id that inherits roles."""
    return User(
        id=shortuuid.uuid()[:16].lower(),
        roles=parent.roles,
        grants={workspace: permission},
        parent=parent.parent or parent.id,
        email=parent.email,
    )

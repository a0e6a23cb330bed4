"""Tokens (protocol §6): the hub's own, signed and verified with PyJWT, and their scopes.

Who a token stands for is a :class:`~switchboard.hub.identity.users.User` (pure, in :mod:`.users`).

Tokens are HS256 JWTs in the reference's claim layout so the HTTP-streaming
client, which reads the ``wid:`` scope out of the payload, finds its
workspace. Verification never trusts a claim it did not sign.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import jwt
import shortuuid

from switchboard.clock import Clock
from switchboard.errors import AuthError
from switchboard.hub.identity.users import Permission, User
from switchboard.hub.identity.verified_tokens import VerifiedTokens
from switchboard.protocol.hypha import ids

ISSUER = "https://switchboard.invalid/"
AUDIENCE = "switchboard"
_ROLES = "https://amun.ai/roles"
_EMAIL = "https://amun.ai/email"
_PARENT = "https://amun.ai/parent"
# On a reconnection token: when the credential it descends from expires (null: none, an anonymous user).
# Carried in the token, so a refresh on any replica, or after a restart, keeps the bound.
CREDENTIAL_EXPIRY = ISSUER + "credential_exp"
# On a reconnection token: the id (jti) of the credential it descends from, so revoking that
# credential revokes every reconnection token derived from it, on every replica.
ORIGIN = ISSUER + "origin"
# On a reconnection token: the issue time (``iat``) of the credential it descends from, so that no
# refresh makes an old credential look new to a workspace's tombstone (null: it had none).
CREDENTIAL_ISSUED = ISSUER + "credential_iat"
# On a generated token (and the reconnection tokens of its sessions): the ids (jti) of the credentials
# it was minted from, nearest first, so that revoking any of them revokes it, on every replica.
CHAIN = ISSUER + "chain"
# Generations of generated tokens a credential may descend from: each carries the ids of all its
# ancestors, so the bound keeps tokens and the revocation check at admission small.
MAX_TOKEN_CHAIN = 8


@dataclass(frozen=True)
class TokenIssuer:
    """Signs and verifies tokens with one shared secret.

    Replicas of one hub share the secret, so a token from one is valid on all
    and a client keeps its identity across a restart.
    """

    secret: str
    clock: Clock
    # tokens already checked, so that clients sharing one token cost one check (:mod:`.verified_tokens`)
    verified: VerifiedTokens = field(default_factory=VerifiedTokens, compare=False, repr=False)

    def issue(
        self,
        user: User,
        *,
        workspace: str,
        permission: Permission,
        expires_in: float,
        client_id: str | None = None,
        resumes: bool = False,
    ) -> str:
        """A token for ``user``; ``resumes``: a reconnection token, which expires with
        the user's credential if that comes first, and carries that bound on."""
        now = self.clock.time()
        expires = now + expires_in
        extra: dict[str, Any] = {}
        if resumes:
            bound = user.credential_expires_at
            if bound is not None:
                expires = min(expires, bound)
            extra[CREDENTIAL_EXPIRY] = bound
            origin = user.origin or user.token_id
            if origin:
                extra[ORIGIN] = origin
            # an anonymous user has no credential: its identity begins with its first session
            issued = user.issued_at if user.issued_at is not None or not user.is_anonymous else int(now)
            extra[CREDENTIAL_ISSUED] = issued
        if user.chain:
            extra[CHAIN] = list(user.chain)
        return jwt.encode(
            {
                **extra,
                "iss": ISSUER,
                "aud": AUDIENCE,
                "sub": ids.check_id(user.id, "user id"),
                "iat": int(now),
                "jti": new_token_id(),
                "exp": int(expires),
                "scope": format_scope(
                    grants=user.grants,
                    workspace=workspace,
                    permission=permission,
                    client_id=client_id,
                    extra_scopes=user.extra_scopes,
                ),
                "gty": "client-credentials",
                _ROLES: list(user.roles),
                _EMAIL: user.email,
                _PARENT: user.parent,
            },
            self.secret,
            algorithm="HS256",
        )

    def verify(self, token: str) -> User:
        """Decode a token into the user it stands for, or raise :class:`AuthError`."""
        if not isinstance(token, str) or token.count(".") != 2:
            raise AuthError("token is not a JWT")
        known = self.verified.get(token)
        if known is not None:
            if known.expires_at is None or known.expires_at <= self.clock.time():
                raise AuthError("token has expired")
            return known
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
        user = _user_from_claims(claims)
        self.verified.put(token, user)
        return user


def format_scope(
    *,
    grants: dict[str, Permission],
    workspace: str,
    permission: Permission,
    client_id: str | None,
    extra_scopes: tuple[str, ...] = (),
) -> str:
    """The ``scope`` claim, built from checked values (protocol §6.4).

    Every workspace and client id must follow the id grammar: the claim is
    split on spaces and ``#`` again when it is read, so a value holding either
    would add a grant nobody gave.
    """
    entries = [(ws, p) for ws, p in grants.items() if ws != workspace] + [(workspace, permission)]
    parts = [f"ws:{_grant_key(ws)}#{p.code}" for ws, p in entries if p.code]
    if client_id:
        parts.append(f"cid:{ids.check_id(client_id, 'client id')}")
    parts.append(f"wid:{ids.check_id(workspace, 'workspace')}")
    parts.extend(check_extra_scope(x) for x in extra_scopes)
    return " ".join(parts)


# An extra scope: an application's label such as ``read:data`` (letters, digits, '_', '-',
# '|', '.', ':'), never one of the hub's own kinds, so it cannot be read back as a grant.
EXTRA_SCOPE_GRAMMAR = "letters, digits, '_', '-', '|', '.' and ':', at most 128, not starting with ws:, cid: or wid:"
_EXTRA_SCOPE = re.compile(r"[A-Za-z0-9_\-|.:]{1,128}")
MAX_EXTRA_SCOPES = 16


def is_extra_scope(value: object) -> bool:
    return (
        isinstance(value, str)
        and _EXTRA_SCOPE.fullmatch(value) is not None
        and value.partition(":")[0] not in ("ws", "cid", "wid")
    )


def check_extra_scope(value: object) -> str:
    if not is_extra_scope(value):
        raise AuthError(f"invalid extra scope {str(value)[:80]!r}: use {EXTRA_SCOPE_GRAMMAR}")
    assert isinstance(value, str)
    return value


def _grant_key(workspace: str) -> str:
    # "*" (every workspace) is only ever in the grants of the hub's own root user
    return workspace if workspace == "*" else ids.check_id(workspace, "workspace")


@dataclass(frozen=True, slots=True)
class Scope:
    """What a token's ``scope`` claim grants, parsed strictly."""

    grants: dict[str, Permission]
    client_id: str | None
    workspace: str | None
    extra_scopes: tuple[str, ...] = ()


_CODES = {"r": Permission.READ, "rw": Permission.READ_WRITE, "a": Permission.ADMIN}


def parse_scope(text: object) -> Scope:
    """Read a ``scope`` claim; anything but ``ws:<id>#<r|rw|a>``, ``cid:<id>``,
    ``wid:<id>`` (each id in the grammar, ``cid`` and ``wid`` at most once) and up to
    :data:`MAX_EXTRA_SCOPES` extra scopes (:data:`EXTRA_SCOPE_GRAMMAR`) is refused."""
    if not isinstance(text, str):
        raise AuthError("invalid token: scope must be a string")
    grants: dict[str, Permission] = {}
    single: dict[str, str] = {}
    extra: list[str] = []
    for part in text.split(" "):
        kind, colon, value = part.partition(":")
        if kind == "ws" and colon:
            ws, hash_, code = value.rpartition("#")
            if hash_ and (ws == "*" or ids.is_id(ws)) and code in _CODES:
                grants[ws] = max(grants.get(ws, Permission.NONE), _CODES[code])
                continue
        elif kind in ("cid", "wid") and colon and ids.is_id(value) and kind not in single:
            single[kind] = value
            continue
        elif is_extra_scope(part) and part not in extra and len(extra) < MAX_EXTRA_SCOPES:
            extra.append(part)
            continue
        raise AuthError(f"invalid token: bad scope entry {part[:80]!r}")
    return Scope(grants, single.get("cid"), single.get("wid"), tuple(extra))


def _user_from_claims(claims: dict[str, Any]) -> User:
    scope = parse_scope(claims.get("scope", ""))
    if not ids.is_id(claims["sub"]):
        raise AuthError("invalid token: bad subject")
    roles = claims.get(_ROLES) or []
    if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
        raise AuthError("invalid token: roles must be a list of strings")
    return User(
        id=claims["sub"],
        roles=tuple(roles),
        grants=scope.grants,
        email=claims.get(_EMAIL),
        parent=claims.get(_PARENT),
        expires_at=float(claims["exp"]),
        client_id=scope.client_id,
        current_workspace=scope.workspace,
        credential_expires_at=_credential_expiry(claims, anonymous="anonymous" in roles),
        extra_scopes=scope.extra_scopes,
        token_id=_text_claim(claims, "jti"),
        origin=_text_claim(claims, ORIGIN),
        chain=_chain(claims),
        issued_at=_credential_issued(claims),
    )


def issued_at(claims: dict[str, Any]) -> float | None:
    """A token's ``iat`` if it is a number (``None`` counts as issued before anything)."""
    value = claims.get("iat")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _credential_issued(claims: dict[str, Any]) -> float | None:
    """When the credential a token descends from was issued: a reconnection token carries it, any
    other token is its own credential."""
    if CREDENTIAL_ISSUED not in claims:
        return issued_at(claims)
    value = claims[CREDENTIAL_ISSUED]
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return None if value is None else float(value)
    raise AuthError("invalid token: bad credential issue time")


def _chain(claims: dict[str, Any]) -> tuple[str, ...]:
    value = claims.get(CHAIN, [])
    if (
        not isinstance(value, list)
        or len(value) > MAX_TOKEN_CHAIN
        or not all(isinstance(i, str) and 0 < len(i) <= 256 for i in value)
    ):
        raise AuthError("invalid token: bad chain")
    return tuple(value)


def _text_claim(claims: dict[str, Any], name: str) -> str | None:
    value = claims.get(name)
    if value is None or (isinstance(value, str) and 0 < len(value) <= 256):
        return value
    raise AuthError(f"invalid token: bad {name}")


def new_token_id() -> str:
    """A token's ``jti``: random, so that one token can be revoked without its siblings."""
    return shortuuid.uuid()


def _credential_expiry(claims: dict[str, Any], *, anonymous: bool) -> float | None:
    """A reconnection token's bound as it carries it; any other token is its own credential."""
    if CREDENTIAL_EXPIRY not in claims:
        return float(claims["exp"])
    bound = claims[CREDENTIAL_EXPIRY]
    if bound is None and anonymous:
        return None
    if isinstance(bound, int | float) and not isinstance(bound, bool):
        return float(bound)
    raise AuthError("invalid token: bad credential expiry")


def child_user(
    parent: User,
    *,
    workspace: str,
    permission: Permission,
    extra_scopes: tuple[str, ...] = (),
    email: str | None = None,
) -> User:
    """The user a generated token stands for: a new id that inherits roles but the hub's
    ``admin`` (which would make a token minted for one workspace and permission admin
    everywhere), and the email unless one is given (the caller checked it may set one);
    it carries the ids of the
    credentials it descends from (:attr:`User.lineage`), so revoking any of them revokes it;
    :class:`AuthError` past :data:`MAX_TOKEN_CHAIN` generations."""
    chain = parent.lineage
    if len(chain) > MAX_TOKEN_CHAIN:
        raise AuthError(
            f"Cannot generate a token from this credential: it was generated {len(parent.chain)} generations "
            f"from the first, and a token may be at most {MAX_TOKEN_CHAIN} generations from it (so that revoking "
            "any ancestor still reaches it): generate it from a credential nearer the first"
        )
    return User(
        id=shortuuid.uuid()[:16].lower(),
        roles=tuple(role for role in parent.roles if role != "admin"),
        grants={workspace: permission},
        parent=parent.parent or parent.id,
        email=email or parent.email,
        extra_scopes=extra_scopes,
        chain=chain,
    )

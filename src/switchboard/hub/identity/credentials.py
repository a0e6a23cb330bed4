"""How a token string becomes a :class:`User`: the hub's own tokens, a provider's, and revocations.

One verifier for every door (WebSocket admission, HTTP calls, the HTTP-streaming
transport, the console): a token is routed by its unverified ``iss`` to the
code that checks it (the claim only picks the checker: the checker verifies
everything, ``iss`` included), then refused if it, or the credential it
descends from, was revoked.
"""

from __future__ import annotations

import base64
import binascii
import json

import jwt

from switchboard.backends.revocations import Revocations
from switchboard.errors import AuthError, PermissionDenied
from switchboard.hub.identity.auth import ISSUER, TokenIssuer
from switchboard.hub.identity.oidc import LEEWAY, OidcVerifier
from switchboard.hub.identity.users import Permission, User, user_workspace

REVOKED = "Token has been revoked"  # Hypha's words (hypha/core/store.py)
# Who every anonymous user's revocations are charged to: anonymous identities cost nothing to make,
# so together they hold one user's allowance (and their tokens live a day at most, so it empties).
ANONYMOUS_PRINCIPAL = "anonymous users"


def payer(user: User) -> str:
    """Who pays for what ``user`` stores: the root of its token chain (:attr:`User.accountable`),
    all anonymous users as one."""
    return ANONYMOUS_PRINCIPAL if user.is_anonymous else user.accountable


def unverified_issuer(token: str) -> object:
    """The ``iss`` a token claims, read without checking anything: it only picks the checker,
    which checks everything, ``iss`` included. Read from the payload segment directly (PyJWT's
    unverified decode cost a connect about 50 µs), PyJWT saying why when that fails."""
    segment = token.split(".")[1]
    try:
        payload = json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))
    except (ValueError, binascii.Error, RecursionError):  # RecursionError: a payload nested too deep
        payload = None
    if isinstance(payload, dict):
        return payload.get("iss")
    try:
        return jwt.decode(token, options={"verify_signature": False}).get("iss")
    except (jwt.InvalidTokenError, RecursionError):
        raise AuthError("invalid token: malformed") from None


class Credentials:
    def __init__(self, issuer: TokenIssuer, revocations: Revocations, oidc: OidcVerifier | None = None) -> None:
        self.issuer = issuer
        self.revocations = revocations
        self.oidc = oidc

    async def verify(self, token: object) -> User:
        """The user ``token`` stands for, or :class:`AuthError` with the reason the client will see."""
        user = await self.identify(token)
        if await self.revocations.any_revoked(user.revocation_ids):
            raise AuthError(REVOKED)
        return user

    async def identify(self, token: object) -> User:
        """:meth:`verify` but for the revocations, which the caller checks itself (admission reads
        them with the rest of what it must know: :class:`~switchboard.backends.base.Arrival`)."""
        if not isinstance(token, str) or token.count(".") != 2:
            raise AuthError("token is not a JWT")
        if token in self.issuer.verified:  # one of ours, checked before: expiry is checked again
            return self.issuer.verify(token)
        claimed = unverified_issuer(token)
        if claimed == ISSUER:
            user = self.issuer.verify(token)
        elif self.oidc is not None and claimed == self.oidc.issuer:
            user = await self.oidc.verify(token)
        else:
            raise AuthError(f"unknown issuer {str(claimed)[:120]!r}")
        return user

    async def revoke(self, token: object, by: User) -> str:
        """Revoke ``token`` for good (until it would have expired): its holder or an admin of its workspace
        may. Returns its id: what descends from it carries that id (:attr:`User.revocation_ids`)."""
        user = await self.verify(token)
        own = user.id == by.id and not by.is_anonymous
        admin = by.can(user.current_workspace or user_workspace(user.id), Permission.ADMIN)
        if not (own or admin):
            raise PermissionDenied(
                "Permission denied: only the holder of a token or an admin of its workspace may revoke it"
            )
        if user.expires_at is None or not user.revocation_ids:
            raise AuthError("this token cannot be revoked: it has no id or no expiry")
        # kept past its expiry by the leeway a provider's token is checked with
        await self.revocations.revoke(user.revocation_ids[0], until=user.expires_at + LEEWAY, principal=payer(user))
        return user.revocation_ids[0]

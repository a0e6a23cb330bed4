"""Tokens of an OpenID Connect provider: their keys, their checks, and the user they stand for.

The provider's keys are found through discovery (``/.well-known/openid-configuration``
names ``jwks_uri``), fetched with httpx's async client (the event loop never blocks on
the provider; both requests of a fetch share one 5 s deadline, and an answer above 1 MiB
is dropped unread), over https only unless ``--oidc-allow-http``, and turned into keys
by PyJWT (:class:`jwt.PyJWKSet`, the ``cryptography`` backend); PyJWT checks the
signature. Keys are cached: a token with an unknown key id fetches them again (at most
once per ``--oidc-key-refetch-interval``), and while the provider is unreachable the
cached keys keep working.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

import httpx
import jwt

from switchboard.clock import Clock
from switchboard.config import Settings
from switchboard.errors import AuthError
from switchboard.hub.identity.auth import issued_at
from switchboard.hub.identity.users import OPERATOR_PREFIX, User
from switchboard.protocol.hypha import ids

log = logging.getLogger(__name__)

# Asymmetric algorithms only: never "none", never an HMAC, whose "key" would be the
# provider's public key, which anyone can fetch.
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512")
# Clocks of the provider and of the hub may differ: 30 s covers an NTP-synced pair many
# times over, and a token lives at most that long past its exp.
LEEWAY = 30.0
KEYS_MAX_AGE = 3600.0  # keys an hour old are fetched again, so a withdrawn key stops working
# One deadline for a whole fetch (discovery and JWKS, every byte of both): a provider that
# hangs, or drips its answer a byte at a time, delays only the fetch, never by more than this.
FETCH_TIMEOUT = 5.0
# A discovery document or a JWKS is a few KiB (a provider's dozen keys); 1 MiB is a hundred
# times that, and what a provider (or whoever answers for it) sends beyond it is never read.
MAX_FETCH_BYTES = 1 << 20
# A kept subject never starts with these: the hashed form of subjects, and the ids the hub makes itself
# (anonymous users, and the operator's users of ``switchboard token``).
HASHED_PREFIX = "sha256."
_RESERVED = (HASHED_PREFIX, "anonymouz-", OPERATOR_PREFIX)
MAX_KEPT_SUBJECT = 64


def subject_user_id(sub: str) -> str:
    """The user id of a provider's subject: stable (no state), and never the same for two subjects.

    A subject that is already an id (``auth0|5f3c…``, ``google-oauth2|1234``, a UUID) of at
    most 64 characters is kept as it is; any other becomes ``sha256.`` and the base32 of its
    SHA-256. No kept subject starts with ``sha256.``, so the two forms never meet; within
    each, equal ids mean equal subjects (identity, or a SHA-256 collision). Subjects that
    would look like the hub's own users (``root``, ``anonymouz-…``, the operator's ``op.…``) are hashed too.
    """
    if ids.is_id(sub) and len(sub) <= MAX_KEPT_SUBJECT and not sub.startswith(_RESERVED) and sub != "root":
        return sub
    digest = base64.b32encode(hashlib.sha256(sub.encode()).digest()).decode().rstrip("=").lower()
    return HASHED_PREFIX + digest


def claim_at(claims: dict[str, Any], name: str) -> Any:
    """A claim by its whole name (``https://example.org/roles``), else by a dotted path (``realm_access.roles``)."""
    if name in claims:
        return claims[name]
    value: Any = claims
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def roles_of(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(value.split())
    if isinstance(value, list):
        return tuple(r for r in value if isinstance(r, str))
    return ()


@dataclass(frozen=True)
class IdentityRules:
    """How a provider's claims become a :class:`User` (I/O-free)."""

    roles_claim: str = "roles"
    admin_roles: frozenset[str] = frozenset()
    admin_subjects: frozenset[str] = frozenset()
    trust_email: bool = False  # the provider verifies every address it puts in a token

    def user(self, claims: dict[str, Any]) -> User:
        sub = claims.get("sub")
        if not isinstance(sub, str) or not sub:
            raise AuthError("invalid token: no subject (sub)")
        # the hub's own role names mean something here: a provider's role of the same name does not
        roles = [r for r in roles_of(claim_at(claims, self.roles_claim)) if r not in ("admin", "anonymous")]
        if sub in self.admin_subjects or self.admin_roles.intersection(roles):
            roles.append("admin")
        email = claims.get("email")
        # only a verified address is the user's: an unverified one would match a record's owner by email
        verified = self.trust_email or claims.get("email_verified") is True
        exp = float(claims["exp"])
        jti = claims.get("jti")
        return User(
            id=subject_user_id(sub),
            roles=tuple(roles),
            email=email if isinstance(email, str) and verified else None,
            expires_at=exp,
            credential_expires_at=exp,  # a reconnection token never outlives the provider's token
            token_id=token_id(str(claims["iss"]), jti if isinstance(jti, str) else None, claims),
            issued_at=issued_at(claims),
        )


def token_id(issuer: str, jti: str | None, claims: dict[str, Any]) -> str:
    """The id a provider's token is revoked by: from its jti, or from its subject and times if it has none."""
    basis = f"{issuer}\n{jti}" if jti else f"{issuer}\n{claims.get('sub')}\n{claims.get('iat')}\n{claims['exp']}"
    return "oidc." + hashlib.sha256(basis.encode()).hexdigest()[:32]


@dataclass
class _Keys:
    keys: dict[str, jwt.PyJWK] = field(default_factory=dict)
    fetched_at: float | None = None  # last fetch that succeeded
    tried_at: float | None = None  # last fetch, successful or not


class OidcVerifier:
    """Verifies the tokens of one provider; holds its cached keys."""

    def __init__(self, settings: Settings, clock: Clock) -> None:
        self.issuer = settings.oidc_issuer
        self.audience = settings.oidc_audience
        self.refetch_interval = settings.oidc_key_refetch_interval
        self.schemes = ("https://", "http://") if settings.oidc_allow_http else ("https://",)
        self.rules = IdentityRules(
            roles_claim=settings.oidc_roles_claim,
            admin_roles=settings.oidc_admin_role_list,
            admin_subjects=settings.oidc_admin_subject_list,
            trust_email=settings.oidc_trust_email,
        )
        self.clock = clock
        self._cache = _Keys()
        self._lock = asyncio.Lock()

    async def verify(self, token: str) -> User:
        """The user a provider's token stands for, or :class:`AuthError` with the reason."""
        return self.rules.user(await self.claims(token, self.audience))

    async def claims(self, token: str, audience: str) -> dict[str, Any]:
        """The claims of a provider's token for ``audience``, checked (signature, issuer, times)."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            raise AuthError("invalid token: malformed") from None
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            raise AuthError(f"invalid token: algorithm {alg!r} is not accepted (use one of {', '.join(ALGORITHMS)})")
        key = await self._key(header.get("kid"))
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[alg],
                audience=audience,
                issuer=self.issuer,
                # times are checked below against the injected clock, not the system's
                options={"require": ["exp", "iss", "aud", "sub"], "verify_exp": False, "verify_nbf": False},
            )
        except jwt.InvalidAudienceError:
            raise AuthError(f"wrong audience: this hub accepts tokens for {audience!r}") from None
        except jwt.InvalidIssuerError:
            raise AuthError("unknown issuer") from None
        except jwt.InvalidSignatureError:
            raise AuthError("invalid token: bad signature") from None
        except jwt.InvalidTokenError as exc:
            raise AuthError(f"invalid token: {exc}") from None
        now = self.clock.time()
        if not isinstance(claims["exp"], int | float) or claims["exp"] + LEEWAY <= now:
            raise AuthError("token has expired")
        nbf = claims.get("nbf")
        if nbf is not None and (not isinstance(nbf, int | float) or nbf - LEEWAY > now):
            raise AuthError("token is not valid yet (nbf)")
        return claims

    async def _key(self, kid: Any) -> jwt.PyJWK:
        cache = self._cache
        known = _find(cache.keys, kid) is not None
        if fetch_due(
            self.clock.time(),
            known=known,
            fetched_at=cache.fetched_at,
            tried_at=cache.tried_at,
            interval=self.refetch_interval,
        ):
            tried = cache.tried_at
            async with self._lock:
                if cache.tried_at == tried:  # else another verification fetched while this one waited
                    await self._fetch()
        key = _find(cache.keys, kid)
        if key is None:
            if cache.fetched_at is None:
                raise AuthError("cannot check the token: the identity provider's keys could not be fetched")
            raise AuthError(f"unknown key: the identity provider has not published key id {kid!r}")
        return key

    async def _fetch(self) -> None:
        self._cache.tried_at = self.clock.time()
        try:
            async with asyncio.timeout(FETCH_TIMEOUT), httpx.AsyncClient(follow_redirects=False) as http:
                discovery = await get_json(http, self.issuer.rstrip("/") + "/.well-known/openid-configuration")
                if discovery.get("issuer") != self.issuer:
                    raise ValueError(f"discovery names issuer {discovery.get('issuer')!r}, not {self.issuer!r}")
                jwks_uri = discovery.get("jwks_uri")
                if not isinstance(jwks_uri, str):
                    raise ValueError("discovery has no jwks_uri")
                if not jwks_uri.startswith(self.schemes):
                    raise ValueError(f"discovery names jwks_uri {jwks_uri!r}: keys are fetched over https only")
                jwks = await get_json(http, jwks_uri)
            keys = {
                k.key_id or "": k
                for k in jwt.PyJWKSet.from_dict(jwks).keys
                if k.algorithm_name in ALGORITHMS and k.public_key_use in (None, "sig")  # never an encryption key
            }
        except TimeoutError:
            log.warning("identity provider's keys not fetched within %g s, the cached ones stay in use", FETCH_TIMEOUT)
            return
        except (httpx.HTTPError, ValueError, jwt.PyJWKSetError, jwt.PyJWKError) as exc:
            log.warning("identity provider's keys not fetched, the cached ones stay in use: %s", exc)
            return
        self._cache.keys = keys
        self._cache.fetched_at = self.clock.time()
        log.info("identity provider's keys fetched: %s", ", ".join(sorted(keys)) or "none")


def fetch_due(now: float, *, known: bool, fetched_at: float | None, tried_at: float | None, interval: float) -> bool:
    """Whether to fetch the provider's keys before checking a token.

    When the token's key is unknown or the keys are an hour old, but never twice within
    ``interval``, whatever tokens come: a flood of made-up key ids costs the provider
    one fetch per interval, and a failed fetch is not retried on every token.
    """
    stale = fetched_at is None or now - fetched_at >= KEYS_MAX_AGE
    if known and not stale:
        return False
    return tried_at is None or now - tried_at >= interval


def _find(keys: dict[str, jwt.PyJWK], kid: Any) -> jwt.PyJWK | None:
    if isinstance(kid, str):
        return keys.get(kid)
    if kid is None and len(keys) == 1:  # a provider with one key may leave kid out
        return next(iter(keys.values()))
    return None


async def get_json(http: httpx.AsyncClient, url: str) -> dict[str, Any]:
    """The JSON object at ``url``, read as it streams in and dropped at :data:`MAX_FETCH_BYTES`."""
    # asked uncompressed: the cap counts decoded bytes, and a compressed chunk may inflate a thousandfold first
    async with http.stream("GET", url, headers={"Accept-Encoding": "identity"}) as response:
        response.raise_for_status()
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_FETCH_BYTES:
            raise ValueError(f"{url} answers {declared} bytes (at most {MAX_FETCH_BYTES} are read)")
        data = bytearray()
        async for piece in response.aiter_bytes():
            data += piece
            if len(data) > MAX_FETCH_BYTES:
                raise ValueError(f"{url} answers more than {MAX_FETCH_BYTES} bytes")
    body = json.loads(data)
    if not isinstance(body, dict):
        raise ValueError(f"{url} did not answer a JSON object")
    return body

"""Signing in at the operator's OpenID Connect provider: the authorization-code flow with PKCE.

The hub is the provider's client (``--oidc-client-id``; a confidential client also
has a secret, from ``SWITCHBOARD_OIDC_CLIENT_SECRET`` or ``--oidc-client-secret-file``).
A flow is: :func:`new_flow` (``state``, ``nonce``, PKCE S256 verifier and challenge),
:func:`authorization_url` (where the browser goes), then at the callback
:func:`exchange_code` trades the code for the provider's tokens, whose ID token
the hub checks itself (:class:`~switchboard.hub.identity.oidc.OidcVerifier`, for
the client id as audience, the flow's nonce). The endpoints come from discovery,
fetched as the verifier fetches keys: https only unless ``--oidc-allow-http``,
one deadline, a bounded answer.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx

from switchboard.config import Settings, env_name
from switchboard.errors import AuthError, BackendError, ConfigError
from switchboard.hub.identity.oidc import FETCH_TIMEOUT, MAX_FETCH_BYTES, get_json

SCOPES = "openid profile email"


@dataclass(frozen=True)
class ProviderClient:
    """The hub as the provider's client."""

    issuer: str
    client_id: str
    secret: str | None
    redirect_uri: str
    schemes: tuple[str, ...]


def client_secret(settings: Settings, environ: Mapping[str, str] | None = None) -> str | None:
    """The client secret: ``SWITCHBOARD_OIDC_CLIENT_SECRET``, else the first line of
    ``--oidc-client-secret-file`` (never a flag's value, which every user of the machine can read)."""
    environ = os.environ if environ is None else environ
    secret = environ.get(env_name("oidc_client_secret"))
    if secret:
        return secret
    if settings.oidc_client_secret_file:
        try:
            text = Path(settings.oidc_client_secret_file).read_text()
        except OSError as exc:
            raise ConfigError(f"--oidc-client-secret-file: cannot read it: {exc}") from None
        return text.strip() or None
    return None


def login_client(settings: Settings, redirect_uri: str) -> ProviderClient | None:
    """The hub's client at its provider, or ``None`` when the operator configured none."""
    if not (settings.oidc_issuer and settings.oidc_client_id):
        return None
    schemes = ("https://", "http://") if settings.oidc_allow_http else ("https://",)
    return ProviderClient(settings.oidc_issuer, settings.oidc_client_id, client_secret(settings), redirect_uri, schemes)


def not_configured() -> str:
    return (
        "Signing in is not set up on this hub: its operator sets --oidc-issuer (SWITCHBOARD_OIDC_ISSUER), "
        "--oidc-audience and --oidc-client-id (SWITCHBOARD_OIDC_CLIENT_ID), and for a confidential client "
        "SWITCHBOARD_OIDC_CLIENT_SECRET or --oidc-client-secret-file; then registers "
        "{public-url}/public/apps/hypha-login/callback as the client's redirect URI"
    )


@dataclass(frozen=True)
class Flow:
    state: str
    nonce: str
    verifier: str

    @property
    def challenge(self) -> str:
        digest = hashlib.sha256(self.verifier.encode()).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def new_flow() -> Flow:
    # 256 bits each: none can be guessed; the verifier is 43 characters, RFC 7636's shortest
    return Flow(secrets.token_urlsafe(32), secrets.token_urlsafe(32), secrets.token_urlsafe(32))


def authorization_url(endpoint: str, client: ProviderClient, flow: Flow) -> str:
    params = {
        "response_type": "code",
        "client_id": client.client_id,
        "redirect_uri": client.redirect_uri,
        "scope": SCOPES,
        "state": flow.state,
        "nonce": flow.nonce,
        "code_challenge": flow.challenge,
        "code_challenge_method": "S256",
    }
    return endpoint + ("&" if "?" in endpoint else "?") + urlencode(params)


def check_nonce(claims: Mapping[str, Any], flow_nonce: str) -> None:
    nonce = claims.get("nonce")
    if not isinstance(nonce, str) or not secrets.compare_digest(nonce, flow_nonce):
        raise AuthError("the ID token's nonce is not this sign-in's")


async def endpoints(client: ProviderClient) -> dict[str, str]:
    """The provider's ``authorization_endpoint`` and ``token_endpoint`` (discovery)."""
    try:
        async with asyncio.timeout(FETCH_TIMEOUT), httpx.AsyncClient(follow_redirects=False) as http:
            found = await get_json(http, client.issuer.rstrip("/") + "/.well-known/openid-configuration")
    except (TimeoutError, httpx.HTTPError, ValueError) as exc:
        raise BackendError(f"the identity provider cannot be reached, please retry: {exc}") from None
    if found.get("issuer") != client.issuer:
        raise BackendError(f"the identity provider's discovery names issuer {found.get('issuer')!r}")
    named: dict[str, str] = {}
    for name in ("authorization_endpoint", "token_endpoint"):
        url = found.get(name)
        if not isinstance(url, str) or not url.startswith(client.schemes):
            raise BackendError(f"the identity provider's discovery has no usable {name}")
        named[name] = url
    return named


async def exchange_code(token_endpoint: str, client: ProviderClient, code: str, flow: Flow) -> str:
    """The ID token the provider gives for ``code`` (with the flow's PKCE verifier)."""
    form = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": client.redirect_uri,
        "code_verifier": flow.verifier,
        "client_id": client.client_id,
    }
    try:
        async with asyncio.timeout(FETCH_TIMEOUT), httpx.AsyncClient(follow_redirects=False) as http:
            headers = {"Accept": "application/json"}
            if client.secret:  # client_secret_basic, every provider's default
                response = await http.post(
                    token_endpoint, data=form, auth=(client.client_id, client.secret), headers=headers
                )
            else:
                response = await http.post(token_endpoint, data=form, headers=headers)
    except (TimeoutError, httpx.HTTPError) as exc:
        raise BackendError(f"the identity provider cannot be reached, please retry: {exc}") from None
    if len(response.content) > MAX_FETCH_BYTES:
        raise AuthError("the identity provider's answer is too large")
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code != 200 or not isinstance(body, dict):
        reason = body.get("error_description") or body.get("error") if isinstance(body, dict) else response.status_code
        raise AuthError(f"the identity provider refused the code: {reason}")
    id_token = body.get("id_token")
    if not isinstance(id_token, str):
        raise AuthError("the identity provider gave no ID token")
    return id_token

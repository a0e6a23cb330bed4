"""``public/hypha-login``: Hypha's login service, signing people in at the operator's OpenID Connect provider.

``start(workspace, expires_in)`` makes a login key (256 random bits) that lives
:data:`~switchboard.backends.logins.LOGIN_TIME`; its holder opens ``login_url``
(the hub's page, :mod:`switchboard.server.http.login_page`), which sends the
browser to the provider (:mod:`switchboard.hub.identity.oidc_login`); at the
callback the hub checks the ID token and keeps, for that key alone, a hub token
for the user (scoped to the workspace asked for, if the user may read it;
``expires_in`` at most :data:`MAX_LOGIN_EXPIRES_IN`). ``check(key, timeout)``
waits for it and hands it out once; ``report(key, token)`` fills a key with a
token the hub itself verifies. Keys and flows are in a
:class:`~switchboard.backends.logins.LoginStore` shared by the replicas.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from switchboard.backends.logins import LOGIN_TIME, LoginStore
from switchboard.clock import Clock
from switchboard.errors import AuthError, LimitExceeded, PermissionDenied, ProtocolError
from switchboard.hub.identity import oidc_login
from switchboard.hub.identity.auth import TokenIssuer
from switchboard.hub.identity.credentials import Credentials
from switchboard.hub.identity.oidc_login import Flow, ProviderClient
from switchboard.hub.identity.users import Permission, User, user_workspace
from switchboard.protocol.hypha import ids

LOGIN_PATH = "/public/apps/hypha-login"
# Hypha's default lifetime of a login's token, and the longest one asked: a login is a person at a
# browser, and a week covers a working week; longer-lived tokens are made on purpose (generate_token).
DEFAULT_LOGIN_EXPIRES_IN = 3600.0
MAX_LOGIN_EXPIRES_IN = 7 * 24 * 3600.0
# A waiting check looks again this often (a token stored on any replica is seen within it).
CHECK_POLL = 0.5
# Checks waiting on one replica at once: each costs a look every CHECK_POLL; more are refused (retry).
MAX_WAITING_CHECKS = 1000
# The provider's endpoints are fetched again after an hour, as its keys are (hub/identity/oidc.py).
DISCOVERY_MAX_AGE = 3600.0
_LABEL_MAX = 64  # Hypha's bound of a profile's name, nickname and user id


def check_key(key: object) -> str:
    if not isinstance(key, str) or not 16 <= len(key) <= 64 or not key.replace("-", "").replace("_", "").isalnum():
        raise ProtocolError("Invalid key, key does not exist")
    return key


def check_expires_in(value: object) -> float:
    if value is None or value == 0:
        return DEFAULT_LOGIN_EXPIRES_IN
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value <= MAX_LOGIN_EXPIRES_IN:
        raise ProtocolError(f"expires_in must be a number of seconds from 0 to {MAX_LOGIN_EXPIRES_IN:g}")
    return float(value)


def profile_of(
    token: str, user: User, workspace: str | None, expires_in: float, labels: dict[str, Any]
) -> dict[str, Any]:
    """What ``check(..., profile=True)`` answers (Hypha's ``UserTokenInfo``)."""

    def label(name: str) -> str | None:
        value = labels.get(name)
        return value[:_LABEL_MAX] if isinstance(value, str) else None

    picture = labels.get("picture")
    email = labels.get("email")
    return {
        "token": token,
        "workspace": workspace,
        "expires_in": int(expires_in),
        # the address reported with the token (as Hypha keeps it), else the token's verified one; marked
        # verified only when it is the token's
        "email": email[:254] if isinstance(email, str) and email else user.email,
        "email_verified": user.email is not None and (not email or email == user.email),
        "name": label("name"),
        "nickname": label("nickname") or label("preferred_username"),
        "user_id": user.id,
        "picture": picture if isinstance(picture, str) and picture.startswith("https://") else None,
    }


class LoginService:
    """The ``hypha-login`` service's functions and the page's two steps (see the module docstring)."""

    def __init__(
        self,
        store: LoginStore,
        *,
        clock: Clock,
        issuer: TokenIssuer,
        credentials: Credentials,
        permission: Any,  # async (user, workspace) -> Permission, an owner's included
        client: ProviderClient | None,
        public_base_url: str,
    ) -> None:
        self.store = store
        self.clock = clock
        self.issuer = issuer
        self.credentials = credentials
        self.permission = permission
        self.client = client
        self.page_url = public_base_url + LOGIN_PATH
        self.service_url = public_base_url + "/public/services/hypha-login"
        self.waiting = 0
        self._endpoints: tuple[float, dict[str, str]] | None = None  # (fetched at, monotonic), the provider's

    def service(self) -> dict[str, Any]:
        key: dict[str, Any] = {"key": {"type": "string"}}
        return {
            "id": "hypha-login",
            "name": "Hypha Login",
            "description": "Login service for Hypha",
            "config": {"visibility": "public", "require_context": True},
            "start": (self.start, {"workspace": {"type": "string"}, "expires_in": {"type": "number"}}),
            "check": (self.check, {**key, "timeout": {"type": "number"}, "profile": {"type": "boolean"}}),
            "report": (self.report, {**key, "token": {"type": "string"}, "workspace": {"type": "string"}}),
            "logout": (self.logout, {"config": {}}),
        }

    def _configured(self) -> ProviderClient:
        if self.client is None:
            raise ProtocolError(oidc_login.not_configured())
        return self.client

    async def start(self, workspace: Any = None, expires_in: Any = None, context: Any = None) -> dict[str, Any]:
        """Start a sign-in: a login key, and the page its holder opens (or a token is reported for it)."""
        if workspace is not None:
            ids.check_id(workspace, "workspace")
        lifetime = check_expires_in(expires_in)
        key = secrets.token_urlsafe(32)
        until = self.clock.time() + LOGIN_TIME
        entry = {"s": "pending", "workspace": workspace, "expires_in": lifetime, "until": until}
        await self.store.add("k:" + key, json.dumps(entry), until)
        return {
            "login_url": f"{self.page_url}/?key={key}",
            "key": key,
            "report_url": f"{self.service_url}/report",
            "check_url": f"{self.service_url}/check",
        }

    async def check(self, key: Any, timeout: Any = LOGIN_TIME, profile: Any = False, context: Any = None) -> Any:
        """The key's token once someone signed in (``profile``: with the user's profile), waiting ``timeout`` s."""
        name = "k:" + check_key(key)
        if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout != timeout:  # NaN
            raise ProtocolError("timeout must be a number of seconds")
        timeout = min(timeout, LOGIN_TIME)  # no key outlives it
        if await self.store.get(name) is None:
            raise ProtocolError("Invalid key, key does not exist or expired")
        if timeout > 0 and self.waiting >= MAX_WAITING_CHECKS:
            raise LimitExceeded(f"{MAX_WAITING_CHECKS} logins are being waited for on this replica: retry later")
        self.waiting += 1
        try:
            deadline = self.clock.monotonic() + max(0.0, float(timeout))
            for _ in range(int(LOGIN_TIME / CHECK_POLL) + 2):
                entry = await self.store.get(name)
                if entry is None:
                    raise ProtocolError(f"Login session expired, the maximum login time is {LOGIN_TIME:g} seconds")
                state = json.loads(entry)
                if state["s"] != "pending":
                    taken = await self.store.take(name)
                    if taken is None:  # another check took it first
                        raise ProtocolError("Invalid key, key does not exist or expired")
                    done = json.loads(taken)
                    if done["s"] == "failed":
                        raise PermissionDenied(done["error"])
                    return done["profile"] if profile else done["profile"]["token"]
                if timeout <= 0:
                    return None
                if self.clock.monotonic() >= deadline:
                    break
                await self.clock.sleep(min(CHECK_POLL, max(0.0, deadline - self.clock.monotonic())))
            hint = f"; {oidc_login.not_configured()}" if self.client is None else ""
            raise ProtocolError(f"Login timeout, waited for {timeout} seconds{hint}")
        finally:
            self.waiting -= 1

    async def report(
        self,
        key: Any,
        token: Any,
        workspace: Any = None,
        expires_in: Any = None,
        context: Any = None,
        **labels: Any,
    ) -> None:
        """Fill a key with a token the hub verifies (scoped to ``workspace`` if given)."""
        name = "k:" + check_key(key)
        entry = await self.store.get(name)
        if entry is None or json.loads(entry)["s"] != "pending":
            raise ProtocolError("Invalid key, key does not exist or expired")
        try:
            user = await self.credentials.verify(token)
        except AuthError as exc:
            raise PermissionDenied(f"Invalid token provided to report_login: {exc}") from None
        lifetime = check_expires_in(expires_in)
        if workspace is not None:
            ws = ids.check_id(workspace, "workspace")
            bound = user.credential_expires_at
            if bound is not None:  # a token made from another never outlives it
                lifetime = min(lifetime, bound - self.clock.time())
                if lifetime <= 0:
                    raise PermissionDenied("Invalid token provided to report_login: token has expired")
            token = await self._token(user, ws, lifetime, derived=True)
        await self._fill(name, profile_of(token, user, workspace, lifetime, labels))

    async def logout(self, config: Any = None, context: Any = None) -> dict[str, str]:
        """The page that signs the browser out."""
        return {"logout_url": f"{self.page_url}/?logout=true&close=true"}

    async def _token(self, user: User, workspace: str, lifetime: float, *, derived: bool = False) -> str:
        """A hub token for ``user`` in ``workspace``; ``derived``: made from a reported token, so it carries
        that credential's bounds (expiry, issue time, ancestry), as a reconnection token does: revoking the
        reported token, or deleting the workspace after it was issued, reaches this one too."""
        have = await self.permission(user, workspace)
        if have < Permission.READ:
            raise PermissionDenied(f"Invalid permission for the workspace {workspace}")
        return self.issuer.issue(user, workspace=workspace, permission=have, expires_in=lifetime, resumes=derived)

    async def _fill(self, name: str, done: dict[str, Any]) -> None:
        if not await self.store.replace(name, json.dumps({"s": "done", "profile": done})):
            raise ProtocolError("Invalid key, key does not exist or expired")

    # the page's two steps

    async def _discovered(self, client: ProviderClient) -> dict[str, str]:
        """The provider's endpoints, fetched at most once per :data:`DISCOVERY_MAX_AGE` (a page opened
        for each of many keys costs the provider nothing more)."""
        now = self.clock.monotonic()
        if self._endpoints is None or now - self._endpoints[0] >= DISCOVERY_MAX_AGE:
            self._endpoints = (now, await oidc_login.endpoints(client))
        return self._endpoints[1]

    async def begin(self, key: str) -> str:
        """Where the browser holding ``key`` goes to sign in: the provider, with a new flow for that key."""
        client = self._configured()
        name = "k:" + check_key(key)
        entry = await self.store.get(name)
        if entry is None or json.loads(entry)["s"] != "pending":
            raise ProtocolError("This sign-in link has expired or was used: start again from your client")
        found = await self._discovered(client)
        flow = oidc_login.new_flow()
        until = json.loads(entry)["until"]
        kept = {"key": key, "nonce": flow.nonce, "verifier": flow.verifier}
        await self.store.add("s:" + flow.state, json.dumps(kept), until)
        return oidc_login.authorization_url(found["authorization_endpoint"], client, flow)

    async def finish(self, code: str, state: str) -> None:
        """The provider sent the browser back: the code for ``state``'s flow becomes its key's token."""
        client = self._configured()
        if not (0 < len(state) <= 64 and 0 < len(code) <= 4096):
            raise ProtocolError("This sign-in is unknown or was finished already: start again from your client")
        kept_text = await self.store.take("s:" + state)  # a state is used once
        if kept_text is None:
            raise ProtocolError("This sign-in is unknown or was finished already: start again from your client")
        kept = json.loads(kept_text)
        name = "k:" + kept["key"]
        entry = await self.store.get(name)
        if entry is None or json.loads(entry)["s"] != "pending":
            raise ProtocolError("This sign-in link has expired or was used: start again from your client")
        asked = json.loads(entry)
        flow = Flow(state=state, nonce=kept["nonce"], verifier=kept["verifier"])
        found = await self._discovered(client)
        id_token = await oidc_login.exchange_code(found["token_endpoint"], client, code, flow)
        verifier = self.credentials.oidc
        assert verifier is not None  # a client is configured only with an issuer
        claims = await verifier.claims(id_token, client.client_id)
        oidc_login.check_nonce(claims, flow.nonce)
        user = verifier.rules.user(claims)
        workspace = asked["workspace"]
        try:
            token = await self._token(user, workspace or user_workspace(user.id), asked["expires_in"])
        except PermissionDenied as exc:
            await self.store.replace(name, json.dumps({"s": "failed", "error": str(exc)}))
            raise
        await self._fill(name, profile_of(token, user, workspace, asked["expires_in"], claims))

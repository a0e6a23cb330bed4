"""A certified OpenID Connect provider (npm ``oidc-provider``, run by Node on loopback) for the sign-in tests,
and a person signing in at it over HTTP (its development login form takes any login and password)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = ROOT / ".cache" / "js" / "node_modules"
SCRIPT = ROOT / "tests" / "js" / "oidc_provider.mjs"
CLIENT_ID = "switchboard-hub"
MAX_HOPS = 12  # a sign-in is 5 or 6 redirects
CLIENT_SECRET = "a-client-secret-of-the-test-provider-0123456789"


@contextmanager
def node_provider(redirect_uris: list[str]) -> Iterator[str]:
    """The provider's issuer URL while it runs, with one confidential client and one other client."""
    if not (MODULES / "oidc-provider").is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail("oidc-provider is not installed: run scripts/js-deps")
        pytest.skip("oidc-provider is not installed: run scripts/js-deps")
    clients = [
        {"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET, "redirect_uris": redirect_uris},
        {"client_id": "another-app", "client_secret": CLIENT_SECRET + "-other", "redirect_uris": redirect_uris},
    ]
    proc = subprocess.Popen(
        ["node", str(SCRIPT), json.dumps({"clients": clients})],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "SB_JS_MODULES": str(MODULES)},
        text=True,
    )
    try:
        assert proc.stdout is not None
        for _ in range(20):  # a few warnings, then READY
            line = proc.stdout.readline()
            if not line or line.startswith("READY "):
                break
        assert line.startswith("READY "), f"the provider did not start: {line!r}"
        yield line.split()[1]
    finally:
        proc.kill()
        proc.wait(timeout=10)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


async def sign_in(
    login_url: str,
    login: str,
    *,
    http: httpx.AsyncClient | None = None,
    route: Callable[[str], str] = lambda url: url,
) -> httpx.Response:
    """Open ``login_url`` and sign in as ``login`` at the provider's form, consenting, following each
    redirect through ``route`` (which may send the hub's public URL to one replica); the last answer
    (the hub's callback page, or a refusal)."""
    async with httpx.AsyncClient(timeout=10) as own:
        http = http or own
        page = await _follow(http, "GET", login_url, route)
        for prompt in ("login", "consent"):
            if "/interaction/" not in str(page.url):
                return page
            form = {"prompt": prompt, "login": login, "password": "any"} if prompt == "login" else {"prompt": prompt}
            page = await _follow(http, "POST", str(page.url), route, data=form)
        return page


async def _follow(
    http: httpx.AsyncClient, method: str, url: str, route: Callable[[str], str], **kw: Any
) -> httpx.Response:
    for _ in range(MAX_HOPS):
        response = await http.request(method, route(url), follow_redirects=False, **kw)
        if not response.is_redirect:
            return response
        url, method, kw = str(response.url.join(response.headers["location"])), "GET", {}
    raise AssertionError(f"more than {MAX_HOPS} redirects from {url}")

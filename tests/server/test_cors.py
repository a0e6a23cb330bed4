"""CORS: a page from another origin may use the HTTP endpoints (``--cors-origins``, default ``*``).

Browsers send a preflight ``OPTIONS`` before the HTTP-streaming transport's
requests (they carry ``Content-Type: application/msgpack`` and, with a token,
``Authorization``), and read a response only if it allows their origin.
Credentials (cookies) are never allowed cross-origin: a foreign page can do
what its own token allows, nothing that a visitor's cookies would.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from switchboard.config import Settings
from switchboard.errors import ConfigError
from switchboard.server.runner import running
from switchboard.testing.hub import settings_for_tests

pytestmark = pytest.mark.timeout(30)

PAGE = "http://127.0.0.1:8000"
PREFLIGHT = {
    "Origin": PAGE,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type",
}


@pytest.fixture
async def http(server) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        yield client


async def test_preflight_of_the_streaming_transport_is_answered(http):
    for path in ("/rpc", "/ws-user-x/services/svc/fn", "/api/status"):
        response = await http.options(path, headers=PREFLIGHT)
        assert response.status_code == 200, (path, response.text)
        assert response.headers["access-control-allow-origin"] == "*"
        allowed = response.headers["access-control-allow-headers"].lower()
        assert "authorization" in allowed
        assert "content-type" in allowed
        assert "POST" in response.headers["access-control-allow-methods"]
        assert "access-control-allow-credentials" not in response.headers


async def test_responses_carry_the_allowed_origin(http):
    for path in ("/health/liveness", "/ws-user-x/services", "/rpc?client_id=c&workspace=w"):
        response = await http.request("GET" if "rpc" not in path else "POST", path, headers={"Origin": PAGE})
        assert response.headers.get("access-control-allow-origin") == "*", path
        assert "access-control-allow-credentials" not in response.headers


async def test_a_list_of_origins_allows_only_those():
    settings = settings_for_tests(cors_origins="https://app.example, http://localhost:3000")
    async with running(settings) as srv, httpx.AsyncClient(base_url=srv.url, timeout=10) as http:
        allowed = await http.options("/rpc", headers={**PREFLIGHT, "Origin": "http://localhost:3000"})
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == "http://localhost:3000"
        refused = await http.options("/rpc", headers=PREFLIGHT)
        assert refused.status_code == 400
        plain = await http.get("/health/liveness", headers={"Origin": PAGE})
        assert "access-control-allow-origin" not in plain.headers


async def test_empty_turns_cors_off():
    async with running(settings_for_tests(cors_origins="")) as srv, httpx.AsyncClient(base_url=srv.url) as http:
        response = await http.get("/health/liveness", headers={"Origin": PAGE})
        assert "access-control-allow-origin" not in response.headers
        assert (await http.options("/rpc", headers=PREFLIGHT)).status_code == 405


@pytest.mark.parametrize("value", ["app.example", "https://app.example/", "https://app.example/path", "*,https://a.b"])
def test_origins_must_be_scheme_host_port(value):
    with pytest.raises(ConfigError, match="SWITCHBOARD_CORS_ORIGINS"):
        Settings(cors_origins=value)

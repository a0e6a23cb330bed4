"""The plain-HTTP face of the hub: health, metrics, and calling services (protocol §8.1–8.2).

Services are registered by a real hypha-rpc client and called with
``httpx``; every error is a JSON ``{"success": false, "detail": ...}`` with
the status the reference uses (checklist 35–36).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgpack
import pytest

from switchboard.config import Settings
from switchboard.server.process.server_state import Phase
from switchboard.server.runner import RunningServer
from switchboard.testing.hub import settings_for_tests as make_settings
from switchboard.testing.wait import eventually

pytestmark = pytest.mark.timeout(60)

MAX_BODY = 64 * 1024
CALL_TIMEOUT = 0.5


@pytest.fixture
def settings() -> Settings:
    """Small limits, so "too large" and "too slow" are cheap to reach."""
    return make_settings(max_message_bytes=MAX_BODY, call_timeout=CALL_TIMEOUT)


@pytest.fixture
async def http(server: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        yield client


class Provider:
    """A real hypha-rpc client offering one public and one protected service."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.ws: str = api.config["workspace"]
        self.release = asyncio.Event()


@pytest.fixture
async def provider(connect: Any) -> AsyncIterator[Provider]:
    api = await connect(client_id="prov")
    p = Provider(api)

    async def add(a, b):
        return a + b

    def fail(message):
        raise ValueError(message)

    async def stall():
        await p.release.wait()  # answers only when the test lets it
        return "late"

    await api.register_service(
        {
            "id": "pub",
            "config": {"visibility": "public"},
            "add": add,
            "mul": lambda a, b: a * b,
            "echo": lambda value=None: value,
            "fail": fail,
            "stall": stall,
            "nested": {"sub": lambda a, b: a - b},
            "version": "1.2.3",
        }
    )
    await api.register_service({"id": "prot", "config": {"visibility": "protected"}, "add": add})
    await api.register_service({"id": "hidden", "config": {"visibility": "unlisted"}, "add": add})
    yield p
    p.release.set()


def assert_error(response: httpx.Response, status: int, *fragments: str) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["success"] is False
    detail = body["detail"]
    assert isinstance(detail, str)
    assert detail
    for fragment in fragments:
        assert fragment in detail, f"{fragment!r} not in {detail!r}"
    return detail


# -- health and metrics ---------------------------------------------------------


async def test_liveness_is_ok(http):
    response = await http.get("/health/liveness")
    assert response.status_code == 200
    assert response.json() == {"status": "OK"}


async def test_readiness_is_ok_with_a_reason_when_serving(http, server):
    response = await http.get("/health/readiness")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "OK"
    assert body["detail"]
    assert body["replica"] == server.hub.replica_id


async def test_readiness_is_503_with_a_reason_while_draining(http, server):
    state = server.app.state.switchboard
    state.phase = Phase.DRAINING
    try:
        response = await http.get("/health/readiness")
    finally:
        state.phase = Phase.READY
    assert response.status_code == 503
    assert response.json()["status"] == "DOWN"
    assert response.json()["detail"] == "draining"
    assert (await http.get("/health/liveness")).status_code == 200, "draining is not dead"


async def test_health_has_hyphas_fields_beside_switchboards(http, server, provider):
    """Hypha's ``/health`` fields (memory, connections, objects, tasks, score) for monitoring
    written against it; ``status`` stays Switchboard's ``HEALTHY``/``DOWN``."""
    response = await http.get("/health")
    assert response.status_code == 200
    body = response.json()
    assert (body["status"], body["detail"], body["replica"]) == ("HEALTHY", "ready", server.hub.replica_id)
    assert (body["health_score"], body["issues"]) == (100, [])
    assert body["memory"]["rss_mb"] > 1
    assert body["memory"]["vms_mb"] >= body["memory"]["rss_mb"]
    assert 0 < body["memory"]["percent"] <= 100
    assert body["connections"]["active"] == body["objects"]["connection_objects"] == 1  # the provider
    assert body["objects"]["rpc_objects"] == 4  # its built-in service, pub, prot and hidden
    assert body["tasks"]["active"] > 0
    assert body["uptime_seconds"] >= 0
    assert set(body["system"]) == {"memory_percent", "disk_usage", "load_average"}

    state = server.app.state.switchboard
    state.phase = Phase.DRAINING
    try:
        down = await http.get("/health")
    finally:
        state.phase = Phase.READY
    assert down.status_code == 503
    assert (down.json()["status"], down.json()["health_score"], down.json()["issues"]) == ("DOWN", 0, ["draining"])


def connected_clients(metrics_text: str, replica: str) -> float:
    pattern = rf'^switchboard_connected_clients\{{replica="{re.escape(replica)}"\}} (\S+)$'
    match = re.search(pattern, metrics_text, re.MULTILINE)
    assert match, f"no switchboard_connected_clients for replica {replica} in:\n{metrics_text}"
    return float(match.group(1))


async def test_metrics_are_prometheus_text_and_count_connected_clients(http, server, connect):
    replica = server.hub.replica_id
    response = await http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert "# TYPE switchboard_connected_clients gauge" in response.text
    before = connected_clients(response.text, replica)

    api = await connect()
    after = connected_clients((await http.get("/metrics")).text, replica)
    assert after == before + 1

    await api.disconnect()

    async def gauge_back_down() -> bool:
        return connected_clients((await http.get("/metrics")).text, replica) == before

    await eventually(gauge_back_down, "the gauge back down", interval=0.02)


# -- listing and describing services ---------------------------------------------


async def test_listing_a_workspace_anonymously_shows_only_public_services(http, provider):
    response = await http.get(f"/{provider.ws}/services")
    assert response.status_code == 200
    ids = {s["id"] for s in response.json()}
    assert any(i.endswith("prov:pub") for i in ids), ids
    assert not any(i.endswith(("prov:prot", "prov:hidden")) for i in ids), ids
    assert (await http.get(f"/{provider.ws}/services/")).json() == response.json()


async def test_listing_with_a_workspace_token_also_shows_protected_services(http, provider):
    token = await provider.api.generate_token()
    response = await http.get(f"/{provider.ws}/services", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200
    ids = {s["id"] for s in response.json()}
    assert any(i.endswith("prov:prot") for i in ids), ids
    assert not any(i.endswith("prov:hidden") for i in ids), ids


async def test_service_info_describes_the_service(http, provider):
    response = await http.get(f"/{provider.ws}/services/prov:pub")
    assert response.status_code == 200
    info = response.json()
    assert info["id"] == f"{provider.ws}/prov:pub"
    assert info["config"]["visibility"] == "public"
    assert (await http.get(f"/{provider.ws}/services/pub")).json()["id"] == info["id"]


async def test_service_info_of_a_protected_service_needs_a_token(http, provider):
    assert_error(await http.get(f"/{provider.ws}/services/prot"), 403, "Permission denied")


async def test_service_info_of_an_unknown_service_is_404(http, provider):
    assert_error(await http.get(f"/{provider.ws}/services/nope"), 404, "not found")


# -- calling services -------------------------------------------------------------


async def test_get_passes_query_parameters_as_numbers(http, provider):
    response = await http.get(f"/{provider.ws}/services/pub/add", params={"a": 3, "b": 4})
    assert response.status_code == 200
    assert response.json() == 7


async def test_get_by_full_service_id_and_nested_function(http, provider):
    response = await http.get(f"/{provider.ws}/services/prov:pub/nested.sub?a=10&b=4")
    assert response.status_code == 200
    assert response.json() == 6


async def test_get_a_value_that_is_not_a_function_returns_it(http, provider):
    response = await http.get(f"/{provider.ws}/services/pub/version")
    assert response.status_code == 200
    assert response.json() == "1.2.3"


async def test_get_parses_json_query_values(http, provider):
    response = await http.get(f"/{provider.ws}/services/pub/echo", params={"value": '{"x": [1, 2]}'})
    assert response.status_code == 200
    assert response.json() == {"x": [1, 2]}


async def test_post_passes_a_json_object_as_keyword_arguments(http, provider):
    response = await http.post(f"/{provider.ws}/services/pub/add", json={"a": 10, "b": 5})
    assert response.status_code == 200
    assert response.json() == 15


async def test_post_with_an_empty_body_calls_without_arguments(http, provider):
    response = await http.post(f"/{provider.ws}/services/pub/echo")
    assert response.status_code == 200
    assert response.json() is None


async def test_a_msgpack_request_gets_a_msgpack_response(http, provider):
    response = await http.post(
        f"/{provider.ws}/services/pub/echo",
        content=msgpack.packb({"value": {"blob": b"\x00\x01", "n": 3}}, use_bin_type=True),
        headers={"Content-Type": "application/msgpack"},
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/msgpack"
    assert msgpack.unpackb(response.content, raw=False) == {"blob": b"\x00\x01", "n": 3}


async def test_an_unlisted_service_is_callable_by_id(http, provider):
    response = await http.get(f"/{provider.ws}/services/hidden/add?a=1&b=1")
    assert response.status_code == 200
    assert response.json() == 2


async def test_a_protected_service_without_a_token_is_403(http, provider):
    assert_error(await http.get(f"/{provider.ws}/services/prot/add?a=1&b=2"), 403, "Permission denied")


@pytest.mark.parametrize("scheme", ["Bearer", "raw", "Basic"])
async def test_a_protected_service_with_a_workspace_token_is_200(http, provider, scheme):
    token = await provider.api.generate_token()
    url = f"/{provider.ws}/services/prot/add?a=1&b=2"
    if scheme == "Bearer":
        response = await http.get(url, headers={"Authorization": f"Bearer {token}"})
    elif scheme == "raw":
        response = await http.get(url, headers={"Authorization": token})
    else:
        response = await http.get(url, auth=httpx.BasicAuth("anyone", token))
    assert response.status_code == 200, response.text
    assert response.json() == 3


async def test_a_token_in_an_access_token_cookie_is_no_credential(http, provider):
    """The hub never sets one; a browser would send it from any page of the site, without a preflight."""
    http.cookies.set("access_token", await provider.api.generate_token())
    assert_error(await http.get(f"/{provider.ws}/services/prot/add?a=1&b=2"), 403, "Permission denied")
    assert_error(await http.get("/api/status", headers={"Authorization": "Bearer garbage"}), 401, "Authentication")
    status = (await http.get("/api/status")).json()
    assert status["viewer"]["anonymous"], "the status API reads no cookie either"


async def test_a_garbage_bearer_token_is_401(http, provider):
    assert_error(
        await http.get(f"/{provider.ws}/services/pub/add?a=1&b=2", headers={"Authorization": "Bearer garbage"}),
        401,
        "Authentication error",
    )


async def test_an_unknown_service_is_404(http, provider):
    assert_error(await http.get(f"/{provider.ws}/services/nope/f"), 404, "Service not found")


async def test_an_unknown_workspace_is_404(http, provider):
    assert_error(await http.get("/no-such-workspace/services/pub/add"), 404, "not found")


async def test_an_unknown_function_is_404(http, provider):
    assert_error(await http.get(f"/{provider.ws}/services/pub/nofn"), 404, "nofn not found.")
    assert_error(await http.get(f"/{provider.ws}/services/pub/nested.nofn"), 404, "not found")


async def test_a_post_body_that_is_not_json_is_400(http, provider):
    response = await http.post(
        f"/{provider.ws}/services/pub/add",
        content=b"a=1&b=2",
        headers={"Content-Type": "application/json"},
    )
    assert_error(response, 400, "Request body is not valid JSON")


async def test_a_post_body_that_is_not_msgpack_is_400(http, provider):
    response = await http.post(
        f"/{provider.ws}/services/pub/add",
        content=b"\xc1\xc1",
        headers={"Content-Type": "application/msgpack"},
    )
    assert_error(response, 400, "Request body is not valid msgpack")


@pytest.mark.parametrize("body", [b"[1, 2]", b'"a"', b"3", b"null"], ids=["array", "string", "number", "null"])
async def test_a_json_body_that_is_not_an_object_is_400(http, provider, body):
    response = await http.post(
        f"/{provider.ws}/services/pub/add", content=body, headers={"Content-Type": "application/json"}
    )
    assert_error(response, 400, "must be an object of keyword arguments")


async def test_a_msgpack_body_that_is_not_a_map_is_400(http, provider):
    response = await http.post(
        f"/{provider.ws}/services/pub/add",
        content=msgpack.packb([1, 2]),
        headers={"Content-Type": "application/msgpack"},
    )
    assert_error(response, 400, "must be an object of keyword arguments")


async def test_a_body_above_the_size_limit_is_413(http, provider):
    response = await http.post(f"/{provider.ws}/services/pub/echo", json={"value": "x" * MAX_BODY})
    assert_error(response, 413, "above the limit")


async def test_a_streamed_body_above_the_size_limit_is_413(http, provider):
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"value": "'
        for _ in range(4):
            yield b"x" * (MAX_BODY // 2)
        yield b'"}'

    response = await http.post(
        f"/{provider.ws}/services/pub/echo",
        content=chunks(),
        headers={"Content-Type": "application/json"},
    )
    assert "content-length" not in response.request.headers
    assert_error(response, 413, "above the limit")


async def test_wrong_arguments_are_400(http, provider):
    response = await http.get(f"/{provider.ws}/services/pub/add?a=1&c=2")
    assert_error(response, 400, "TypeError")


async def test_a_value_error_in_the_service_is_400_with_its_message(http, provider):
    response = await http.post(f"/{provider.ws}/services/pub/fail", json={"message": "b must be positive"})
    assert_error(response, 400, "ValueError", "b must be positive")


async def test_a_service_slower_than_the_call_timeout_is_504(http, provider):
    loop = asyncio.get_running_loop()
    started = loop.time()
    response = await http.get(f"/{provider.ws}/services/pub/stall")
    assert_error(response, 504, "TimeoutError")
    assert loop.time() - started < CALL_TIMEOUT + 5


async def test_a_service_whose_client_left_is_404_not_a_hang(http, provider, server):
    await provider.api.disconnect()
    await eventually(lambda: f"{provider.ws}/prov" not in server.hub.peers, "the provider detached")
    assert_error(await http.get(f"/{provider.ws}/services/pub/add?a=1&b=2"), 404)


async def test_the_server_keeps_serving_after_every_kind_of_bad_request(http, provider, connect):
    base = f"/{provider.ws}/services"
    bad = [
        http.get(f"{base}/nope/f"),
        http.get(f"{base}/pub/nofn"),
        http.get(f"{base}/prot/add?a=1&b=2"),
        http.post(f"{base}/pub/add", content=b"{", headers={"Content-Type": "application/json"}),
        http.post(f"{base}/pub/add", json=[1]),
        http.post(f"{base}/pub/echo", json={"value": "x" * MAX_BODY}),
        http.get(f"{base}/pub/add", headers={"Authorization": "Bearer garbage"}),
        http.post(f"{base}/pub/fail", json={"message": "boom"}),
        http.get(f"{base}/pub/stall"),
    ]
    statuses = sorted(r.status_code for r in await asyncio.gather(*bad))
    assert statuses == [400, 400, 400, 401, 403, 404, 404, 413, 504]
    assert (await http.get(f"{base}/pub/add?a=3&b=4")).json() == 7
    api = await connect()
    assert await api.echo("ok") == "ok"

"""Apps a hypha-rpc client serves at ``/{workspace}/apps/{service_id}/...``: ASGI (a real FastAPI app)
and ``functions`` services, reached over plain HTTP through an in-process hub, as Hypha serves them.

Every request is a call of its user: the service's visibility decides who may reach it, the
provider sees who asked, and the request counts against the caller's calls in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from hypha_rpc import connect_to_server

from switchboard.config import Settings
from switchboard.testing.hub import RunningServer, running, settings_for_tests
from switchboard.testing.wait import scaled

pytestmark = pytest.mark.timeout(60)

MAX_BODY = 64 * 1024
MAX_RESPONSE = 256 * 1024
PENDING = 4
PIECE = 16 * 1024  # a piece of a streamed response: well within one frame (MAX_BODY)


@pytest.fixture
def settings() -> Settings:
    return settings_for_tests(
        max_message_bytes=MAX_BODY, max_app_response_bytes=MAX_RESPONSE, max_pending_calls=PENDING, call_timeout=5
    )


@pytest.fixture
async def http(server: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=scaled(20)) as client:
        yield client


class Site:
    """A FastAPI app, as a Hypha user writes one, and what its handlers saw."""

    def __init__(self) -> None:
        self.app = FastAPI()
        self.contexts: list[dict[str, Any] | None] = []
        self.release = asyncio.Event()  # lets /stream send its second half, /hold answer
        self.holding = 0
        app = self.app

        @app.get("/api")
        async def read(request: Request) -> dict[str, Any]:
            return {"message": "Hello World", "query": dict(request.query_params), "path": request.url.path}

        @app.put("/api")
        @app.post("/api")
        @app.patch("/api")
        async def write(request: Request) -> dict[str, Any]:
            data = await request.json()
            return {"message": f"{request.method} {data['name']}"}

        @app.delete("/api")
        async def delete() -> dict[str, str]:
            return {"message": "Deleted"}

        @app.get("/api/{item_id}")
        async def item(item_id: int) -> dict[str, int]:
            return {"item_id": item_id}

        @app.post("/upload")
        async def upload(request: Request) -> dict[str, int]:
            return {"size": len(await request.body())}

        @app.get("/headers")
        async def headers(request: Request) -> dict[str, Any]:
            return {"headers": dict(request.headers)}

        @app.get("/stream")
        async def stream() -> StreamingResponse:
            async def pieces() -> AsyncIterator[bytes]:
                yield b"first\n"
                await self.release.wait()
                yield b"second\n"

            return StreamingResponse(pieces(), media_type="text/plain")

        @app.get("/big")
        async def big() -> StreamingResponse:
            async def pieces() -> AsyncIterator[bytes]:
                for _ in range(2 * MAX_RESPONSE // PIECE):
                    yield b"x" * PIECE

            return StreamingResponse(pieces(), media_type="application/octet-stream")

        @app.get("/hold")
        async def hold() -> dict[str, bool]:
            self.holding += 1
            await self.release.wait()
            return {"held": True}

    async def serve(self, args: dict[str, Any], context: dict[str, Any] | None = None) -> None:
        self.contexts.append(context)
        await self.app(args["scope"], args["receive"], args["send"])


async def register_site(api: Any, service_id: str, visibility: str = "public") -> Site:
    site = Site()
    await api.register_service(
        {
            "id": service_id,
            "type": "asgi",
            "config": {"visibility": visibility, "require_context": True},
            "serve": site.serve,
        }
    )
    return site


async def test_a_fastapi_app_answers_every_method_path_and_query(connect, http):
    api = await connect(client_id="laptop")
    await register_site(api, "site")
    base = f"/{api.config['workspace']}/apps/site"

    got = await http.get(f"{base}/api", params={"q": "1"})
    assert got.status_code == 200, got.text
    assert got.json() == {"message": "Hello World", "query": {"q": "1"}, "path": "/api"}
    for method in ("PUT", "POST", "PATCH"):
        answer = await http.request(method, f"{base}/api", json={"name": "Alice"})
        assert answer.json() == {"message": f"{method} Alice"}
    assert (await http.delete(f"{base}/api")).json() == {"message": "Deleted"}
    assert (await http.get(f"{base}/api/7")).json() == {"item_id": 7}
    assert (await http.get(f"{base}/nowhere")).status_code == 404  # the app's own 404
    root = await http.get(base)
    assert root.status_code == 307
    assert root.headers["location"] == f"{base}/"


async def test_a_request_body_reaches_the_app_and_one_above_the_bound_is_refused(connect, http):
    api = await connect(client_id="laptop")
    await register_site(api, "site")
    base = f"/{api.config['workspace']}/apps/site"

    answer = await http.post(f"{base}/upload", content=b"a" * (MAX_BODY - 10))
    assert answer.json() == {"size": MAX_BODY - 10}
    refused = await http.post(f"{base}/upload", content=b"a" * (MAX_BODY + 1))
    assert refused.status_code == 413, refused.text
    assert "above the limit" in refused.json()["detail"]


async def test_a_streamed_response_reaches_the_client_piece_by_piece(connect, http):
    api = await connect(client_id="laptop")
    site = await register_site(api, "site")

    async with http.stream("GET", f"/{api.config['workspace']}/apps/site/stream") as response:
        assert response.headers.get("transfer-encoding") == "chunked"
        pieces = response.aiter_bytes()
        first = await asyncio.wait_for(pieces.__anext__(), scaled(10))  # before the app sends the rest
        assert first == b"first\n"
        site.release.set()
        rest = b"".join([piece async for piece in pieces])
    assert rest == b"second\n"


async def test_a_response_above_the_bound_is_cut_off(connect, http):
    api = await connect(client_id="laptop")
    await register_site(api, "site")

    received: list[bytes] = []

    async def download() -> None:
        async with http.stream("GET", f"/{api.config['workspace']}/apps/site/big") as response:
            received.extend([piece async for piece in response.aiter_bytes()])

    with pytest.raises(httpx.RemoteProtocolError):  # the body never completes
        await download()
    assert sum(map(len, received)) <= MAX_RESPONSE


async def test_an_app_that_does_not_start_its_response_in_time_gets_a_504_and_its_late_answer_goes_nowhere():
    async with running(settings_for_tests(call_timeout=0.5)) as srv, httpx.AsyncClient(base_url=srv.url) as http:
        api = await connect_to_server({"server_url": srv.url, "client_id": "laptop"})
        release, late = asyncio.Event(), asyncio.get_running_loop().create_future()

        async def serve(args: dict[str, Any]) -> None:
            await release.wait()
            try:
                await args["send"]({"type": "http.response.start", "status": 200, "headers": []})
            except Exception as exc:
                late.set_result(str(exc))
                raise

        try:
            await api.register_service(
                {"id": "slow", "type": "asgi", "config": {"visibility": "public"}, "serve": serve}
            )
            answer = await http.get(f"/{api.config['workspace']}/apps/slow/", timeout=scaled(10))
            assert answer.status_code == 504, answer.text
            release.set()
            assert "answered the request itself" in await asyncio.wait_for(late, scaled(10))
        finally:
            await api.disconnect()


async def test_concurrent_requests_are_all_answered(connect, http):
    api = await connect(client_id="laptop")
    await register_site(api, "site")
    base = f"/{api.config['workspace']}/apps/site"

    answers = await asyncio.gather(*(http.get(f"{base}/api/{i}", params={"_mode": "last"}) for i in range(PENDING)))
    assert [a.json()["item_id"] for a in answers] == list(range(PENDING))


async def test_requests_in_progress_count_as_the_callers_calls_in_flight(connect, http):
    api = await connect(client_id="laptop")
    site = await register_site(api, "site")
    base = f"/{api.config['workspace']}/apps/site"

    held = [asyncio.ensure_future(http.get(f"{base}/hold")) for _ in range(PENDING)]
    try:
        for _ in range(int(scaled(500))):
            if site.holding == PENDING:
                break
            await asyncio.sleep(0.01)
        assert site.holding == PENDING
        refused = await http.get(f"{base}/api")
        assert refused.status_code == 429, refused.text
        assert "Too many calls in flight" in refused.json()["detail"]
        assert int(refused.headers["Retry-After"]) >= 1
    finally:
        site.release.set()
        answers = await asyncio.gather(*held)
    assert all(a.json() == {"held": True} for a in answers)


async def test_the_app_sees_who_asked_and_their_token_but_never_the_hubs_cookies(connect, http):
    api = await connect(client_id="laptop")
    ws = api.config["workspace"]
    site = await register_site(api, "site")
    token = await api.generate_token()

    anonymous = await http.get(f"/{ws}/apps/site/api")
    assert anonymous.status_code == 200
    assert site.contexts[-1] is not None
    assert site.contexts[-1]["user"]["id"] == "anonymouz-http"
    assert site.contexts[-1]["from"] != f"{ws}/laptop"  # an address of its own, outside the workspace
    assert not site.contexts[-1]["from"].startswith(f"{ws}/")

    headers = {"Authorization": f"Bearer {token}", "Cookie": "sb_rpc_0123456789abcdef=stream-secret; theme=dark"}
    seen = (await http.get(f"/{ws}/apps/site/headers", headers=headers)).json()["headers"]
    assert seen["authorization"] == f"Bearer {token}"
    assert seen["cookie"] == "theme=dark"
    member = site.contexts[-1]["user"]
    assert member["id"] != "anonymouz-http"
    assert member["scope"]["workspaces"][ws] == "rw"
    assert site.contexts[-1]["ws"] == ws


async def test_a_protected_app_admits_its_workspace_and_refuses_outsiders(connect, http):
    api = await connect(client_id="laptop")
    ws = api.config["workspace"]
    site = await register_site(api, "private", visibility="protected")
    member = await api.generate_token({"permission": "read"})
    outsider = await (await connect(client_id="stranger")).generate_token()

    assert (await http.get(f"/{ws}/apps/private/api")).status_code == 403
    refused = await http.get(f"/{ws}/apps/private/api", headers={"Authorization": f"Bearer {outsider}"})
    assert refused.status_code == 403, refused.text
    assert site.contexts == [], "the app never ran for the outsiders"
    admitted = await http.get(f"/{ws}/apps/private/api", headers={"Authorization": f"Bearer {member}"})
    assert admitted.status_code == 200, admitted.text


async def test_a_missing_service_or_workspace_is_a_404_with_hyphas_words(connect, http):
    api = await connect(client_id="laptop")
    await api.register_service({"id": "plain", "config": {"visibility": "public"}, "f": lambda: 1})

    missing = await http.get("/public/apps/no-such-service/whatever")
    assert missing.status_code == 404
    assert "Service not found" in missing.text
    unknown = await http.get("/ws-does-not-exist-xyz/apps/no-such-svc/whatever")
    assert unknown.status_code == 404
    assert "Workspace ws-does-not-exist-xyz does not exist or is not accessible" in unknown.text
    not_an_app = await http.get(f"/{api.config['workspace']}/apps/plain/")
    assert not_an_app.status_code == 400
    assert "Invalid service type: generic" in not_an_app.text


async def test_a_functions_service_serves_each_function_as_an_endpoint(connect, http):
    api = await connect(client_id="laptop")
    ws = api.config["workspace"]
    token = await api.generate_token()
    events: list[dict[str, Any]] = []

    def answer(text: str) -> Any:
        async def function(event: dict[str, Any]) -> dict[str, Any]:
            events.append(event)
            return {"status": 201, "headers": {"X-Served-By": text}, "body": text}

        return function

    await api.register_service(
        {
            "id": "fns",
            "type": "functions",
            "config": {"visibility": "public"},
            "index": answer("home"),
            "hello": answer("hello"),
            "api": {"v1": {"users": answer("users")}},
            "default": answer("fallback"),
        }
    )
    base = f"/{ws}/apps/fns"
    for path, served in (("/", "home"), ("/hello", "hello"), ("/api/v1/users", "users"), ("/some/where", "fallback")):
        got = await http.get(f"{base}{path}")
        assert (got.status_code, got.text, got.headers["x-served-by"]) == (201, served, served)
    assert events[-1]["function_path"] == "/some/where"

    posted = await http.post(
        f"{base}/hello?x=1", content=b'{"a": 1}', headers={"Authorization": f"Bearer {token}", "X-Extra": "yes"}
    )
    assert posted.status_code == 201
    event = events[-1]
    assert (event["method"], event["path"], event["query_string"], event["body"]) == (
        "POST",
        "/hello",
        "x=1",
        b'{"a": 1}',
    )
    assert event["headers"]["x-extra"] == "yes"
    assert event["user"]["id"] != "anonymouz-http"
    assert event["user"]["scope"]["workspaces"][ws] == "rw"

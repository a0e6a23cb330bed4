"""An app served from a client on one replica, requested over HTTP at another (real processes, real Valkey)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from switchboard.testing.wait import scaled

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


async def test_an_app_on_one_replica_answers_requests_arriving_at_the_other(replicas, clients):
    a, b = replicas.start("ra"), replicas.start("rb")
    laptop = await clients(b.url, client_id="laptop")  # the provider sits on replica B
    ws = laptop.config["workspace"]
    release = asyncio.Event()
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, Any]:
        return {"size": len(await request.body()), "q": request.query_params.get("q")}

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        async def pieces() -> AsyncIterator[bytes]:
            yield b"first\n"
            await release.wait()
            yield b"second\n"

        return StreamingResponse(pieces(), media_type="text/plain")

    async def serve(args: dict[str, Any]) -> None:
        await app(args["scope"], args["receive"], args["send"])

    async def hello(event: dict[str, Any]) -> dict[str, Any]:
        return {"status": 200, "body": f"hello {event['method']}"}

    await laptop.register_service({"id": "site", "type": "asgi", "config": {"visibility": "public"}, "serve": serve})
    await laptop.register_service({"id": "fns", "type": "functions", "config": {"visibility": "public"}, "hi": hello})

    async def serve_own(
        args: dict[str, Any],
    ) -> None:  # a function of its own: hypha-rpc keys a function's service by it
        await app(args["scope"], args["receive"], args["send"])

    await laptop.register_service(
        {"id": "own", "type": "asgi", "config": {"visibility": "protected"}, "serve": serve_own}
    )

    async with httpx.AsyncClient(base_url=a.url, timeout=scaled(20)) as http:  # every request at replica A
        answers = await asyncio.gather(
            *(http.post(f"/{ws}/apps/site/echo", params={"q": i}, content=b"x" * 1000 * i) for i in range(8))
        )
        assert [r.json() for r in answers] == [{"size": 1000 * i, "q": str(i)} for i in range(8)]
        assert (await http.get(f"/{ws}/apps/fns/hi")).text == "hello GET"
        assert (await http.get(f"/{ws}/apps/own/echo")).status_code == 403

        async with http.stream("GET", f"/{ws}/apps/site/stream") as response:
            pieces = response.aiter_bytes()
            assert await asyncio.wait_for(pieces.__anext__(), scaled(10)) == b"first\n"
            release.set()
            assert b"".join([piece async for piece in pieces]) == b"second\n"

"""hypha-rpc's JavaScript client over the HTTP-streaming transport, in Node and in Chromium.

In Chromium the page comes from another origin than the hub (CORS: the
preflights of ``/rpc`` must be answered). With a token, everything works;
anonymous, the client keeps no cookie there (Node's fetch keeps none, a
cross-origin page gets none), and the refusal it logs says to use a token.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.timeout(60)]


async def test_http_transport_with_a_token(start_agent, server, connect):
    py = await connect(client_id="py")
    token = await py.generate_token()
    agent = await start_agent(server_url=server.url, transport="http", token=token, client_id="js-http")
    assert agent.workspace == py.config["workspace"], "the token's workspace"
    js = await py.get_service(agent.service_id)
    assert await js.ping() == "pong"
    assert await js.describe({"b": b"\x00\xff", "n": None}) == {"b": "Uint8Array[0,255]", "n": "null"}
    assert await js.callBack(lambda x: x + 1, 41) == 42
    assert [i async for i in await js.count(3)] == [0, 1, 2]
    if agent.page is not None:
        assert not agent.page.errors(), agent.log()


async def test_anonymous_http_transport_is_refused_with_the_remedy(start_agent, server):
    agent = await start_agent(
        server_url=server.url, transport="http", client_id="js-anon", method_timeout=3, wait=False
    )
    await agent.wait_log("must connect with a token", timeout=15)
    assert "README" in agent.log()

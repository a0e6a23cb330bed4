"""switchboard_registered_services follows what the connected clients hold."""

from __future__ import annotations

import re

import httpx

from switchboard.testing.wait import eventually


async def services_gauge(url: str) -> float:
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{url}/metrics", timeout=5)).text
    found = re.search(r'^switchboard_registered_services\{replica="[^"]+"\} (\S+)$', text, re.M)
    assert found, "switchboard_registered_services missing"
    return float(found.group(1))


async def test_the_services_gauge_counts_registrations_and_forgets_a_client_that_left(server, connect):
    client = await connect(client_id="counted")
    base = await services_gauge(server.url)  # its built-in service
    await client.register_service({"id": "a", "f": lambda: 1})
    await client.register_service({"id": "b", "f": lambda: 1})
    assert await services_gauge(server.url) == base + 2
    await client.register_service({"id": "a", "f": lambda: 2}, {"overwrite": True})  # still one
    assert await services_gauge(server.url) == base + 2
    await client.unregister_service("b")
    assert await services_gauge(server.url) == base + 1
    await client.disconnect()

    async def back_to_zero() -> bool:
        return await services_gauge(server.url) == 0

    await eventually(back_to_zero, timeout=5, what="no services once the client left")

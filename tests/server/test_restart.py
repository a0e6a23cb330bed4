"""A hub restarted with the same secret and server id takes its clients back."""

from __future__ import annotations

import dataclasses

import pytest
from hypha_rpc import connect_to_server

from switchboard.server.runner import bind, running
from switchboard.testing.wait import eventually

pytestmark = pytest.mark.timeout(60)


async def test_clients_resume_after_a_restart_with_their_services(settings):
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    settings = dataclasses.replace(settings, port=port)
    async with running(settings):
        provider = await connect_to_server(
            {"server_url": f"http://127.0.0.1:{port}", "client_id": "prov", "method_timeout": 10}
        )
        ws = provider.config["workspace"]
        await provider.register_service({"id": "s", "config": {"visibility": "public"}, "f": lambda: "alive"})
    # the hub is gone; its memory with it. A new process on the same port:
    async with running(settings) as again:
        await eventually(lambda: f"{ws}/prov" in again.hub.peers, "the client back", timeout=20, interval=0.05)
        caller = await connect_to_server({"server_url": again.url, "client_id": "caller"})
        try:
            svc = await eventually(lambda: caller.get_service(f"{ws}/prov:s"), "the service listed again", timeout=10)
            assert await svc.f() == "alive"
            assert await provider.echo("still here") == "still here"
        finally:
            await caller.disconnect()
            await provider.disconnect()

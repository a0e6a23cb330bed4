"""A hub alone (no Redis: no sibling) stops without waiting out the grace of a client that dropped.

A provider's connection drops without a goodbye, so it is in transit and a call
to it is held for it. With siblings, the drain waits (bounded by the grace) for
the client to come back to one of them and for what is held here to follow it.
Alone, nobody can take it back while the hub drains (new connections get 503)
and what is held dies with the process: waiting would only delay the restart
the client is waiting for.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

import pytest
from hypha_rpc import connect_to_server

from switchboard.testing.hub import running, settings_for_tests
from switchboard.testing.proxy import FaultProxy
from switchboard.testing.wait import eventually

pytestmark = pytest.mark.timeout(60)

GRACE = 30.0  # far longer than the stop may take: waiting it out cannot pass for a slow machine
STOP_WITHIN = 10.0


async def test_a_hub_alone_stops_at_once_though_it_holds_a_call_for_a_dropped_client() -> None:
    async with running(settings_for_tests(transit_grace=GRACE)) as srv:
        address = urlsplit(srv.url)
        async with FaultProxy(address.hostname or "127.0.0.1", address.port or 80) as proxy:
            provider = await connect_to_server({"server_url": f"http://127.0.0.1:{proxy.port}", "client_id": "prov"})
            await provider.register_service({"id": "echo", "echo": lambda x: x})
            caller = await connect_to_server(
                {
                    "server_url": srv.url,
                    "client_id": "caller",
                    "workspace": provider.config.workspace,
                    "token": await provider.generate_token(),
                    "method_timeout": 20,
                }
            )
            echo = await caller.get_service("prov:echo")
            assert await echo.echo(1) == 1

            proxy.drop_new()  # the provider's reconnection attempts go nowhere
            proxy.reset_all()  # its connection drops without a goodbye: it is in transit
            await eventually(lambda: len(srv.hub.transit) == 1, "the provider in transit")
            call = asyncio.ensure_future(echo.echo(2))
            await eventually(lambda: srv.hub.transit.holding == 1, "the call held for the provider")
            await asyncio.wait_for(caller.disconnect(), 5)  # the drain has no call of its to wait for
            await eventually(lambda: not srv.hub.peers, "the caller gone")
            assert srv.hub.transit.holding == 1, "the call is still held for the provider"

            started = time.monotonic()
            await srv.server.stop()
            took = time.monotonic() - started
            call.cancel()
            await asyncio.wait_for(provider.disconnect(), 5)
    assert took < STOP_WITHIN, f"the stop took {took:.1f} s: it waited for a client nobody can take back"

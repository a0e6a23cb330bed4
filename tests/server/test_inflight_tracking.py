"""The hub knows which calls are in flight, and forgets each one when it is answered.

A drain waits for these calls, so one that is never forgotten would hold a
SIGTERM for the whole drain timeout.
"""

from __future__ import annotations

import asyncio

import pytest

from switchboard.testing.wait import eventually

pytestmark = pytest.mark.timeout(60)


async def test_answered_calls_leave_nothing_in_flight_small_or_chunked(connect, server):
    provider = await connect(client_id="prov")
    await provider.register_service(
        {
            "id": "s",
            "config": {"visibility": "public"},
            "small": lambda: 1,
            "big": lambda: b"x" * 3_000_000,  # the reply travels in chunks
            "size": lambda data: len(data),  # the call travels in chunks
            "fail": lambda: 1 / 0,
        }
    )
    caller = await connect(client_id="caller")
    svc = await caller.get_service(f"{provider.config['workspace']}/prov:s")
    assert await svc.small() == 1
    assert len(await svc.big()) == 3_000_000
    assert await svc.size(b"y" * 3_000_000) == 3_000_000
    with pytest.raises(Exception, match="division"):
        await svc.fail()
    # the last reply may still be on its way through the hub
    await eventually(lambda: len(server.hub.inflight) == 0, "no call left in flight", timeout=1.0)


async def test_a_call_waiting_for_its_reply_is_in_flight(connect, server):
    provider = await connect(client_id="prov")
    release = asyncio.Event()

    async def wait():
        await release.wait()
        return "done"

    await provider.register_service({"id": "s", "config": {"visibility": "public"}, "wait": wait})
    caller = await connect(client_id="caller")
    svc = await caller.get_service(f"{provider.config['workspace']}/prov:s")
    call = asyncio.ensure_future(svc.wait())
    prov_id = f"{provider.config['workspace']}/prov"
    await eventually(lambda: server.hub.inflight.busy(prov_id), "the call in flight", timeout=2.0)
    release.set()
    assert await call == "done"

"""The JavaScript client rides out a hub restart and a drain, in Node and in Chromium.

A draining replica closes its clients with 1012; hypha-rpc's JavaScript client
redials at once. A close *during* that handshake is final for it
(``ConnectionAbortedError``), so a replica must refuse upgrades while it
drains (HTTP 503, which both clients retry) instead of accepting and closing.
On one replica (embedded) and across two sharing a real Valkey: there the
JavaScript client and the slow provider are on the replica that restarts,
the callers on the other one.
"""

from __future__ import annotations

import asyncio
import signal

import httpx
import pytest

from switchboard.testing.replica import ReplicaProcess
from switchboard.testing.wait import eventually

pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]


async def _callable(clients, url: str, service_id: str) -> None:
    checker = await clients(url)
    try:

        async def answers() -> bool:
            js = await checker.get_service(service_id)
            return await js.ping() == "pong"

        await eventually(answers, timeout=30, what=f"{service_id} callable again", interval=0.25)
    finally:
        await checker.disconnect()


async def _calls_in_flight(replica: ReplicaProcess) -> bool:
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{replica.url}/metrics", timeout=2)).text
    return any(
        line.startswith("switchboard_calls_in_flight{") and float(line.split()[-1]) > 0 for line in text.splitlines()
    )


@pytest.mark.parametrize("topology", ["one replica", "two replicas"])
async def test_js_client_comes_back_after_a_restart_and_after_a_drain_with_a_call_in_flight(
    start_agent, clients, topology, request
):
    if topology == "one replica":
        replica = ReplicaProcess(replica_id="solo").start()
        other = replica
    else:
        start = request.getfixturevalue("replicas")
        replica, other = start("ra"), start("rb")
    agent = None
    try:
        agent = await start_agent(server_url=replica.url, client_id="js-drained")
        provider = await clients(replica.url, client_id="prov")

        async def slow(seconds: float) -> str:
            await asyncio.sleep(seconds)
            return "finished"

        await provider.register_service({"id": "s", "config": {"visibility": "public"}, "slow": slow})
        caller = await clients(other.url, client_id="caller")
        js = await caller.get_service(agent.service_id)
        assert await js.ping() == "pong"

        # a plain restart
        replica.restart()
        await _callable(clients, other.url, agent.service_id)

        # a drain held open by a call in flight: the idle JavaScript client is
        # told to leave at once and redials while the replica still drains
        svc = await caller.get_service(f"{provider.config['workspace']}/prov:s")
        call = asyncio.ensure_future(svc.slow(3.0))
        await eventually(lambda: _calls_in_flight(replica), timeout=5, what="the call reaching the replica")
        replica.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(call, 15) == "finished"
        assert await asyncio.to_thread(replica.proc.wait, 15) == 0
        replica.start()
        await _callable(clients, other.url, agent.service_id)
    except BaseException:
        if agent is not None:
            print(f"--- {agent.runtime} agent log ---\n{agent.log()}")
        print(f"--- replica log ---\n{replica.log_tail()}")
        raise
    finally:
        replica.kill()

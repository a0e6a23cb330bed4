"""The JavaScript client that reconnects while its replica's Redis is away comes back with Redis.

hypha-rpc's JavaScript client takes a close before ``connection_info`` as
final. A replica whose Redis does not answer cannot admit anyone (the
connection counters and the registry live there), so it must turn the upgrade
away *before* accepting it, with HTTP 503 as a draining replica does, and not
accept it and then close with 1013: the client would stop for good.
"""

from __future__ import annotations

import contextlib
import os
import signal

import httpx
import pytest

from switchboard.testing import ThreadedFaultProxy
from switchboard.testing.replica import ReplicaProcess
from switchboard.testing.wait import eventually

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


async def _ready(replica: ReplicaProcess, status: int) -> bool:
    async with httpx.AsyncClient() as http:
        return (await http.get(f"{replica.url}/health/readiness", timeout=2)).status_code == status


@pytest.mark.parametrize("start_agent", ["node"], indirect=True)
async def test_js_client_redialling_during_a_redis_pause_comes_back_once_redis_does(start_agent, clients, redis_server):
    replica = ReplicaProcess(replica_id="ra", redis_url=redis_server.url).start()
    agent = None
    paused = False
    try:
        with ThreadedFaultProxy("127.0.0.1", replica.port) as network:  # the client's network path
            agent = await start_agent(server_url=f"http://127.0.0.1:{network.port}", client_id="js-blip")
            checker = await clients(replica.url, client_id="checker")

            assert redis_server.pid is not None
            os.kill(redis_server.pid, signal.SIGSTOP)  # Redis paused: no error, no answer
            paused = True
            await eventually(lambda: _ready(replica, 503), timeout=15, interval=0.1, what="readiness 503")
            dialled = network.stats.accepted
            network.reset_all()  # the client's connection drops now: it redials a replica without Redis
            # turned away (503), it keeps trying: a client that took a refusal as final dials no more
            await eventually(
                lambda: network.stats.accepted >= dialled + 2,
                timeout=15,
                interval=0.1,
                what="the client turned away and redialling",
            )
            os.kill(redis_server.pid, signal.SIGCONT)
            paused = False
            await eventually(lambda: _ready(replica, 200), timeout=15, interval=0.1, what="readiness 200")

            async def answers() -> bool:
                js = await checker.get_service(agent.service_id)
                return await js.ping() == "pong"

            await eventually(answers, timeout=30, interval=0.25, what="the JavaScript client back and callable")
    except BaseException:
        if agent is not None:
            print(f"--- {agent.runtime} agent log ---\n{agent.log()}")
        print(f"--- replica log ---\n{replica.log_tail()}")
        raise
    finally:
        if paused and redis_server.pid is not None:
            with contextlib.suppress(OSError):
                os.kill(redis_server.pid, signal.SIGCONT)
        replica.kill()

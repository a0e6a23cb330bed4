"""A SIGTERMed replica exits within its stop budget, counted from the signal, even when its stop hangs.

Once a replica draining 6,000 clients on a starved loop exited 277 s after
SIGTERM with a 10 s drain timeout: the watch that ends a hung stop
(:class:`~switchboard.server.process.stop_deadline.StopDeadline`) started only after
the drain, and the drain itself did not keep its bound. Here the stop hangs
for real: the replica's Valkey is paused (SIGSTOP: no error, no answer) when
SIGTERM comes, and every Redis command of the drain and of the stop waits out
its timeout. The drain's own bound is 2 s (``--drain-timeout 1``,
``--transit-grace 1``); unwatched, this stop takes some 14 s.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from switchboard.server import runner
from switchboard.server.process.stop_deadline import REPORT_WAIT
from switchboard.testing.replica import ReplicaProcess

pytestmark = [pytest.mark.cluster, pytest.mark.alone, pytest.mark.timeout(90)]

DRAIN, GRACE = 1.0, 1.0
BUDGET = runner.stop_budget(drain_timeout=DRAIN, transit_grace=GRACE)
EXIT_SLACK = 1.5  # the process's own exit once the watch decided, on a shared machine


async def test_a_stop_hung_on_a_paused_valkey_ends_with_status_1_within_the_budget_and_says_where(
    redis_server, clients
) -> None:
    replica = ReplicaProcess(
        replica_id="ra",
        redis_url=redis_server.url,
        args=["--drain-timeout", str(DRAIN), "--transit-grace", str(GRACE)],
    ).start()
    client = await clients(replica.url, client_id="held")  # a client to hand over: the drain has work
    await client.register_service({"id": "s", "config": {"visibility": "public"}, "f": lambda: 1})
    assert replica.proc is not None
    assert redis_server.pid is not None
    os.kill(redis_server.pid, signal.SIGSTOP)
    try:
        signalled = time.monotonic()
        replica.proc.send_signal(signal.SIGTERM)
        try:
            code = replica.proc.wait(BUDGET + REPORT_WAIT + 30)
        finally:
            took = time.monotonic() - signalled
            replica.kill()
    finally:
        os.kill(redis_server.pid, signal.SIGCONT)
    log = replica.log_tail(400_000)
    assert code == 1, f"exit status {code} after {took:.1f}s (budget {BUDGET:.1f}s from the signal)"
    assert took < BUDGET + REPORT_WAIT + EXIT_SLACK, f"exited {took:.1f}s after SIGTERM, budget {BUDGET:.1f}s"
    assert f"still running {BUDGET:.1f} s after being told to stop" in log
    assert "threads:" in log
    # the phase that hung, with what it awaits frame by frame: the drain (the stop's own task)
    # or, once the drain gave up, the hub's stop under uvicorn's shutdown
    assert "task stop:" in log or "await self.lifespan.shutdown()" in log, log[-3000:]
    print(f"hung stop -> exit {code} in {took:.2f}s (budget {BUDGET:.1f}s)")

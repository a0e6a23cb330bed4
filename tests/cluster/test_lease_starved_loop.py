"""A replica whose event loop stalls keeps its leader lease and presence; a stopped process loses them.

Under a 6,000-client storm both replicas' loops starved and the lease went
unrenewed for 14-15 s; a lapsed presence record also lets a sibling's reaper
treat the replica as gone. Here a real replica's loop really stops turning:
its log output goes to a pipe (a log collector, say) that stops being read,
so the next line it logs blocks the loop in ``write`` for as long as the pipe
stays full, :data:`STALL` seconds, longer than both the lease's TTL and the
presence record's. The lease and the record must live through it: they are
renewed on a thread of their own, which keeps doing so while the loop has
turned within :data:`~switchboard.replicas.upkeep.lease.LOOP_STALL_LIMIT`.

A process that no longer runs at all (SIGSTOP) must lose both on time.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from switchboard.replicas.upkeep.cluster import PRESENCE_TTL
from switchboard.replicas.upkeep.liveness import LOOP_STALL_LIMIT
from switchboard.testing import ValkeyServer
from switchboard.testing.crowd import admin_token, open_raw
from switchboard.testing.replica import ReplicaProcess
from switchboard.testing.wait import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.alone, pytest.mark.timeout(120)]

LEASE_TTL = 1.5  # renewed every 0.5 s, trusted until 1.2 s after a renewal
STALL = PRESENCE_TTL + 2.0  # longer than the lease's life and the presence record's
F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ (Linux), named in fcntl only from Python 3.10 on some builds
PIPE_BYTES = 4096  # the smallest pipe: a few dozen log lines fill it


def leader(redis: ValkeyServer) -> str | None:
    with redis.client() as r:
        holder = r.get("sb:leader")
    return holder.decode().partition("#")[0] if holder else None


def present(redis: ValkeyServer) -> bool:
    with redis.client() as r:
        return bool(r.exists("sb:presence:ra"))


def answers(url: str) -> bool:
    """Whether the replica's loop answers an HTTP request within 0.3 s."""
    try:
        return httpx.get(f"{url}/health/liveness", timeout=0.3).status_code == 200
    except httpx.HTTPError:
        return False


class LogPipe:
    """The replica's log output, read by a thread that can stop reading (the pipe then fills)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self.fd = proc.stdout.fileno()
        fcntl.fcntl(self.fd, F_SETPIPE_SZ, PIPE_BYTES)
        self.flowing = threading.Event()
        self.flowing.set()
        self.text = bytearray()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while True:  # ends at the end of the stream: the replica exited
            self.flowing.wait()
            chunk = os.read(self.fd, 65536)
            if not chunk:
                return
            self.text += chunk

    def tail(self, limit: int = 6000) -> str:
        return self.text[-limit:].decode(errors="replace")


@contextlib.contextmanager
def replica_on_a_pipe(redis: ValkeyServer) -> Iterator[tuple[ReplicaProcess, subprocess.Popen[bytes], LogPipe]]:
    replica = ReplicaProcess(
        replica_id="ra", redis_url=redis.url, args=["--leader-lease-ttl", str(LEASE_TTL), "--no-links"]
    )
    env = {**os.environ, "SWITCHBOARD_STATE_DIR": str(replica.state_dir)}
    proc = subprocess.Popen(replica.command(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    pipe = LogPipe(proc)
    try:
        yield replica, proc, pipe
    finally:
        pipe.flowing.set()
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        pipe.thread.join(5)  # the end of the stream ends it
        assert proc.stdout is not None
        proc.stdout.close()


async def stall(replica: ReplicaProcess, pipe: LogPipe, redis: ValkeyServer, seconds: float) -> dict[str, float]:
    """Block the replica's loop for ``seconds`` (its log pipe full); return what lapsed meanwhile
    (the lease, the presence record) and how long into the stall each was first seen gone."""
    await eventually(lambda: answers(replica.url), "the replica serves", timeout=20)
    await eventually(lambda: leader(redis) == "ra", "ra leads", timeout=10)
    await eventually(lambda: present(redis), "ra's presence record", timeout=10)
    token = admin_token("busy")
    conns: list[Any] = []
    lapses: dict[str, float] = {}
    pipe.flowing.clear()  # the collector stops reading: the next log lines fill the pipe
    try:
        for n in range(200):  # each connection logs a line; a few dozen fill the pipe
            if not answers(replica.url):
                break
            with contextlib.suppress(Exception):
                conns.append(await open_raw(replica.url, f"c{n}", token, timeout=0.5))
        assert not answers(replica.url), "the loop never blocked: the log pipe did not fill"
        stalled_at = time.monotonic()
        for _ in range(int(seconds / 0.25) + 1):  # watch the stall, bounded
            if time.monotonic() - stalled_at >= seconds:
                break
            if leader(redis) != "ra":
                lapses.setdefault("lease", round(time.monotonic() - stalled_at, 1))
            if not present(redis):
                lapses.setdefault("presence", round(time.monotonic() - stalled_at, 1))
            await asyncio.sleep(0.25)
        assert not answers(replica.url), "the loop turned during the stall: it was not one"
        assert time.monotonic() - stalled_at >= seconds
    finally:
        pipe.flowing.set()
    await eventually(lambda: answers(replica.url), "the loop turns again", timeout=20)
    for conn in conns:
        with contextlib.suppress(Exception):
            await conn.ws.close()
    return lapses


async def test_a_loop_stalled_longer_than_the_lease_and_presence_ttls_keeps_both(redis_server) -> None:
    assert STALL < LOOP_STALL_LIMIT, "a loop stalled longer counts as hung (and loses both)"
    with replica_on_a_pipe(redis_server) as (replica, _, pipe):
        lapses = await stall(replica, pipe, redis_server, STALL)
        assert not lapses, (
            f"loop stalled {STALL:.1f}s (lease ttl {LEASE_TTL}s, presence {PRESENCE_TTL}s); lapsed: {lapses}"
        )
        assert leader(redis_server) == "ra"
        assert "lost lease" not in pipe.tail(200_000)


async def test_a_loop_stalled_past_the_limit_loses_its_lease_and_then_its_presence(redis_server) -> None:
    """A loop hung for good serves nobody: its lease goes to a sibling and its record lapses, soon
    after the limit (the lease within its TTL, the record within its own), never before it."""
    with replica_on_a_pipe(redis_server) as (replica, _, pipe):
        lapses = await stall(replica, pipe, redis_server, LOOP_STALL_LIMIT + PRESENCE_TTL + 2.0)
    detected = 2.0  # the test sees the loop blocked up to this late (its probes' timeouts)
    assert {"lease", "presence"} <= lapses.keys(), f"a loop hung past the limit kept them; lapsed only: {lapses}"
    assert LOOP_STALL_LIMIT - detected <= lapses.get("lease", -1) <= LOOP_STALL_LIMIT + LEASE_TTL + 0.5, lapses
    assert LOOP_STALL_LIMIT - detected <= lapses.get("presence", -1) <= LOOP_STALL_LIMIT + PRESENCE_TTL + 0.5, lapses


async def test_a_stopped_process_loses_its_lease_and_presence_on_time(redis_server) -> None:
    with replica_on_a_pipe(redis_server) as (replica, proc, pipe):
        await eventually(lambda: answers(replica.url), "the replica serves", timeout=20)
        await eventually(lambda: leader(redis_server) == "ra", "ra leads", timeout=10)
        await eventually(lambda: present(redis_server), "ra's presence record", timeout=10)
        os.kill(proc.pid, signal.SIGSTOP)  # every thread stops: the liveness thread with the loop
        try:
            stopped_at = time.monotonic()
            await eventually(lambda: leader(redis_server) is None, "the lease expired", timeout=LEASE_TTL + 1)
            lease_gone = time.monotonic() - stopped_at
            await eventually(lambda: not present(redis_server), "the presence expired", timeout=PRESENCE_TTL + 1)
            presence_gone = time.monotonic() - stopped_at
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert lease_gone <= LEASE_TTL + 0.5, lease_gone
        assert presence_gone <= PRESENCE_TTL + 0.5, presence_gone

"""What an idle hypha-rpc connection holds on its replica (issue 26: at most 25 KiB each).

Ten thousand idle clients on one replica multiply whatever each one keeps: a
task is about a KiB (its coroutine's frames, the future it waits on), and
every hypha-rpc client registers a ``built-in`` service whose schema, 7 KiB of
Python objects, is the same for every client of one version.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import switchboard
from support.debug_loop import WEIGHS_MEMORY
from support.tokens import credential
from switchboard.hub.identity.users import user_workspace
from switchboard.testing.hub import RunningServer
from switchboard.testing.wait import eventually, scaled

pytestmark = [pytest.mark.timeout(60), pytest.mark.no_asyncio_debug(WEIGHS_MEMORY)]

SOURCE = str(Path(switchboard.__file__).parent)
# the ASGI app's task (the connection's endpoint, reading); a writer runs only while frames wait
TASKS_PER_CONNECTION = 1


# Python objects one idle hypha-rpc connection keeps on the hub (tracemalloc), beside the kernel's
# socket buffers. Issue 26 asks for at most 25 KiB of RSS, of which the allocator's own overhead
# takes about 2 KiB. Measured here: 27.0 KiB on main at 642c9a8, 17.5 KiB once /ws is served
# outside Starlette's stack, with one task, no idle deques and no request headers kept.
TRACED_BYTES_PER_CONNECTION = 19.5 * 1024
CROWD = Path(__file__).parents[1] / "support" / "hypha_crowd.py"
WARM_UP = 20  # clients connected before the measure: the workspace, the shared schema and caches exist
MEASURED = 200


def hub_tasks() -> int:
    """Tasks running the hub's own code (its clients' tasks run hypha-rpc's)."""
    count = 0
    for task in asyncio.all_tasks():
        code = getattr(task.get_coro(), "cr_code", None)
        if code is not None and code.co_filename.startswith(SOURCE):
            count += 1
    return count


async def test_an_idle_connection_holds_no_task_but_its_endpoint(server: RunningServer, connect: Any) -> None:
    before = hub_tasks()
    clients = 5
    for i in range(clients):
        await connect(client_id=f"idle-{i}")
    await eventually(lambda: len(server.hub.peers) == clients, what="every client attached")

    def per_connection() -> float:
        return (hub_tasks() - before) / clients

    # the connects' manager calls end within the bound; what stays is what an idle connection holds
    with contextlib.suppress(AssertionError):
        await eventually(lambda: per_connection() <= TASKS_PER_CONNECTION, what="the connects' calls over")
    assert per_connection() <= TASKS_PER_CONNECTION, f"{per_connection()} tasks per idle connection"


async def test_clients_of_one_hypha_rpc_version_keep_one_copy_of_the_built_in_schema(
    server: RunningServer, connect: Any
) -> None:
    a = await connect(client_id="a")
    b = await connect(client_id="b")
    infos = []
    for client in (a, b):
        peer = server.hub.peers[f"{client.config['workspace']}/{client.config['client_id']}"]
        infos.append(server.hub.manager.directory.services_of(peer)[f"{peer.id}:built-in"])
    assert infos[0]["service_schema"] == infos[1]["service_schema"]
    assert infos[0]["service_schema"] is infos[1]["service_schema"], "two copies of one schema"
    assert infos[0]["id"] != infos[1]["id"]


@contextlib.asynccontextmanager
async def crowd(url: str, count: int, prefix: str, cookie_bytes: int = 0) -> AsyncIterator[int]:
    """``count`` hypha-rpc clients in one workspace, held idle by a child process (so that
    tracemalloc here sees the hub's allocations only), each sending a cookie of ``cookie_bytes``
    with its upgrade request; yields how many connected."""
    token, _ = credential("idle-crowd", 600)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(CROWD),
        url,
        token,
        user_workspace("idle-crowd"),
        str(count),
        prefix,
        str(cookie_bytes),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), scaled(60))
        yield int(line.split()[1]) if line.startswith(b"ready") else 0
    finally:
        proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


def traced() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("cookie_bytes", [0, 4096], ids=["plain", "with-a-4-kib-cookie"])
async def test_an_idle_hypha_rpc_connection_keeps_at_most_19_5_kib_of_python_objects_on_the_hub(
    server: RunningServer, cookie_bytes: int
) -> None:
    """Whatever its upgrade request carried (a browser's cookies, say): the headers served the
    handshake and are not kept."""
    base = hub_tasks()
    tracemalloc.start()
    try:
        async with crowd(server.url, WARM_UP, "warm") as warm:
            assert warm == WARM_UP
            await eventually(lambda: len(server.hub.peers) == WARM_UP, what="the warm-up clients attached")
            with contextlib.suppress(AssertionError):  # their connects' calls over
                await eventually(
                    lambda: hub_tasks() - base <= WARM_UP * TASKS_PER_CONNECTION, what="settled", timeout=3
                )
            before = traced()
            async with crowd(server.url, MEASURED, "idle", cookie_bytes) as connected:
                assert connected == MEASURED
                await eventually(lambda: len(server.hub.peers) == WARM_UP + MEASURED, what="every client attached")

                def per_connection() -> float:
                    return (traced() - before) / MEASURED

                # what the connects left in flight (their calls, the token refresh 2 s later) ends within the bound
                with contextlib.suppress(AssertionError):
                    await eventually(
                        lambda: per_connection() <= TRACED_BYTES_PER_CONNECTION,
                        what="the connects' work over",
                        timeout=10,
                        interval=0.5,
                    )
                held = per_connection()
                assert held <= TRACED_BYTES_PER_CONNECTION, (
                    f"{held / 1024:.1f} KiB of Python objects per idle connection"
                )
    finally:
        tracemalloc.stop()

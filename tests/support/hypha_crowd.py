"""Unmodified hypha-rpc clients held by a child process, so that a test's tracemalloc sees only the hub.

Run as ``python hypha_crowd.py URL TOKEN WORKSPACE COUNT PREFIX [COOKIE_BYTES]``: connects
``COUNT`` clients (each sending a cookie of ``COOKIE_BYTES`` with its upgrade request, if given) (16 handshakes at a time, each bounded), prints
``ready <connected>``, then holds them idle until its stdin closes (or
``LIFETIME`` seconds pass: a test that died does not leave it behind), and
disconnects them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from typing import Any

from hypha_rpc import connect_to_server

CONCURRENCY = 16
HANDSHAKE_TIMEOUT = 60.0
LIFETIME = 300.0


async def main(url: str, token: str, workspace: str, count: int, prefix: str, cookie_bytes: int) -> None:
    logging.getLogger().setLevel(logging.CRITICAL)
    gate = asyncio.Semaphore(CONCURRENCY)
    clients: list[Any] = []

    async def one(i: int) -> None:
        async with gate:
            config: dict[str, Any] = {
                "server_url": url,
                "client_id": f"{prefix}-{i}",
                "token": token,
                "workspace": workspace,
            }
            if cookie_bytes:
                config["additional_headers"] = {"Cookie": "pad=" + "x" * cookie_bytes}
            with contextlib.suppress(Exception):
                clients.append(await asyncio.wait_for(connect_to_server(config), HANDSHAKE_TIMEOUT))

    await asyncio.gather(*(one(i) for i in range(count)))
    print(f"ready {len(clients)}", flush=True)
    loop = asyncio.get_running_loop()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(loop.run_in_executor(None, sys.stdin.read), LIFETIME)
    for client in clients:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.disconnect(), 1)
    os._exit(0)  # not waiting for the thread still reading stdin


if __name__ == "__main__":
    cookie = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], cookie))

"""Child processes and clients of bench/connect_cost.py: unmodified hypha-rpc clients held in a process
of their own, so that their CPU is not the replica's, and the echo measured beside them.

    python bench/_connect_clients.py URL TOKEN PREFIX

Commands on stdin, one JSON object a line, each answered by one line on stdout:

    {"open": n, "concurrency": c}
        connect ``n`` more clients (``PREFIX-<serial>``, in one workspace with one token), ``c`` at a
        time; answers {"open": connected in all, "errors": {...}, "seconds": s}

Closing stdin ends the process (the bench kills the replica first: the clients' departures measure nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import time
from typing import Any

from _common import JWT_SECRET, commands, err_key

WORKSPACE = "bench-connect"
ECHO_WORKSPACE = "bench-echo"  # the echo's provider and caller: not among the idle clients' events


async def worker() -> None:
    """Holds hypha-rpc clients; commands on stdin: ``{"open": n, "concurrency": c}``."""
    from hypha_rpc import connect_to_server

    logging.getLogger().setLevel(logging.CRITICAL)
    # the answers keep stdout to themselves: whatever else prints there goes to the log
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    def reply(msg: dict[str, Any]) -> None:
        answers.write(json.dumps(msg) + "\n")
        answers.flush()

    url, token, prefix = sys.argv[1], sys.argv[2], sys.argv[3]
    clients: list[Any] = []
    serial = 0
    async for cmd in commands():
        sem = asyncio.Semaphore(int(cmd.get("concurrency", 16)))
        errors: dict[str, int] = {}
        t0 = time.perf_counter()

        async def one(cid: str, sem: asyncio.Semaphore = sem, errors: dict[str, int] = errors) -> None:
            async with sem:
                try:
                    config = {"server_url": url, "client_id": cid, "token": token, "workspace": WORKSPACE}
                    clients.append(await asyncio.wait_for(connect_to_server(config), 60))
                except Exception as exc:
                    key = err_key(exc)
                    errors[key] = errors.get(key, 0) + 1

        names = [f"{prefix}-{serial + i}" for i in range(int(cmd["open"]))]
        serial += len(names)
        await asyncio.gather(*(one(name) for name in names))
        reply({"open": len(clients), "errors": errors, "seconds": time.perf_counter() - t0})


def token_for_bench(workspace: str = WORKSPACE) -> str:
    from switchboard.clock import SystemClock
    from switchboard.hub.identity.auth import TokenIssuer
    from switchboard.hub.identity.users import Permission, User

    issuer = TokenIssuer(JWT_SECRET, SystemClock())
    user = User(id="bench-connect", roles=("user",))
    return issuer.issue(user, workspace=workspace, permission=Permission.READ_WRITE, expires_in=3 * 3600)


def load() -> float:
    """The machine's load average over the last minute (``uptime``'s first figure)."""
    return os.getloadavg()[0]


class Echo:
    """A provider on the measured replica and a caller on a second replica of the same Valkey,
    in a workspace of their own: cross-replica echo latency, without and with the idle clients."""

    def __init__(self, provider_url: str, caller_url: str) -> None:
        self.urls = provider_url, caller_url
        self.clients: list[Any] = []
        self.service: Any = None

    async def start(self) -> Echo:
        from hypha_rpc import connect_to_server

        token = token_for_bench(ECHO_WORKSPACE)
        provider = await connect_to_server(
            {"server_url": self.urls[0], "client_id": "echo-provider", "token": token, "workspace": ECHO_WORKSPACE}
        )
        self.clients.append(provider)
        await provider.register_service({"id": "echo", "config": {"visibility": "protected"}, "echo": lambda x: x})
        caller = await connect_to_server(
            {"server_url": self.urls[1], "client_id": "echo-caller", "token": token, "workspace": ECHO_WORKSPACE}
        )
        self.clients.append(caller)
        self.service = await caller.get_service(f"{ECHO_WORKSPACE}/echo-provider:echo")
        return self

    async def warm(self) -> None:
        """100 unmeasured echoes, then a pause: the direct link between the replicas is in place."""
        for i in range(100):
            await self.service.echo(i)
        await asyncio.sleep(0.5)

    async def block(self, calls: int) -> list[float]:
        """``calls`` echoes one after the other: each one's round trip in ms."""
        samples = []
        for i in range(calls):
            t0 = time.perf_counter()
            await self.service.echo(i)
            samples.append((time.perf_counter() - t0) * 1e3)
        return samples

    async def stop(self) -> None:
        for client in self.clients:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.disconnect(), 5)


if __name__ == "__main__":
    asyncio.run(worker())

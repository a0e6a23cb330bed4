"""Child processes of bench/storm.py: many real clients in one process, so that the bench's clients
are spread over several processes and none of them is one saturated event loop.

    python bench/_storm_clients.py sdk|hypha|echo

``sdk``: Switchboard SDK clients (``switchboard.connect`` with every URL given); ``hypha``:
unmodified hypha-rpc clients (``connect_to_server`` on one URL, a balancer's). Commands on stdin,
one JSON object a line, each answered by one line on stdout:

    {"open": {"urls": [...], "ids": [...], "workspace": ws, "token": t, "concurrency": n}}
        connect these clients, each registering service ``s`` (``echo``);
        answers {"open": n, "errors": {...}, "seconds": s}
    {"report": true}
        the SDK clients' transport events: {"events": {client_id: [[kind, code, monotonic], ...]}}
        (``time.monotonic`` is the machine's CLOCK_MONOTONIC: comparable between processes)

``echo``: the sibling's existing clients, a provider and a caller on one URL, in a process of their
own so that their figure is the hub's, not the bench's (whose Redis poller and callers of the moving
clients share its interpreter):

    {"echo": {"url": u, "workspace": ws, "token": t}}
        connect both, start the caller's loop (one echo at a time, 10 ms apart); answers {"echo": "started"}
    {"samples": true}
        stop the loop; answers {"samples": [[monotonic_start, seconds, ok], ...]}

Closing stdin ends the process (connections aborted, nothing announced).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections import Counter
from typing import Any

from _common import commands, reply


def echo(x: Any) -> Any:
    return x


class Sdk:
    def __init__(self) -> None:
        self.clients: list[Any] = []
        self.events: dict[str, list[list[Any]]] = {}

    async def one(self, cmd: dict[str, Any], cid: str) -> None:
        from switchboard.client import connect

        seen = self.events.setdefault(cid, [])

        def on_event(event: Any) -> None:
            seen.append([event.kind, getattr(event, "code", None), time.monotonic()])

        client = await connect(
            cmd["urls"],
            client_id=cid,
            workspace=cmd["workspace"],
            token=cmd["token"],
            on_event=on_event,
            method_timeout=30,
            ping_interval=60,
        )
        self.clients.append(client)
        await client.register_service({"id": "s", "config": {"visibility": "protected"}, "echo": echo})


class Hypha:
    def __init__(self) -> None:
        self.clients: list[Any] = []
        self.events: dict[str, list[list[Any]]] = {}

    async def one(self, cmd: dict[str, Any], cid: str) -> None:
        from hypha_rpc import connect_to_server

        server = await connect_to_server(
            {
                "server_url": cmd["urls"][0],
                "client_id": cid,
                "workspace": cmd["workspace"],
                "token": cmd["token"],
                "method_timeout": 30,
            }
        )
        self.clients.append(server)
        await server.register_service({"id": "s", "config": {"visibility": "protected"}, "echo": echo})


class Echo:
    """A provider and a caller on the sibling: the caller echoes through it, one call at a time."""

    def __init__(self) -> None:
        self.samples: list[list[Any]] = []  # [start (monotonic), seconds, ok]
        self.running = True
        self.clients: list[Any] = []
        self.loop: asyncio.Task[None] | None = None

    async def start(self, spec: dict[str, Any]) -> None:
        from switchboard.client import connect

        url, workspace, token = spec["url"], spec["workspace"], spec["token"]
        provider = await connect([url], client_id="b-provider", workspace=workspace, token=token)
        self.clients.append(provider)
        await provider.register_service({"id": "echo", "config": {"visibility": "protected"}, "echo": echo})
        caller = await connect([url], client_id="b-caller", workspace=workspace, token=token, method_timeout=30)
        self.clients.append(caller)
        svc = await caller.get_service(f"{workspace}/b-provider:echo")
        self.loop = asyncio.ensure_future(self.run(svc))

    async def run(self, svc: Any) -> None:
        while self.running:
            t = time.monotonic()
            try:
                await asyncio.wait_for(svc.echo("x" * 32), 10)
                ok = True
            except Exception:
                ok = False
            self.samples.append([t, time.monotonic() - t, ok])
            await asyncio.sleep(0.01)

    async def stop(self) -> list[list[Any]]:
        self.running = False
        if self.loop is not None:
            await asyncio.wait([self.loop], timeout=15)
        return self.samples


async def serve_echo() -> None:
    echoes = Echo()
    async for cmd in commands():
        if "echo" in cmd:
            await asyncio.wait_for(echoes.start(cmd["echo"]), 60)
            reply({"echo": "started"})
        elif cmd.get("samples"):
            reply({"samples": await echoes.stop()})
    os._exit(0)


async def serve(kind: str) -> None:
    if kind == "echo":
        await serve_echo()
        return
    held: Sdk | Hypha = Sdk() if kind == "sdk" else Hypha()
    async for cmd in commands():
        if cmd.get("report"):
            reply({"events": held.events})
            continue
        spec = cmd["open"]
        gate = asyncio.Semaphore(int(spec.get("concurrency", 32)))
        errors: Counter[str] = Counter()
        started = time.perf_counter()

        async def one(
            cid: str, spec: dict[str, Any] = spec, gate: asyncio.Semaphore = gate, errors: Counter[str] = errors
        ) -> None:
            async with gate:
                try:
                    await asyncio.wait_for(held.one(spec, cid), 60)
                except Exception as exc:
                    errors[f"{type(exc).__name__}: {str(exc)[:100]}"] += 1

        await asyncio.gather(*(one(cid) for cid in spec["ids"]))
        reply({"open": len(held.clients), "errors": dict(errors), "seconds": time.perf_counter() - started})
    os._exit(0)  # the parent is gone: leave without a word (the kernel closes the sockets)


def main() -> None:
    cpus = os.environ.get("STORM_CLIENT_CPUS")
    if cpus and sys.argv[1] != "echo":  # the moving clients on these cores only (storm.py --client-cpus)
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    import hypha_rpc  # noqa: F401  (it sets its loggers' levels on import: import it first)

    for name in ("RPC", "websocket-client", "hypha-rpc", "switchboard"):
        logging.getLogger(name).setLevel(logging.ERROR)
    asyncio.run(serve(sys.argv[1]))


if __name__ == "__main__":
    main()

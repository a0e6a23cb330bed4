"""Child processes of the benchmark (run with the bench's own Python, hypha-rpc 0.21.47):

    python bench/_workers.py provider URL CLIENT_ID [TOKEN WORKSPACE]
        one unmodified hypha-rpc client offering service ``bench`` (echo, cb);
        prints {"workspace", "token"} once registered, then serves until stdin closes.
    python bench/_workers.py idle
        holds raw WebSocket clients that did the hypha handshake and then stay silent;
        commands on stdin: {"open": {ws_url: total_wanted}, "concurrency": n} and {"close": true}.

The same code serves Switchboard and Hypha: only the URL differs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import time
import uuid
from collections import Counter
from typing import Any

import psutil
from _common import CHILD_MAX_LIFETIME, commands, reply, stdin_lines


async def provider(url: str, client_id: str, token: str = "", workspace: str = "") -> None:
    from hypha_rpc import connect_to_server

    server = await connect_to_server(
        {
            "server_url": url,
            "client_id": client_id,
            "token": token or None,
            "workspace": workspace or None,
            "method_timeout": 30,
        }
    )

    def echo(x: Any) -> Any:
        return x

    async def cb(f: Any, x: Any) -> Any:
        return await f(x)  # the callback runs in the caller's process

    await server.register_service({"id": "bench", "config": {"visibility": "public"}, "echo": echo, "cb": cb})
    reply({"workspace": server.config["workspace"], "token": token or await server.generate_token()})
    stdin = await stdin_lines()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stdin.read(), CHILD_MAX_LIFETIME)  # until the parent closes stdin
    with contextlib.suppress(Exception):
        await asyncio.wait_for(server.disconnect(), 3)


async def idle() -> None:
    from websockets.asyncio.client import connect

    conns: dict[str, list[Any]] = {}

    async def handshake(url: str) -> Any:
        ws = await connect(url, ping_interval=None, compression=None, max_size=1 << 20, open_timeout=20)
        try:
            hello = {
                "client_id": f"idle-{uuid.uuid4().hex[:16]}",
                "workspace": None,
                "token": None,
                "reconnection_token": None,
            }
            await ws.send(json.dumps(hello))
            info = json.loads(await asyncio.wait_for(ws.recv(), 20))
            if info.get("type") != "connection_info":
                raise RuntimeError(f"unexpected first frame: {str(info)[:200]}")
        except BaseException:
            ws.transport.abort()
            raise
        return ws

    async for cmd in commands():
        if cmd.get("close"):
            n = 0
            for group in conns.values():
                for ws in group:
                    ws.transport.abort()
                    n += 1
            conns.clear()
            reply({"closed": n})
            continue
        sem = asyncio.Semaphore(int(cmd.get("concurrency", 64)))
        errors: Counter[str] = Counter()
        t0 = time.perf_counter()

        async def one(url: str, sem: asyncio.Semaphore = sem, errors: Counter[str] = errors) -> None:
            async with sem:
                try:
                    conns.setdefault(url, []).append(await asyncio.wait_for(handshake(url), 30))
                except Exception as exc:
                    errors[f"{type(exc).__name__}: {str(exc)[:100]}"] += 1

        jobs = []
        for url, want in cmd["open"].items():
            jobs += [one(url) for _ in range(max(0, want - len(conns.get(url, []))))]
        await asyncio.gather(*jobs)
        reply(
            {
                "open": {u: len(c) for u, c in conns.items()},
                "errors": dict(errors),
                "seconds": time.perf_counter() - t0,
                "rss": psutil.Process().memory_info().rss,
            }
        )
    for group in conns.values():
        for ws in group:
            ws.transport.abort()


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    import hypha_rpc  # noqa: F401  (it sets its loggers' levels on import: import it first)

    for name in ("RPC", "websocket-client", "hypha-rpc"):
        logging.getLogger(name).setLevel(logging.ERROR)  # reconnect noise while replicas are killed
    what, args = sys.argv[1], sys.argv[2:]
    if what == "provider":
        asyncio.run(provider(*args))
    elif what == "idle":
        asyncio.run(idle())
    else:
        raise SystemExit(f"unknown worker {what!r}")


if __name__ == "__main__":
    main()

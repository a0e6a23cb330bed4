"""The physical floor: the least a hub can do on this machine with the same processes and hops.

    python bench/_floor.py relay PORT REDIS_URL
        a WebSocket relay (websockets + redis-py asyncio, no RPC decoding): a named
        client's frames go to the named target, straight if it is connected here,
        else through one Redis PUBLISH to the relay that holds it. An idle client that
        sends the hypha handshake gets a ``connection_info`` frame and nothing else.
    python bench/_floor.py provider WS_URL
        the raw counterpart of the hypha-rpc provider: echoes, and runs the callback
        round trip (one extra exchange with the caller before the reply).

A frame is ``[u8 len][to][u8 len][from][u32 request id][u8 kind][payload]``; the relay
reads only ``to``. Kinds: 0 echo (both ways), 1 call-with-callback, 2 the callback
invocation, 3 the callback's result, 4 the final reply. Payloads travel as one frame per
hop (hypha-rpc splits payloads above 256 KiB into chunks; the floor does not).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import sys
import uuid
from http import HTTPStatus
from typing import Any

from _common import CHILD_MAX_LIFETIME, reply, stdin_lines

MAX_FRAME = 64 << 20
ECHO, CB_CALL, CB_INVOKE, CB_RESULT, CB_REPLY = range(5)


def frame(to: str, frm: str, req: int, kind: int, payload: bytes) -> bytes:
    t, f = to.encode(), frm.encode()
    return bytes([len(t)]) + t + bytes([len(f)]) + f + struct.pack(">IB", req, kind) + payload


def parse(data: bytes) -> tuple[str, str, int, int, bytes]:
    n = data[0]
    to = data[1 : 1 + n].decode()
    m = data[1 + n]
    frm = data[2 + n : 2 + n + m].decode()
    o = 2 + n + m
    req, kind = struct.unpack_from(">IB", data, o)
    return to, frm, req, kind, data[o + 5 :]


# --------------------------------------------------------------------------- relay


async def relay(port: int, redis_url: str) -> None:
    import redis.asyncio as aioredis
    from websockets.asyncio.server import serve
    from websockets.exceptions import ConnectionClosed

    local: dict[str, Any] = {}
    rds = aioredis.Redis.from_url(redis_url)
    pubsub = rds.pubsub()
    await pubsub.subscribe(f"floor:_relay_{port}")  # listen() needs one subscription to start

    async def from_redis() -> None:
        async for msg in pubsub.listen():
            if msg["type"] != "message":
                continue
            ws = local.get(msg["channel"].decode()[6:])
            if ws is not None:
                with contextlib.suppress(Exception):
                    await ws.send(msg["data"])

    async def handler(ws: Any) -> None:
        with contextlib.suppress(ConnectionClosed):
            await serve_one(ws)

    async def serve_one(ws: Any) -> None:
        first = await ws.recv()
        if isinstance(first, str) and first.startswith("{"):  # an idle client's hypha handshake
            hello = json.loads(first)
            await ws.send(json.dumps({"type": "connection_info", "client_id": hello.get("client_id")}))
            async for _ in ws:
                pass
            return
        name = str(first)
        local[name] = ws
        await pubsub.subscribe(f"floor:{name}")
        await ws.send("ok")
        try:
            async for data in ws:
                to = data[1 : 1 + data[0]].decode()
                peer = local.get(to)
                if peer is not None:
                    await peer.send(data)
                else:
                    await rds.publish(f"floor:{to}", data)
        finally:
            local.pop(name, None)
            with contextlib.suppress(Exception):
                await pubsub.unsubscribe(f"floor:{name}")

    def health(connection: Any, request: Any) -> Any:
        if request.path == "/health":
            return connection.respond(HTTPStatus.OK, "OK\n")
        return None

    reader = asyncio.create_task(from_redis())
    async with serve(
        handler,
        "127.0.0.1",
        port,
        max_size=MAX_FRAME,
        compression=None,
        ping_interval=None,
        process_request=health,
        max_queue=None,
    ):
        await asyncio.sleep(CHILD_MAX_LIFETIME)
    reader.cancel()


# --------------------------------------------------------------------------- provider and caller


async def provider(url: str) -> None:
    from websockets.asyncio.client import connect

    async with connect(url, max_size=MAX_FRAME, compression=None, ping_interval=None) as ws:
        await ws.send("provider")
        await ws.recv()
        reply({"ok": True})

        async def serve_frames() -> None:
            async for data in ws:
                _, frm, req, kind, payload = parse(data)
                if kind == ECHO:
                    await ws.send(frame(frm, "provider", req, ECHO, payload))
                elif kind == CB_CALL:
                    await ws.send(frame(frm, "provider", req, CB_INVOKE, payload))
                elif kind == CB_RESULT:
                    await ws.send(frame(frm, "provider", req, CB_REPLY, payload))

        stdin = await stdin_lines()
        tasks = [asyncio.create_task(serve_frames()), asyncio.create_task(stdin.read())]
        await asyncio.wait(tasks, timeout=CHILD_MAX_LIFETIME, return_when=asyncio.FIRST_COMPLETED)
        for t in tasks:
            t.cancel()


class FloorClient:
    """The caller side of the floor: ``echo`` and ``cb`` shaped like the hypha-rpc service's."""

    def __init__(self) -> None:
        self.name = f"caller-{uuid.uuid4().hex[:12]}"
        self.ws: Any = None
        self.pending: dict[int, asyncio.Future[bytes]] = {}
        self.next_id = 0
        self.reader: asyncio.Task[None] | None = None

    async def connect(self, url: str) -> FloorClient:
        from websockets.asyncio.client import connect

        self.ws = await connect(url, max_size=MAX_FRAME, compression=None, ping_interval=None)
        await self.ws.send(self.name)
        await self.ws.recv()
        self.reader = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        async for data in self.ws:
            _, frm, req, kind, payload = parse(data)
            if kind == CB_INVOKE:  # run the "callback" (identity) and answer the provider
                await self.ws.send(frame(frm, self.name, req, CB_RESULT, payload))
                continue
            fut = self.pending.pop(req, None)
            if fut is not None and not fut.done():
                fut.set_result(payload)

    async def _call(self, kind: int, payload: bytes) -> bytes:
        self.next_id = (self.next_id + 1) & 0xFFFFFFFF
        req = self.next_id
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.pending[req] = fut
        try:
            await self.ws.send(frame("provider", self.name, req, kind, payload))
            return await fut
        finally:
            self.pending.pop(req, None)

    async def echo(self, payload: bytes) -> bytes:
        return await self._call(ECHO, payload)

    async def cb(self, payload: bytes) -> bytes:
        return await self._call(CB_CALL, payload)

    async def close(self) -> None:
        if self.reader is not None:
            self.reader.cancel()
        if self.ws is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.ws.close(), 2)


def main() -> None:
    what, args = sys.argv[1], sys.argv[2:]
    if what == "relay":
        asyncio.run(relay(int(args[0]), args[1]))
    elif what == "provider":
        asyncio.run(provider(args[0]))
    else:
        raise SystemExit(f"unknown command {what!r}")


if __name__ == "__main__":
    main()

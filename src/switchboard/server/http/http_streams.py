"""A generator called over plain HTTP answers a stream, one item at a time (as Hypha's).

A provider's generator (sync or async) reaches the hub as hypha-rpc's remote
generator: each item is one ``next`` call to the provider. The response
asks for the next item only once the previous one has been handed to the
connection, and the server hands it on only as fast as the reader takes it
(uvicorn waits for the socket to drain), so a slow reader slows the
generator instead of growing a buffer in the hub. A reader that goes away
closes the generator at the provider (hypha-rpc's ``close`` call), and so
does an item that takes longer than the call timeout.

Framing, as Hypha 0.21.137's: ``text/event-stream`` with one ``data: <json>``
event per item, then ``data: [DONE]``; an error from the generator is one
more event, ``{"error": "<detail>"}`` (the detail a failed call answers),
before ``[DONE]``. Asked in msgpack
(``Content-Type: application/msgpack``), the items are msgpack objects one
after another, an error the same ``{"error": ...}`` object, and no marker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, Callable
from typing import Any

import msgpack
from starlette.types import Receive, Scope, Send

from switchboard.server.http.http_errors import status_of

log = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"
# Bound on waiting for the provider to confirm it closed the generator once the reader left.
CLOSE_TIMEOUT = 5.0


def sse_event(value: Any) -> bytes:
    """One Server-Sent Event carrying ``value`` (JSON-ready already)."""
    return b"data: " + json.dumps(value).encode() + b"\n\n"


class EventStream:
    """The ASGI response that pulls ``items`` (a remote generator) as the reader reads.

    ``encode`` makes an item JSON-ready (bytes as base64, as every HTTP answer
    does); ``exit`` releases what the call held while it streamed (its place
    among the caller's calls in flight, the address it was made from), once
    the generator has ended or been closed.
    """

    def __init__(
        self,
        items: AsyncGenerator[Any, None],
        *,
        as_msgpack: bool,
        encode: Callable[[Any], Any],
        item_timeout: float,
        exit: contextlib.AsyncExitStack,
    ) -> None:
        self.items = items
        self.as_msgpack = as_msgpack
        self.encode = encode
        self.item_timeout = item_timeout
        self.exit = exit

    def _frame(self, value: Any) -> bytes:
        if self.as_msgpack:
            packed: bytes = msgpack.packb(value, use_bin_type=True, default=str)
            return packed
        return sse_event(self.encode(value))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        media = "application/msgpack" if self.as_msgpack else "text/event-stream"
        headers = [
            (b"content-type", media.encode()),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),  # a proxy in front passes each event on at once
        ]
        left = asyncio.ensure_future(_disconnected(receive))
        try:
            async with self.exit:  # the call's identity and bounds, held until the generator is closed
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                try:
                    await self._pump(send, left)
                finally:
                    await self._close()
            if not left.done():
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            left.cancel()

    async def _pump(self, send: Send, left: asyncio.Future[None]) -> None:
        """Items to the reader until the generator ends, fails, is too slow, or the reader leaves."""
        while True:
            step = asyncio.ensure_future(anext(self.items))
            done, _ = await asyncio.wait({step, left}, timeout=self.item_timeout, return_when=asyncio.FIRST_COMPLETED)
            if step not in done:
                step.cancel()  # the generator's own cleanup asks the provider to close it
                await asyncio.gather(step, return_exceptions=True)
                if left in done:
                    return
                error = f"no item within {self.item_timeout:g} s (the call timeout)"
                await send(self._body(self._frame({"error": error}) + self._end()))
                return
            try:
                item = step.result()
            except StopAsyncIteration:
                await send(self._body(self._end()))
                return
            except Exception as exc:  # the provider's error ends the stream, told as a failed call's
                detail = status_of(exc)[1]
                log.info("HTTP stream ended by the generator's error: %.200s", detail)
                await send(self._body(self._frame({"error": detail}) + self._end()))
                return
            await send(self._body(self._frame(item)))  # waits while the reader is slow

    def _end(self) -> bytes:
        return b"" if self.as_msgpack else DONE

    @staticmethod
    def _body(chunk: bytes) -> dict[str, Any]:
        return {"type": "http.response.body", "body": chunk, "more_body": True}

    async def _close(self) -> None:
        """Close the generator (a no-op once it ended): hypha-rpc then closes it at the provider."""
        try:
            await asyncio.wait_for(self.items.aclose(), CLOSE_TIMEOUT)
        except Exception as exc:
            log.info("closing a streamed generator failed: %s", exc)


async def _disconnected(receive: Receive) -> None:
    """Returns once the reader has gone (bounded by the connection's life: uvicorn answers
    ``http.disconnect`` when it ends)."""
    while (await receive())["type"] != "http.disconnect":
        pass

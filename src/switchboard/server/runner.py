"""Running the app under uvicorn, in the foreground (CLI) or inside a test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from types import FrameType

import uvicorn
from starlette.applications import Starlette

from switchboard.config import Settings
from switchboard.hub.hub import Hub
from switchboard.server.app import build_hub, create_app
from switchboard.server.http_protocol import HubHttpProtocol
from switchboard.server.ws_protocol import HubWebSocketProtocol

log = logging.getLogger(__name__)


class HubServer(uvicorn.Server):
    """uvicorn, but connected clients are drained before uvicorn waits for them.

    uvicorn's own shutdown waits for open responses to finish, and a hub's
    responses (WebSockets, HTTP streams) never finish by themselves.
    """

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """First SIGTERM/SIGINT: drain and exit 0. A second one: exit at once."""
        if self.should_exit:
            log.warning("second signal %s: exiting now", sig)
            os._exit(1)
        log.info("signal %s: draining", sig)
        self.should_exit = True  # unlike uvicorn, do not re-raise it: a drained exit is a clean exit

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        app = self.config.loaded_app if self.config.loaded else self.config.app
        state = getattr(getattr(_inner_app(app), "state", None), "switchboard", None)
        if state is not None:
            await state.drain()
        await super().shutdown(sockets)


def _inner_app(app: object) -> object:
    """The Starlette app under uvicorn's middleware wrappers."""
    while hasattr(app, "app") and not hasattr(app, "state"):
        app = app.app
    return app


def uvicorn_config(app: Starlette, settings: Settings) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        # uvicorn's httptools, with bounds on slow request heads (slowloris)
        http=HubHttpProtocol.configured(
            header_timeout=settings.header_timeout,
            max_head_bytes=settings.max_head_bytes,
            per_address=settings.max_incomplete_heads_per_address,
            overall=settings.max_incomplete_heads,
        ),
        # uvicorn's websockets-sansio, with synchronous paths for routing and a bound on
        # how long a client may take to finish a message
        ws=HubWebSocketProtocol.configured(frame_timeout=settings.frame_timeout),
        ws_max_size=settings.max_message_bytes,
        # No permessage-deflate: compressing every frame cost 80% of a replica's
        # CPU on 64 KiB payloads (bench/compare.py), for bandwidth a hub's
        # networks rarely lack; clients simply do not get the extension.
        ws_per_message_deflate=False,
        log_config=None,  # leave logging to the application: keeps our loggers enabled
        access_log=False,
        lifespan="on",
    )


def bind(host: str, port: int) -> socket.socket:
    """A listening socket; port 0 picks a free one, which the caller can then read.

    ``IPPROTO_TCP`` named explicitly: asyncio turns ``TCP_NODELAY`` on only for
    sockets whose protocol says TCP, and accepted sockets inherit it; without it
    back-to-back small replies wait ~40 ms on Nagle and delayed ACKs.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


@dataclass
class RunningServer:
    url: str
    hub: Hub
    app: Starlette
    server: uvicorn.Server


@contextlib.asynccontextmanager
async def running(settings: Settings, *, hub: Hub | None = None) -> AsyncIterator[RunningServer]:
    """Serve on a free loopback port in the current event loop until the block ends."""
    sock = bind(settings.host, settings.port)
    port = sock.getsockname()[1]
    settings = replace(settings, port=port)
    hub = hub or build_hub(settings)
    app = create_app(settings, hub)
    server = HubServer(uvicorn_config(app, settings))
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        for _ in range(500):
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        if not server.started:
            raise RuntimeError("server did not start within 5 s")
        yield RunningServer(url=settings.public_base_url, hub=hub, app=app, server=server)
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        sock.close()

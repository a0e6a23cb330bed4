"""Running the app under uvicorn, in the foreground (CLI) or inside a test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from types import FrameType

import uvicorn
from starlette.applications import Starlette

from switchboard.config import Settings
from switchboard.hub.hub import Hub
from switchboard.hub.transit.drain import PATIENCE
from switchboard.protocol.hypha import handshake
from switchboard.server.app import build_hub, create_app
from switchboard.server.http.http_protocol import HubHttpProtocol
from switchboard.server.process import versions
from switchboard.server.process.server_state import Phase, ServerState
from switchboard.server.process.stop_deadline import StopDeadline
from switchboard.server.ws import websocket
from switchboard.server.ws.ws_protocol import HubWebSocketProtocol

log = logging.getLogger(__name__)

# Seconds the hub's clients have to let go of their connections once the drain
# sent them away, and the app to be done with the WebSockets left after that
# (a handshake under way, a stalled client's connection being reset).
PEERS_GRACE = 5.0
LEFTOVER_GRACE = 8.0
# Seconds a stop may take once the drain's own bound has passed, before the process exits
# anyway (:class:`StopDeadline`): the clients' leave, the WebSockets left, uvicorn's shutdown
# and the hub's stop. Together they take 0.1-0.5 s (docs/operations.md); 4 s is ten times
# that, and with the watch's 1 s report it fits the 5 s a grace period keeps for the exit.
AFTER_DRAIN = 4.0
# Of which kept for uvicorn's shutdown and the hub's stop (about 0.1 s; each of the hub's
# steps bounded at 2 s): the leave and the leftovers end this long before the deadline.
SHUTDOWN_RESERVE = 2.0
RESTARTING = "Server restarting, please reconnect"


def stop_budget(*, drain_timeout: float, transit_grace: float) -> float:
    """Seconds from SIGTERM to a forced exit (status 1): the drain's own bound (its timeout,
    then the hand-over's grace, :data:`~switchboard.hub.transit.drain.PATIENCE` without transit),
    plus :data:`AFTER_DRAIN`.

    Not the sum of every phase's ceiling (:data:`PEERS_GRACE` and :data:`LEFTOVER_GRACE`
    would add 13 s that a stop never uses when it goes well, and push the exit past
    Kubernetes' grace period: a SIGKILL, with no word of what hung); those phases get what
    is left of this budget instead, up to their ceilings.
    """
    return drain_timeout + (transit_grace or PATIENCE) + AFTER_DRAIN


class HubServer(uvicorn.Server):
    """uvicorn, stopped through :meth:`stop`: the one way a hub shuts down (signal, CLI, tests).

    uvicorn's own shutdown closes the listening socket first and then waits for
    open responses to finish, and a hub's responses (WebSockets, HTTP streams)
    never finish by themselves. So the drain runs before uvicorn is told to
    exit: while it runs, readiness says 503 and new clients are turned away
    with a 503 they retry elsewhere.
    """

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        versions.check()
        super().__init__(config)
        self.state = state
        self._stopping: asyncio.Task[None] | None = None
        self._signalled = False
        self._stop_by: float | None = None  # monotonic deadline of a signalled stop
        settings = state.hub.settings
        self.deadline = StopDeadline(
            stop_budget(drain_timeout=settings.drain_timeout, transit_grace=settings.transit_grace)
        )

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().serve(sockets)
        finally:
            self.deadline.cancel()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """uvicorn's signal handler. First SIGTERM/SIGINT: drain and exit 0 (not re-raised, unlike
        uvicorn: a drained exit is a clean exit). A second one: exit at once.

        The stop's watch starts here, not once the drain is over: a drain that does not keep
        its bound (a starved loop, a store that does not answer) is cut by the same deadline."""
        if self._signalled or self.should_exit:
            log.warning("second signal %s: exiting now", sig)
            os._exit(1)
        self._signalled = True
        self._stop_by = time.monotonic() + self.deadline.budget
        log.info("signal %s: draining (exit at the latest %.1fs from now)", sig, self.deadline.budget)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not serving yet
            self.deadline.start()
            self.should_exit = True
            return
        self.deadline.start(loop)
        loop.call_soon_threadsafe(self._begin_stop)  # wakes the loop; a signal handler must not do more

    def _begin_stop(self) -> None:
        if self._stopping is None:
            self._stopping = asyncio.create_task(self._stop(), name="stop")

    async def stop(self) -> None:
        """Drain the hub, close what is left, then let uvicorn stop (idempotent)."""
        self._begin_stop()
        assert self._stopping is not None
        await asyncio.shield(self._stopping)

    async def _stop(self) -> None:
        state = self.state
        try:
            if state.phase is Phase.READY:
                state.phase = Phase.DRAINING
                hub = state.hub
                timeout = hub.settings.drain_timeout
                log.info(
                    "draining %d clients (at most %.1fs)", len(state.peers), timeout, extra={"replica": hub.replica_id}
                )
                await hub.drain(timeout, code=handshake.CLOSE_RESTARTING, reason=RESTARTING)
                grace = self._left(PEERS_GRACE)
                if not await state.peers_gone(grace):
                    log.warning("%d clients still connected %.1fs after being told to leave", len(state.peers), grace)
            await state.connections.shut_down(self._left(LEFTOVER_GRACE))
        finally:
            self.should_exit = True

    def _left(self, ceiling: float) -> float:
        """A phase's bound: ``ceiling``, or less once signalled, so that uvicorn's shutdown and the
        hub's stop still have :data:`SHUTDOWN_RESERVE` before the watch fires."""
        if self._stop_by is None:
            return ceiling
        return max(0.0, min(ceiling, self._stop_by - SHUTDOWN_RESERVE - time.monotonic()))


def uvicorn_config(app: Starlette, settings: Settings) -> uvicorn.Config:
    """uvicorn's settings for ``app``; its protocols report to the app's :class:`ServerState`."""
    connections = app.state.switchboard.connections
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
            connections=connections,
        ),
        # the hub's own WebSocket protocol, with synchronous paths for routing and a bound on
        # how long a client may take to finish a message. No permessage-deflate: compressing
        # every frame cost 80% of a replica's CPU on 64 KiB payloads (bench/compare.py), for
        # bandwidth a hub's networks rarely lack; clients simply do not get the extension.
        ws=HubWebSocketProtocol.configured(
            app=websocket.served_directly(app),
            connections=connections,
            max_size=settings.max_message_bytes,
            frame_timeout=settings.frame_timeout,
        ),
        ws_max_size=settings.max_message_bytes,  # for uvicorn's own protocols (tests run on them too)
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
    server: HubServer


@contextlib.asynccontextmanager
async def running(settings: Settings, *, hub: Hub | None = None) -> AsyncIterator[RunningServer]:
    """Serve on a free loopback port in the current event loop until the block ends."""
    sock = bind(settings.host, settings.port)
    port = sock.getsockname()[1]
    settings = replace(settings, port=port)
    hub = hub or build_hub(settings)
    app = create_app(settings, hub)
    server = HubServer(uvicorn_config(app, settings), app.state.switchboard)
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
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(_stopped(server, task), 10)
        sock.close()


async def _stopped(server: HubServer, serving: asyncio.Task[None]) -> None:
    if not serving.done():
        await server.stop()
    await serving

"""The ASGI application: routes, and the start and stop of everything behind them."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute

from switchboard.backends.base import EventBus, Registry
from switchboard.clock import Clock, SystemClock
from switchboard.config import Settings
from switchboard.hub.assemble import assemble
from switchboard.hub.hub import Hub
from switchboard.server.http import (
    http_apps,
    http_mcp,
    http_rpc,
    http_services,
    hypha_routes,
    login_page,
    static_mounts,
    status_api,
    web_console,
)
from switchboard.server.process.backends import backends_for
from switchboard.server.process.server_state import Phase, ServerState
from switchboard.server.process.state_dir import token_secret
from switchboard.server.ws.websocket import PATH, websocket_endpoint

log = logging.getLogger(__name__)


async def liveness(request: Request) -> Response:
    return JSONResponse({"status": "OK"})


async def readiness(request: Request) -> Response:
    state: ServerState = request.app.state.switchboard
    ready, why = state.readiness()
    body = {"status": "OK" if ready else "DOWN", "detail": why, "replica": state.hub.replica_id}
    return JSONResponse(body, status_code=200 if ready else 503)


async def metrics(request: Request) -> Response:
    state: ServerState = request.app.state.switchboard
    return Response(state.hub.metrics.render(), media_type="text/plain; version=0.0.4")


def build_hub(
    settings: Settings,
    *,
    clock: Clock | None = None,
    registry: Registry | None = None,
    bus: EventBus | None = None,
) -> Hub:
    """A hub on the embedded backends unless others are given (or ``--redis-url``: Redis's)."""
    clock = clock or SystemClock()
    secret = token_secret(settings)  # --jwt-secret, else the one kept in the state directory
    backends = backends_for(settings, clock=clock, registry=registry, bus=bus)
    return assemble(settings, backends, clock=clock, secret=secret)


def _middleware(settings: Settings) -> list[Middleware]:
    """CORS for the HTTP endpoints (WebSockets are not subject to it), if any origin is allowed.

    No credentials: a cross-origin page's requests never carry a visitor's
    cookie (the stream cookie of the HTTP transport, the only one), only what
    the page sends itself. Any request header may be sent: the transport
    needs ``Authorization`` and ``Content-Type: application/msgpack``.
    """
    origins = settings.cors_origin_list
    if not origins:
        return []
    return [
        Middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"],  # an app takes any
            allow_headers=["*"],
            allow_credentials=False,
            max_age=600,
        )
    ]


def create_app(settings: Settings, hub: Hub | None = None) -> Starlette:
    """The Switchboard ASGI app for ``settings`` (embedded backends by default)."""
    hub = hub or build_hub(settings)
    state = ServerState(hub)

    sampler = status_api.StatusSampler(hub)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await hub.start()
        sampler.start()
        state.phase = Phase.READY
        log.info("ready at %s as %s", settings.public_base_url, hub.manager_id, extra={"replica": hub.replica_id})
        try:
            yield
        finally:
            state.phase = Phase.DRAINING
            await sampler.stop()
            await hub.stop()
            state.phase = Phase.STOPPED

    routes = [
        Route("/health/liveness", liveness),
        Route("/health/readiness", readiness),
        Route("/metrics", metrics),
        *hypha_routes.routes(),  # before the services': "/{workspace}/info" is not a service
        WebSocketRoute(PATH, websocket_endpoint),  # the hub's own protocol serves it directly (runner.py)
        *http_rpc.routes(),
        *status_api.routes(),
        *http_mcp.routes(),
        *http_services.routes(),
        *login_page.routes(),  # before the apps': the hub serves its own login page at /public/apps/hypha-login
        *http_apps.routes(),
        *web_console.routes(),  # after: a workspace named "console" keeps /console/services
        *static_mounts.routes(settings.static_mounts),  # last: the hub's routes and workspaces' win
    ]
    app = Starlette(routes=routes, lifespan=lifespan, middleware=_middleware(settings))
    app.state.switchboard = state
    app.state.status_sampler = sampler
    return app

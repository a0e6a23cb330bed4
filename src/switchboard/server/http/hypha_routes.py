"""Hypha's informational HTTP routes: ``/assets/config.json``, ``/{workspace}/info`` and ``/health``.

Each answers what Hypha's does in its fields that describe this hub; the
caller is whoever the request's token says (``Authorization``), anonymous
without one.
"""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from switchboard.errors import AuthError, BackendError, ProtocolError, RateLimited
from switchboard.hub.identity.users import Permission
from switchboard.hub.manager.workspace_records import implicit_record
from switchboard.protocol.hypha import ids
from switchboard.protocol.hypha.handshake import HYPHA_VERSION
from switchboard.server.http import health_report
from switchboard.server.http.http_errors import error_response
from switchboard.server.http.http_services import caller_allowance, request_user, server_state


def routes() -> list[Route]:
    return [
        Route("/health", health, methods=["GET"]),
        Route("/assets/config.json", config, methods=["GET"]),
        Route("/{workspace}/info", workspace_info, methods=["GET"]),
    ]


def _refused(status: int, detail: str) -> Response:
    return JSONResponse({"success": False, "detail": detail}, status_code=status)


async def health(request: Request) -> Response:
    """Whether this replica serves (``status``: ``HEALTHY`` or ``DOWN``), with Hypha's diagnostic
    fields beside it (memory, connections, objects, tasks: :mod:`health_report`)."""
    state = server_state(request)
    ready, why = state.readiness()
    hub = state.hub
    facts = health_report.measure(
        ready=ready,
        why=why,
        replica=hub.replica_id,
        connections=len(hub.peers),
        services=hub.http.registered_services(),
        started=state.created,
    )
    status, body = health_report.report(facts)
    return JSONResponse(body, status_code=status)


async def config(request: Request) -> Response:
    """The server's description and the caller's user, as Hypha's login page reads them."""
    state = server_state(request)
    try:
        user, workspace = await request_user(request)
    except AuthError as exc:
        return _refused(401, str(exc))
    s = state.hub.settings
    return JSONResponse(
        {
            "user": user.to_wire(workspace),
            "server_id": s.server_id,
            "hypha_version": HYPHA_VERSION,
            "public_base_url": s.public_base_url,
            "local_base_url": s.public_base_url,
        }
    )


async def workspace_info(request: Request) -> Response:
    """A workspace's record, for a caller who may read it (403 otherwise, as Hypha's)."""
    state = server_state(request)
    try:
        user, _ = await request_user(request)
        ws = ids.check_id(request.path_params["workspace"], "workspace")
    except AuthError as exc:
        return _refused(401, str(exc))
    except ProtocolError as exc:
        return _refused(400, str(exc))
    store = state.http.workspaces
    try:
        with caller_allowance(request, user).holding(1):
            record = await store.get(ws)
            if not user.with_ownership(ws, record).can(ws, Permission.READ):  # an owner reads it
                return _refused(403, f"{user.id} has no permission to access {ws}")
            types = await store.table(ws, "types")
    except BackendError as exc:
        return _refused(503, str(exc))
    except RateLimited as exc:
        return error_response(exc)
    info = dict(record) if record else implicit_record(ws)
    info["service_types"] = {k: json.loads(v) for k, v in types.items()}
    return JSONResponse(info)

"""Calling services over plain HTTP (protocol §8.2): ``/{workspace}/services/...``."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import inspect
import json
import logging
import math
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TypeVar, cast

import msgpack
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from switchboard.backends.patience import patience
from switchboard.errors import AuthError, FrameTooLarge, NotFound, PermissionDenied, RequestRefused
from switchboard.hub.identity.users import Permission, User, user_workspace
from switchboard.hub.routing.limits import Allowance, address_key
from switchboard.protocol.hypha import ids
from switchboard.protocol.hypha import services as svc_ids
from switchboard.protocol.hypha.services import ServiceQuery
from switchboard.protocol.hypha.values import plain
from switchboard.server.http.http_errors import error_response, refusal, status_of
from switchboard.server.http.http_manager import call_built_in, call_manager, http_caller
from switchboard.server.http.http_streams import EventStream
from switchboard.server.process.server_state import ServerState

log = logging.getLogger(__name__)

R = TypeVar("R")
ANONYMOUS_HTTP = User(id="anonymouz-http", roles=("anonymous",))
MSGPACK_TYPES = ("application/msgpack", "application/x-msgpack")


def routes() -> list[Route]:
    return [
        Route("/{workspace}/services", list_services, methods=["GET"]),
        Route("/{workspace}/services/", list_services, methods=["GET"]),
        Route("/{workspace}/services/{service_id}", service_info, methods=["GET"]),
        Route("/{workspace}/services/{service_id}/{function:path}", call_function, methods=["GET", "POST"]),
    ]


def server_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.switchboard
    return state


def _token(request: Request) -> str | None:
    """The caller's token from ``Authorization`` (Bearer, Basic's password, or bare); never a cookie.

    A browser attaches cookies to requests from any page of the site, with no
    preflight; a token the page must send itself is one no other page can use.
    """
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    if auth.lower().startswith("basic "):
        try:
            return base64.b64decode(auth[6:]).decode().partition(":")[2] or None
        except ValueError:
            raise AuthError("malformed Basic credentials") from None
    return auth.strip() or None


async def request_user(request: Request) -> tuple[User, str]:
    """The caller and its own workspace (the context its calls are made in)."""
    token = _token(request)
    if token is None:
        return ANONYMOUS_HTTP, "ws-anonymous"
    user = await server_state(request).http.verify(token)  # AuthError: 401
    return user, user.current_workspace or user_workspace(user.id)


async def as_owner(request: Request, user: User, workspace: str) -> User:
    """The caller as it stands in ``workspace``: its token's grants, and ``admin`` if the
    workspace's record names it an owner, decided as at a WebSocket admission."""
    return await server_state(request).http.as_owner(user, workspace)


async def _not_deleted(request: Request, user: User, workspace: str) -> None:
    """A token issued before ``workspace`` was deleted grants nothing there (403), as at admission."""
    if user is ANONYMOUS_HTTP or not user.can(workspace, Permission.READ):
        return  # it holds nothing there to lose: an outsider's calls are unchanged
    refusal = await server_state(request).http.deletion(user, workspace)
    if refusal is not None:
        raise PermissionDenied(refusal)


def path_workspace(request: Request) -> str:
    """The path's workspace, in the id grammar before it names a key (``*`` would query them all): else 400."""
    return ids.check_id(request.path_params["workspace"], "workspace")


def jsonable(value: Any) -> Any:
    value = plain(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


def _respond(value: Any, as_msgpack: bool) -> Response:
    if as_msgpack:
        return Response(msgpack.packb(plain(value), use_bin_type=True, default=str), media_type="application/msgpack")
    return JSONResponse(jsonable(value))


async def guard(request: Request, handler: Callable[[], Awaitable[R]]) -> R | Response:
    if not server_state(request).accepting:
        response = refusal(503, "Server is draining or starting, please retry")
        response.headers["Retry-After"] = "1"
        return response
    try:
        with patience():  # a silent Redis answers this request with a 503 within a second
            return await handler()
    except Exception as exc:
        status, detail = status_of(exc)
        if status >= 500:
            server_state(request).hub.metrics.call_errors.inc()
            log.warning("HTTP %s %s failed: %s", request.method, request.url.path, detail)
        else:
            log.info("HTTP %s %s refused (%d): %s", request.method, request.url.path, status, detail)
        return error_response(exc)


def caller_allowance(request: Request, user: User) -> Allowance:
    """The caller's rate and calls in flight, as a connection has them: its user's, or for an
    anonymous request its address's (every anonymous request from one address is one caller)."""
    if user is ANONYMOUS_HTTP:
        host = address_key(request.client.host) if request.client else "unknown"
        return server_state(request).allowances.of(f"address:{host}", f"anonymous requests from {host}")
    return server_state(request).allowances.of(f"user:{user.id}", f"user {user.id}")


async def list_services(request: Request) -> Response:
    async def handler() -> Response:
        ws = path_workspace(request)
        user, own_ws = await request_user(request)
        allowance = caller_allowance(request, user)
        with allowance.holding(1):
            visible = await visible_services(request, user, own_ws, ws)
        return JSONResponse(jsonable(visible))

    return await guard(request, handler)


async def visible_services(request: Request, user: User, own_ws: str, ws: str) -> list[svc_ids.ServiceInfo]:
    """The services of ``ws`` its listing shows the caller, as ``GET /{workspace}/services`` answers."""
    user = await as_owner(request, user, ws)
    await _not_deleted(request, user, ws)
    found = await server_state(request).http.find(ServiceQuery(ws))
    has_read = user.can(ws, Permission.READ)
    return [
        svc_ids.shown(i, has_read=has_read)
        for i in found
        if svc_ids.may_list(i, caller_workspace=own_ws, has_read=has_read, include_unlisted=False)
    ]


async def service_info(request: Request) -> Response:
    async def handler() -> Response:
        user, own_ws = await request_user(request)
        allowance = caller_allowance(request, user)
        with allowance.holding(1):
            info, _ = await resolve_service(request, user, own_ws, allowance)
        return JSONResponse(jsonable(info))

    return await guard(request, handler)


async def resolve_service(
    request: Request, user: User, own_ws: str, allowance: Allowance
) -> tuple[svc_ids.ServiceInfo, User]:
    """The service the path names (``?_mode=`` among several) and the caller as it stands in the
    path's workspace (:func:`as_owner`); a ``select:`` mode's candidates are calls of the caller,
    admitted by its ``allowance`` while they run."""
    ws = path_workspace(request)
    user = await as_owner(request, user, ws)
    await _not_deleted(request, user, ws)
    service_id = request.path_params["service_id"]
    if "/" in service_id:
        raise RequestRefused(400, "service_id must not contain '/'")
    http = server_state(request).http
    if service_id == "~":  # the workspace manager, as in Hypha
        return http.manager_info(), user
    if (key := http.built_in(f"{ws}/{service_id}", own_ws, user)) is not None:
        return http.built_in_info(key), user
    # resolve chooses among the services the caller may use (svc_ids.may_use) alone
    info = await http.resolve(
        f"{ws}/{service_id}",
        workspace=own_ws,
        user=user,
        mode=request.query_params.get("_mode"),
        select_timeout=_query_value(request.query_params["_select_timeout"])
        if "_select_timeout" in request.query_params
        else None,
        charge=allowance.holding,
    )
    return info, user


async def _read_kwargs(request: Request) -> tuple[dict[str, Any], bool]:
    """Keyword arguments from the query string (GET) or the body (POST)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    as_msgpack = content_type in MSGPACK_TYPES
    if request.method == "GET":
        return {k: _query_value(v) for k, v in request.query_params.items() if not k.startswith("_")}, as_msgpack
    body = await read_body(request)
    if not body:
        return {}, as_msgpack
    try:
        data = (
            msgpack.unpackb(bytes(body), raw=False)
            if as_msgpack
            else json.loads(body, parse_constant=_not_json, parse_float=_finite, parse_int=_int64)
        )
    except (ValueError, RecursionError, msgpack.UnpackException) as exc:
        kind = "msgpack" if as_msgpack else "JSON"
        raise RequestRefused(400, f"Request body is not valid {kind}: {exc}") from None
    if not isinstance(data, dict):
        raise RequestRefused(400, f"Request body must be an object of keyword arguments, got {type(data).__name__}")
    return data, as_msgpack


async def read_body(request: Request) -> bytes:
    """The request's body, refused (413) past the hub's message size limit before it is all read."""
    limit = server_state(request).hub.settings.max_message_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise FrameTooLarge(f"Request body of {declared} bytes is above the limit of {limit} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise FrameTooLarge(f"Request body is above the limit of {limit} bytes")
    return bytes(body)


def _not_json(name: str) -> Any:
    """``NaN`` and ``Infinity`` are not JSON: refused, as no JSON answer could carry them back."""
    raise ValueError(f"{name} is not a JSON value")


_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1  # what msgpack, which carries the call, can encode


def _int64(text: str) -> int:
    """An integer beyond 64 bits could not be sent to the provider: refused."""
    value = int(text)
    if not _INT_MIN <= value <= _INT_MAX:
        raise ValueError(f"{text[:40]}... is out of range for a 64-bit integer")
    return value


def _finite(text: str) -> float:
    """A JSON number Python would read as infinity (``1e999``) is refused for the same reason."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is out of range for a number")
    return value


def _query_value(text: str) -> Any:
    if text.startswith(("{", "[")):
        try:
            return json.loads(text, parse_constant=_not_json, parse_float=_finite, parse_int=_int64)
        except (ValueError, RecursionError):
            return text
    # "nan", "inf" and 400-digit numbers stay text: neither msgpack nor JSON could carry them
    try:
        number = int(text)
    except ValueError:
        pass
    else:
        return number if _INT_MIN <= number <= _INT_MAX else text
    try:
        real = float(text)
    except ValueError:
        return text
    return real if math.isfinite(real) else text


def _check_built_in(info: svc_ids.ServiceInfo, user: User) -> None:
    """Over HTTP, a client's ``built-in`` service needs read permission on its workspace.

    HTTP calls reach the provider through the manager, whose messages carry the
    root user and the provider's own workspace: exactly the context in which
    the built-in service trusts its caller. Its ``get_service`` would hand a
    protected service (with its data) to anyone, and ``message_cache.process``
    would dispatch any message, e.g. a call of a protected function, as root.
    """
    ws = info["id"].partition("/")[0]
    if info["id"].endswith(":built-in") and not user.can(ws, Permission.READ):
        raise PermissionDenied(
            f"Permission denied: the built-in service of a client in workspace {ws} "
            "is not callable over HTTP without read permission on that workspace"
        )


async def call_function(request: Request) -> Response | EventStream:
    async def handler() -> Response | EventStream:
        user, own_ws = await request_user(request)
        allowance = caller_allowance(request, user)
        async with contextlib.AsyncExitStack() as held:
            held.enter_context(allowance.holding(1))  # a call of the caller's from before its body is read
            answer = await _call(request, user, own_ws, allowance, held)
            if isinstance(answer, EventStream):
                answer.exit = held.pop_all()  # a stream holds the call until its generator is closed
            return answer

    return await guard(request, handler)


async def _call(
    request: Request, user: User, own_ws: str, allowance: Allowance, held: contextlib.AsyncExitStack
) -> Response | EventStream:
    """``/{workspace}/services/{service_id}/{function}``: the function called as the request's user."""
    hub = server_state(request).hub
    kwargs, as_msgpack = await _read_kwargs(request)
    if request.path_params["service_id"] == "~":  # the workspace manager, as the request's user
        caller_ws = path_workspace(request)
        await _not_deleted(request, user, caller_ws)
        caller = await http_caller(
            hub, user=user, own_workspace=own_ws, workspace=caller_ws, anonymous=user is ANONYMOUS_HTTP
        )
        hub.metrics.http_calls.inc()
        with hub.http.charging(caller, allowance):  # its select: lookups are calls of the request's user or address
            done = await call_manager(hub, caller, request.path_params["function"], kwargs, workspace=caller_ws)
        return _respond(done, as_msgpack)
    named = f"{path_workspace(request)}/{request.path_params['service_id']}"
    if (key := hub.http.built_in(named, own_ws, user)) is not None:  # public/queue, admin-utils
        await _not_deleted(request, user, path_workspace(request))
        # in the caller's own workspace, whose queues are its own: the path's is the service's
        caller = await http_caller(
            hub, user=user, own_workspace=own_ws, workspace=own_ws, anonymous=user is ANONYMOUS_HTTP
        )
        hub.metrics.http_calls.inc()
        with hub.http.charging(caller, allowance):
            done = await call_built_in(hub, caller, key, request.path_params["function"], kwargs)
        return _respond(done, as_msgpack)
    info, user, service = await fetch_for_caller(request, user, own_ws, allowance)
    key = request.path_params["function"]
    target: Any = service
    for part in key.split("."):
        if isinstance(target, dict) and part in target:
            target = target[part]
        else:
            raise NotFound(f"{key} not found.")
    if callable(target):
        # held open while a generator streams: its items are calls from the same address
        await held.enter_async_context(acting_for(request, info, user, own_ws))
        target = await asyncio.wait_for(target(**kwargs), hub.settings.call_timeout)
        if inspect.isasyncgen(target):  # hypha-rpc's remote generator: streamed as it is read
            return EventStream(
                cast(AsyncGenerator[Any, None], target),
                as_msgpack=as_msgpack,
                encode=jsonable,
                item_timeout=hub.settings.call_timeout,
                exit=contextlib.AsyncExitStack(),
            )
    return _respond(target, as_msgpack)


async def fetch_for_caller(
    request: Request, user: User, own_ws: str, allowance: Allowance
) -> tuple[svc_ids.ServiceInfo, User, Any]:
    """The service the path names, fetched for the caller (:func:`resolve_service`'s rules), and the
    caller as it stands in the service's workspace; one HTTP call counted."""
    hub = server_state(request).hub
    info, user = await resolve_service(request, user, own_ws, allowance)
    _check_built_in(info, user)
    hub.metrics.http_calls.inc()
    timeout = hub.settings.call_timeout
    reads = user.can(info["id"].partition("/")[0], Permission.READ)
    fetching = hub.http.fetch_service(info, timeout=timeout, has_read=reads)
    return info, user, await asyncio.wait_for(fetching, timeout)


def acting_for(request: Request, info: svc_ids.ServiceInfo, user: User, own_ws: str) -> Any:
    """The block in which the service's functions are called as the HTTP caller, not the manager:
    acting within the service's workspace if the caller may read it, else within its own."""
    ws = info["id"].partition("/")[0]
    acting_ws = ws if user.can(ws, Permission.READ) else own_ws
    return server_state(request).http.acting_as(user.to_wire(acting_ws, "http"), acting_ws)

"""Services as MCP servers: ``/{workspace}/mcp/{service_id}/mcp`` and the workspace's ``/{workspace}/mcp``.

MCP's Streamable HTTP transport, stateless: each POST carries one JSON-RPC
message and is answered on its own, so any replica serves any request. Every
request is an HTTP service call of the request's caller (``Authorization:
Bearer``; anonymous reaches public services only): the service is resolved,
fetched and called with exactly the rules of ``/{workspace}/services/...``
(:mod:`~switchboard.server.http.http_services`), its rate and size bounds
included. A generator's items are sent as progress notifications when the
client asked for progress, and all of them are the tool's answer.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from switchboard.backends.patience import patience
from switchboard.errors import FrameTooLarge, JsonRpcError
from switchboard.hub.identity.users import User
from switchboard.hub.routing.limits import Allowance
from switchboard.protocol.hypha import services as svc_ids
from switchboard.server.http import mcp_native, mcp_tools
from switchboard.server.http.http_errors import error_response, status_of
from switchboard.server.http.http_services import (
    acting_for,
    caller_allowance,
    fetch_for_caller,
    guard,
    jsonable,
    path_workspace,
    read_body,
    request_user,
    server_state,
    visible_services,
)
from switchboard.server.http.mcp_native import Handler

log = logging.getLogger(__name__)

# JSON-RPC's codes, and the one the MCP SDKs use for a refused request
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602
REFUSED = -32001


def routes() -> list[Route]:
    return [
        Route("/{workspace}/mcp", workspace_endpoint, methods=["GET", "POST", "DELETE"]),
        Route("/{workspace}/mcp/", workspace_endpoint, methods=["GET", "POST", "DELETE"]),
        Route("/{workspace}/mcp/{service_id}/mcp", service_endpoint, methods=["GET", "POST", "DELETE"]),
        Route("/{workspace}/mcp/{service_id}", service_description, methods=["GET"]),
    ]


def _error(msg_id: Any, code: int, message: str, status: int = 200) -> JSONResponse:
    body = {"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}}
    return JSONResponse(body, status_code=status)


def _result(msg_id: Any, result: Any) -> JSONResponse:
    return JSONResponse({"jsonrpc": "2.0", "id": msg_id, "result": result})


async def _message(request: Request) -> dict[str, Any]:
    """The one JSON-RPC message the POST carries (batches are not part of the transport since 2025-06-18)."""
    body = await read_body(request)
    try:
        message = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise JsonRpcError(PARSE_ERROR, f"Request body is not valid JSON: {exc}") from None
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        raise JsonRpcError(INVALID_REQUEST, "Expected one JSON-RPC 2.0 message object")
    return message


async def _serve(
    request: Request, methods: Callable[[User, str, Allowance], Awaitable[dict[str, Handler]]]
) -> Response:
    """One POSTed message answered as the request's caller; a refusal keeps its HTTP status."""
    if request.method == "GET":  # no stream of the server's own: every answer rides its request
        return Response(status_code=405, headers={"Allow": "POST"})
    if request.method == "DELETE":  # no sessions to end
        return Response(status_code=405, headers={"Allow": "POST"})
    state = server_state(request)
    if not state.accepting:
        return _error(None, REFUSED, "Server is draining or starting, please retry", 503)
    msg_id: Any = None
    try:
        with patience():
            message = await _message(request)
            msg_id = message.get("id")
            method = message.get("method")
            if not isinstance(method, str) or msg_id is None:  # a notification or a response: nothing to answer
                return Response(status_code=202)
            user, own_ws = await request_user(request)
            allowance = caller_allowance(request, user)
            with allowance.holding(1):
                handlers = await methods(user, own_ws, allowance)
            params = message.get("params") or {}
            if not isinstance(params, dict):
                raise JsonRpcError(INVALID_PARAMS, "params must be an object")
            params = {k: v for k, v in params.items() if k != "_each"}  # the stream's own, never the client's
            if method == "initialize":
                return _result(msg_id, _initialized(params, handlers))
            if method == "ping":
                return _result(msg_id, {})
            if method not in handlers:
                raise JsonRpcError(METHOD_NOT_FOUND, f"Method not found: {method}")
            if method == "tools/call" and _progress_token(params) is not None and _streams(request):
                return _streamed(request, msg_id, params, handlers[method], allowance)
            with allowance.holding(1):
                return _result(msg_id, await handlers[method](params))
    except JsonRpcError as failure:  # a body that is no JSON-RPC request is the client's mistake: 400
        status = 400 if failure.code in (PARSE_ERROR, INVALID_REQUEST) else 200
        return _error(msg_id, failure.code, failure.message, status)
    except Exception as exc:
        status, detail = status_of(exc)
        if status >= 500:
            log.warning("MCP %s failed: %s", request.url.path, detail)
        response = _error(msg_id, REFUSED if status < 500 else -32603, detail, status)
        if "Retry-After" in (said := error_response(exc).headers):
            response.headers["Retry-After"] = said["Retry-After"]
        return response


def _initialized(params: dict[str, Any], handlers: dict[str, Handler]) -> dict[str, Any]:
    capabilities: dict[str, Any] = {}
    for kind in ("tools", "resources", "prompts"):
        if f"{kind}/list" in handlers:
            capabilities[kind] = {"listChanged": False}
    return {
        "protocolVersion": mcp_tools.protocol_version(params.get("protocolVersion")),
        "capabilities": capabilities,
        "serverInfo": {"name": "switchboard", "version": "0.1.0"},
    }


def _progress_token(params: dict[str, Any]) -> Any:
    meta = params.get("_meta")
    return meta.get("progressToken") if isinstance(meta, dict) else None


def _streams(request: Request) -> bool:
    return "text/event-stream" in request.headers.get("accept", "")


def _streamed(
    request: Request, msg_id: Any, params: dict[str, Any], handler: Handler, allowance: Allowance
) -> Response:
    """``tools/call`` answered as a stream: a progress notification per generated item, then the result."""
    token = _progress_token(params)
    queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(maxsize=16)

    async def run() -> dict[str, Any]:
        count = 0

        async def each(item: Any) -> None:
            nonlocal count
            count += 1
            note = {"progressToken": token, "progress": count, "message": mcp_tools.content(jsonable(item))[0]["text"]}
            await queue.put({"jsonrpc": "2.0", "method": "notifications/progress", "params": note})

        answer: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id}
        try:
            with allowance.holding(1):
                answer["result"] = await handler({**params, "_each": each})
        except JsonRpcError as failure:
            answer["error"] = {"code": failure.code, "message": failure.message}
        except Exception as exc:
            answer["error"] = {"code": REFUSED, "message": status_of(exc)[1]}
        await queue.put(None)  # not when cancelled: then no one reads the queue any more
        return answer

    async def events() -> AsyncIterator[bytes]:
        task = asyncio.ensure_future(run())
        try:
            while (note := await queue.get()) is not None:
                yield f"event: message\ndata: {json.dumps(note)}\n\n".encode()
            yield f"event: message\ndata: {json.dumps(await task)}\n\n".encode()
        finally:
            task.cancel()

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-store"})


# -- a service's endpoint -------------------------------------------------------------------------


async def service_endpoint(request: Request) -> Response:
    async def methods(user: User, own_ws: str, allowance: Allowance) -> dict[str, Handler]:
        info, user, service = await fetch_for_caller(request, user, own_ws, allowance)
        return _service_methods(request, info, user, own_ws, service)

    return await _serve(request, methods)


async def service_description(request: Request) -> Response:
    """``GET /{workspace}/mcp/{service_id}``: the service's MCP endpoint and what it offers, as JSON
    (Hypha's shape), for the caller the service's endpoint would serve."""

    async def handler() -> Response:
        user, own_ws = await request_user(request)
        allowance = caller_allowance(request, user)
        with allowance.holding(1):
            info, user, service = await fetch_for_caller(request, user, own_ws, allowance)
            methods = _service_methods(request, info, user, own_ws, service)
            offered = {}
            for kind, key in (("tools", "tools"), ("resources", "resources"), ("prompts", "prompts")):
                listing = methods.get(f"{kind}/list")
                offered[kind] = (await listing({}))[key] if listing is not None else []
        ws, service_id = path_workspace(request), request.path_params["service_id"]
        described = {k: info.get(k) for k in ("id", "name", "type", "description")}
        endpoints = {"streamable_http": f"/{ws}/mcp/{service_id}/mcp"}
        return JSONResponse(jsonable({"service": described, "endpoints": endpoints, "capabilities": offered}))

    return await guard(request, handler)


def _at(service: Any, path: tuple[str, ...]) -> Any:
    target = service
    for part in path:
        target = target.get(part) if isinstance(target, dict) else None
    return target


def _service_methods(
    request: Request, info: svc_ids.ServiceInfo, user: User, own_ws: str, service: Any
) -> dict[str, Handler]:
    hub = server_state(request).hub
    found = mcp_tools.catalog(service, dict(info))
    limit = hub.settings.max_message_bytes

    async def call(path: tuple[str, ...], kwargs: dict[str, Any], each: Any = None) -> Any:
        target = _at(service, path)
        if not callable(target):
            raise JsonRpcError(INVALID_PARAMS, f"{'.'.join(path)} is not a function of this service")
        async with acting_for(request, info, user, own_ws):
            answer = target(**kwargs)
            if inspect.isawaitable(answer):
                answer = await asyncio.wait_for(answer, hub.settings.call_timeout)
            if not hasattr(answer, "__aiter__"):
                return answer
            items, size = [], 0
            items_left = aiter(answer)
            while True:  # a generator: every item, each within the call timeout, all bounded as one message is
                try:
                    item = await asyncio.wait_for(anext(items_left), hub.settings.call_timeout)
                except StopAsyncIteration:
                    break
                size += len(json.dumps(jsonable(item)))
                if size > limit:
                    raise FrameTooLarge(f"The generated items are above the limit of {limit} bytes")
                items.append(item)
                if each is not None:
                    await each(item)
            return items

    async def tools_list(params: dict[str, Any]) -> Any:
        return {"tools": [t.listed() for t in found.tools.values()]}

    async def tools_call(params: dict[str, Any]) -> Any:
        name, arguments = params.get("name"), params.get("arguments") or {}
        if name not in found.tools:
            raise JsonRpcError(INVALID_PARAMS, f"Unknown tool: {name}")
        if not isinstance(arguments, dict):
            raise JsonRpcError(INVALID_PARAMS, "arguments must be an object")
        try:
            answer = await call(found.tools[name].path, arguments, params.get("_each"))
        except JsonRpcError:
            raise
        except Exception as exc:  # the function's own failure: a tool result the agent reads
            return {"content": [{"type": "text", "text": status_of(exc)[1]}], "isError": True}
        return {"content": mcp_tools.content(jsonable(answer)), "isError": False}

    async def resources_list(params: dict[str, Any]) -> Any:
        return {"resources": [e.listed for e in found.resources.values()]}

    async def resources_read(params: dict[str, Any]) -> Any:
        entry = found.resources.get(str(params.get("uri")))
        if entry is None:
            raise JsonRpcError(INVALID_PARAMS, f"Resource '{params.get('uri')}' not found")
        value = entry.text if entry.path is None else await call(entry.path, {})
        return mcp_tools.resource_result(entry, jsonable(value))

    async def templates_list(params: dict[str, Any]) -> Any:
        return {"resourceTemplates": []}

    async def prompts_list(params: dict[str, Any]) -> Any:
        return {"prompts": [e.listed for e in found.prompts.values()]}

    async def prompts_get(params: dict[str, Any]) -> Any:
        name, arguments = params.get("name"), params.get("arguments") or {}
        entry = found.prompts.get(str(name))
        if entry is None or entry.path is None:
            raise JsonRpcError(INVALID_PARAMS, f"Prompt '{name}' not found")
        return mcp_tools.prompt_result(str(name), jsonable(await call(entry.path, dict(arguments))))

    if mcp_tools.is_native(service):
        return mcp_native.methods(service, call)
    handlers: dict[str, Handler] = {"tools/list": tools_list, "tools/call": tools_call}
    if found.resources:
        handlers |= {"resources/list": resources_list, "resources/read": resources_read}
        handlers["resources/templates/list"] = templates_list
    if found.prompts:
        handlers |= {"prompts/list": prompts_list, "prompts/get": prompts_get}
    return handlers


# -- the workspace's endpoint ---------------------------------------------------------------------

LIST_SERVICES = {
    "name": "list_services",
    "description": "List the services of this workspace you may use, each with its MCP endpoint.",
    "inputSchema": {"type": "object", "properties": {}, "required": []},
}


async def workspace_endpoint(request: Request) -> Response:
    """The hub's own tools for an agent in one workspace: what it may use there, before it calls."""

    async def methods(user: User, own_ws: str, allowance: Allowance) -> dict[str, Handler]:
        ws = path_workspace(request)
        base = server_state(request).hub.settings.public_base_url

        async def tools_list(params: dict[str, Any]) -> Any:
            return {"tools": [LIST_SERVICES]}

        async def tools_call(params: dict[str, Any]) -> Any:
            if params.get("name") != LIST_SERVICES["name"]:
                raise JsonRpcError(INVALID_PARAMS, f"Unknown tool: {params.get('name')}")
            found = []
            for info in await visible_services(request, user, own_ws, ws):
                service_id = info["id"].partition("/")[2]
                entry = {k: info.get(k) for k in ("id", "name", "type", "description")}
                entry["mcp_url"] = f"{base}/{ws}/mcp/{service_id}/mcp"
                found.append(jsonable(entry))
            return {"content": [{"type": "text", "text": json.dumps(found)}], "structuredContent": {"services": found}}

        return {"tools/list": tools_list, "tools/call": tools_call}

    return await _serve(request, methods)

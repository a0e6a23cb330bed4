"""Apps clients serve over HTTP: ``/{workspace}/apps/{service_id}/{path}``, as in Hypha.

A service of ``type: "asgi"`` is called ``serve({"scope", "receive", "send"})``: its app reads the
request through ``receive`` and answers through ``send``, each a call back into the hub, so a
response streams out piece by piece as the app sends it (each piece waits for the client to take
the one before). A service of ``type: "functions"`` is a dict of functions, each an endpoint:
``path`` names one (nested dicts by ``/``; ``index``; ``default`` for the rest), called with the
request as a dict, answering ``{"status", "headers", "body"}``.

The service is found, and allowed, as for ``/{workspace}/services/...`` (:func:`resolve_service`:
visibility, ``?_mode=``, a deleted workspace), and called as the request's user with an address of
its own (docs/authorization.md, "HTTP callers keep their identity"); the request is one call of its
user (without a token, of its address) for as long as it runs, under the bounds every HTTP call has.
The decisions are :mod:`switchboard.server.http.app_exchange`'s; here they are carried out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from switchboard.errors import NotFound, RequestRefused
from switchboard.hub.identity.users import Permission, User
from switchboard.hub.routing.limits import Allowance
from switchboard.protocol.hypha import ids
from switchboard.protocol.hypha.services import ServiceQuery
from switchboard.server.http import app_exchange as rules
from switchboard.server.http.http_errors import error_response, refusal, status_of
from switchboard.server.http.http_services import (
    caller_allowance,
    request_user,
    resolve_service,
    server_state,
)

log = logging.getLogger(__name__)

# http.request messages the watch for a disconnect lets by (only the empty body of a bodiless request comes)
WATCH_READS = 16


def routes() -> list[Route]:
    gateway = AppGateway()
    return [
        Route("/{workspace}/apps/{service_id}", to_slash, methods=["GET", "HEAD"]),
        Route("/{workspace}/apps/{service_id}/{path:path}", gateway),
    ]


async def to_slash(request: Request) -> Response:
    """``/{workspace}/apps/{id}`` is the app's root, ``.../{id}/``, as Hypha redirects it (the app's
    relative links then resolve below it)."""
    p = request.path_params
    return RedirectResponse(f"/{p['workspace']}/apps/{p['service_id']}/", status_code=307)


class Exchange:
    """One request's ``receive`` and ``send``, as the app calls them through the hub."""

    def __init__(self, receive: Receive, send: Send, *, max_request: int, max_response: int) -> None:
        self._receive, self._send = receive, send
        self.body = rules.RequestBody(max_request)
        self.response = rules.ResponseGuard(max_response)
        self.started = asyncio.Event()
        self.gone = asyncio.Event()  # the client went away, or the exchange ended
        self._reading = asyncio.Lock()
        self._watch: asyncio.Task[None] | None = None
        self._pending_empty = False  # a bodiless request's one message, answered without a read
        self.closed = False  # the hub answers (or answered) the request itself: the app's sends are refused

    def expect(self, headers: Any) -> None:
        """What the request's head announces: no body (then a disconnect is watched for at once), or
        one within the bound (:class:`~switchboard.errors.FrameTooLarge` for a larger declared length)."""
        if not rules.request_has_body(headers, self.body.max_bytes):
            self._pending_empty = True
            self.body.complete = True
            self._watch_for_disconnect()

    async def receive(self) -> dict[str, Any]:
        """The app's ``receive``: the request body, then ``http.disconnect`` once the client is gone
        or the response is done."""
        if self._pending_empty:
            self._pending_empty = False
            return {"type": "http.request", "body": b"", "more_body": False}
        if not self.body.complete:
            async with self._reading:
                if not self.body.complete:
                    message = self.body.take(await self._receive())
                    self._read(message)
                    return message
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def read_all(self) -> bytes:
        """The whole request body (for a function), within its bound."""
        data = bytearray()
        for _ in range(self.body.max_bytes + 2):  # each message but the last brings at least a byte, or ends
            message = await self.receive()
            if message["type"] != "http.request":
                break
            data += message["body"]
            if not message["more_body"]:
                break
        return bytes(data)

    async def send(self, message: Any) -> None:
        """The app's ``send``: checked (:class:`~switchboard.server.http.app_exchange.ResponseGuard`), then
        written; an app sending to a client that went away is told so."""
        if self.closed or (self.gone.is_set() and self.response.started):
            raise ConnectionError("the HTTP client went away, or the hub answered the request itself")
        checked = self.response.accept(message)
        await self._send(checked)
        if checked["type"] == "http.response.start":
            self.started.set()

    def _read(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.disconnect":
            self.gone.set()
        elif self.body.complete:  # from now on only a disconnect can come: watched for
            self._watch_for_disconnect()

    def _watch_for_disconnect(self) -> None:
        if self._watch is None:
            self._watch = asyncio.ensure_future(self._watching())

    async def _watching(self) -> None:
        for _ in range(WATCH_READS):
            if (await self._receive())["type"] == "http.disconnect":
                break
        self.gone.set()

    async def close(self) -> None:
        """The app is done (or given up on): a ``receive`` still waiting returns ``http.disconnect``."""
        self.closed = True
        self.gone.set()
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch


class AppGateway:
    """The ASGI endpoint of ``/{workspace}/apps/{service_id}/{path}`` (see the module docstring)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        state = server_state(request)
        settings = state.hub.settings
        exchange = Exchange(
            receive, send, max_request=settings.max_message_bytes, max_response=settings.max_app_response_bytes
        )
        try:
            exchange.expect(scope.get("headers") or [])
            if not state.accepting:
                response = refusal(503, "Server is draining or starting, please retry")
                response.headers["Retry-After"] = "1"
                await response(scope, receive, send)
                return
            await self._serve(request, exchange)
        except Exception as exc:
            status, detail = status_of(exc)
            if exchange.response.started:
                log.info("HTTP %s %s: the app's response broke off: %s", request.method, request.url.path, detail)
            else:
                if status >= 500:
                    state.hub.metrics.call_errors.inc()
                    log.warning("HTTP %s %s failed: %s", request.method, request.url.path, detail)
                else:
                    log.info("HTTP %s %s refused (%d): %s", request.method, request.url.path, status, detail)
                await error_response(exc)(scope, receive, send)
        finally:
            await exchange.close()

    async def _serve(self, request: Request, exchange: Exchange) -> None:
        hub = server_state(request).hub
        user, own_ws = await request_user(request)
        ws = ids.check_id(request.path_params["workspace"], "workspace")
        allowance = caller_allowance(request, user)
        with allowance.holding(1):  # one call of the caller's while the app serves it
            info, user = await self._find(request, user, own_ws, ws, allowance)  # an owner stands as admin
            kind = info.get("type")
            if kind not in rules.APP_TYPES:
                raise RequestRefused(
                    400, f"Invalid service type: {kind} (an app is a service of type asgi or functions)"
                )
            hub.metrics.http_calls.inc()
            timeout = hub.settings.call_timeout
            reads = user.can(ws, Permission.READ)
            fetching = hub.http.fetch_service(info, timeout=timeout, has_read=reads)
            service = await asyncio.wait_for(fetching, timeout)
            app_scope = rules.app_scope(
                request.scope,
                workspace=ws,
                service_id=request.path_params["service_id"],
                path=request.path_params.get("path", ""),
            )
            acting_ws = ws if reads else own_ws  # the provider sees the HTTP caller, as for a call
            async with hub.http.acting_as(user.to_wire(acting_ws, "http"), acting_ws) as acting:
                if kind == "functions":
                    await self._call_function(service, app_scope, exchange, acting.user, timeout)
                else:
                    await self._run_app(service, app_scope, exchange, timeout)

    async def _find(self, request: Request, user: User, own_ws: str, ws: str, allowance: Allowance) -> tuple[Any, User]:
        """The service and the caller as it stands in ``ws`` (its ownership counted), or a 404 that
        says whether the workspace itself is unknown (Hypha's texts)."""
        try:
            return await resolve_service(request, user, own_ws, allowance)
        except NotFound as exc:
            hub = server_state(request).hub
            recorded = await hub.http.workspaces.get(ws) is not None
            populated = recorded or bool(await hub.http.find(ServiceQuery(ws)))
            raise NotFound(rules.missing(ws, recorded=recorded, populated=populated, detail=str(exc))) from None

    async def _run_app(self, service: Any, scope: dict[str, Any], exchange: Exchange, timeout: float) -> None:
        """``serve`` the request; its response must start within ``timeout``, then streams for as
        long as the app sends and the client takes it."""
        serve = dict.get(service, "serve")
        if not callable(serve):
            raise NotFound("the asgi service has no serve function")
        call = asyncio.ensure_future(serve({"scope": scope, "receive": exchange.receive, "send": exchange.send}))
        started = asyncio.ensure_future(exchange.started.wait())
        gone = asyncio.ensure_future(exchange.gone.wait())
        try:
            await asyncio.wait({call, started}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if not call.done() and not started.done():
                raise TimeoutError("the app did not start its response in time")
            await asyncio.wait({call, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not call.done():  # the client went away: the app is told on its next send or receive
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(call), timeout)
                return
            call.result()  # the app's failure, as the provider reported it
            if not exchange.response.started:
                raise RequestRefused(500, "The app returned without a response")
            if not exchange.response.finished:
                await exchange.send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            exchange.closed = True  # before an error is answered: the app cannot start a response meanwhile
            for task in (call, started, gone):
                task.cancel()
            await asyncio.gather(call, started, gone, return_exceptions=True)

    async def _call_function(
        self, service: Any, scope: dict[str, Any], exchange: Exchange, user: dict[str, Any], timeout: float
    ) -> None:
        function, function_path = rules.find_function(service, scope["path"])
        if function is None:
            raise NotFound(f"Function not found: {scope['path'].strip('/')}")
        body = await exchange.read_all()
        event = rules.function_event(scope, body=body, user=user, function_path=function_path)
        result = await asyncio.wait_for(function(event), timeout)
        status, headers, data = rules.function_reply(result, exchange.response.max_bytes)
        await exchange.send({"type": "http.response.start", "status": status, "headers": headers})
        await exchange.send({"type": "http.response.body", "body": data, "more_body": False})

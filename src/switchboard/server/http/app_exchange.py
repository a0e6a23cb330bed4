"""What passes between an HTTP request and an app a client serves at ``/{workspace}/apps/{service_id}/...``.

The decisions only, without I/O (:mod:`switchboard.server.http.http_apps` carries them out):

* :func:`app_scope`: the ASGI scope a ``type: "asgi"`` service's ``serve`` receives, as
  Hypha builds it: the request's own, with ``path`` (and ``raw_path``) the part after the
  service id, plus ``workspace`` and ``service_id``; the ``Authorization`` header stays (the
  caller's token, as in Hypha), the HTTP-streaming transport's cookies do not: they would let
  the app speak as the visitor's stream.
* :class:`RequestBody` and :class:`ResponseGuard`: what the app receives and may send back,
  in ASGI's order, each bounded in bytes.
* :func:`find_function`, :func:`function_event` and :func:`function_reply`: a ``type:
  "functions"`` service, a dict of functions each an HTTP endpoint, called as Hypha calls them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from switchboard.errors import FrameTooLarge, ProtocolError
from switchboard.protocol.hypha.values import plain

APP_TYPES = ("asgi", "ASGI", "functions")
HUB_COOKIE = "sb_rpc_"  # the HTTP-streaming transport's stream cookies (server/http/http_rpc.py)
SCOPE_KEYS = ("type", "asgi", "http_version", "server", "client", "scheme", "method", "root_path", "query_string")
_TOKEN = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # a header name (RFC 9110 token)
_BAD_VALUE = re.compile(rb"[\x00\r\n]")


def app_scope(scope: Mapping[str, Any], *, workspace: str, service_id: str, path: str) -> dict[str, Any]:
    """The scope an ASGI app is served with: plain data only (it crosses the wire)."""
    made: dict[str, Any] = {}
    for key in SCOPE_KEYS:
        if key in scope:
            value = scope[key]
            made[key] = list(value) if isinstance(value, tuple) else value
    made["asgi"] = dict(scope.get("asgi") or {"version": "3.0"})
    path = path if path.startswith("/") else "/" + path
    made["path"] = path
    made["raw_path"] = path.encode("latin-1", "replace")
    made["headers"] = [[k, v] for k, v in _without_hub_cookies(scope.get("headers") or [])]
    made["workspace"] = workspace
    made["service_id"] = service_id
    return made


def _without_hub_cookies(headers: Any) -> list[tuple[bytes, bytes]]:
    kept: list[tuple[bytes, bytes]] = []
    for name, value in headers:
        if bytes(name).lower() == b"cookie":
            pieces = [p for p in bytes(value).split(b";") if not p.strip().startswith(HUB_COOKIE.encode())]
            if not any(p.strip() for p in pieces):
                continue
            value = b";".join(pieces).strip()
        kept.append((bytes(name), bytes(value)))
    return kept


def request_has_body(headers: Any, max_bytes: int) -> bool:
    """Whether the request announces a body (a length above 0, or chunks); :class:`FrameTooLarge`
    at once for a declared length above ``max_bytes``, before any app is asked."""
    for name, value in headers:
        name = bytes(name).lower()
        if name == b"transfer-encoding":
            return True
        if name == b"content-length":
            declared = bytes(value).strip()
            if declared.isdigit() and int(declared) > max_bytes:
                raise FrameTooLarge(f"Request body of {int(declared)} bytes is above the limit of {max_bytes} bytes")
            return declared not in (b"", b"0")
    return False


class RequestBody:
    """The request body as the app reads it, one ``http.request`` message at a time, at most ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.read = 0
        self.complete = False

    def take(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """``message`` from the server, as the app gets it; :class:`FrameTooLarge` past the bound."""
        if message.get("type") != "http.request":
            self.complete = True
            return {"type": "http.disconnect"}
        body = bytes(message.get("body", b""))
        self.read += len(body)
        if self.read > self.max_bytes:
            self.complete = True
            raise FrameTooLarge(f"Request body is above the limit of {self.max_bytes} bytes")
        more = bool(message.get("more_body", False))
        self.complete = not more
        return {"type": "http.request", "body": body, "more_body": more}


class ResponseGuard:
    """What an app may send back, in ASGI's order: one ``http.response.start``, then
    ``http.response.body`` pieces until one says ``more_body: False``; at most ``max_bytes`` of body."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.started = False
        self.finished = False
        self.sent = 0

    def accept(self, message: Any) -> dict[str, Any]:
        """``message`` as the server is to get it, or :class:`ProtocolError` saying what is wrong."""
        message = plain(message)
        if not isinstance(message, dict):
            raise ProtocolError(f"an ASGI message is a dict, not {type(message).__name__}")
        kind = message.get("type")
        if self.finished:
            raise ProtocolError(f"{kind} sent after the response was complete")
        if kind == "http.response.start":
            if self.started:
                raise ProtocolError("http.response.start sent twice")
            status = check_status(message.get("status"))
            self.started = True
            return {"type": kind, "status": status, "headers": check_headers(message.get("headers") or [])}
        if kind == "http.response.body":
            if not self.started:
                raise ProtocolError("http.response.body sent before http.response.start")
            body = message.get("body", b"")
            if not isinstance(body, bytes | bytearray):
                raise ProtocolError(f"http.response.body's body is bytes, not {type(body).__name__}")
            self.sent += len(body)
            if self.sent > self.max_bytes:
                raise FrameTooLarge(f"Response body is above the limit of {self.max_bytes} bytes")
            more = bool(message.get("more_body", False))
            self.finished = not more
            return {"type": kind, "body": bytes(body), "more_body": more}
        raise ProtocolError(f"unknown ASGI message type {str(kind)[:64]!r}")


def check_status(status: Any) -> int:
    if type(status) is not int or not 100 <= status <= 599:
        raise ProtocolError(f"an HTTP status is an integer from 100 to 599, not {str(status)[:32]!r}")
    return status


def check_headers(headers: Any) -> list[tuple[bytes, bytes]]:
    """Response headers as ``(name, value)`` bytes, from a list of pairs or a dict; no line breaks in
    them, and no cookie of the hub's (an app may not set the HTTP-streaming transport's)."""
    pairs = list(headers.items()) if isinstance(headers, dict) else headers
    if not isinstance(pairs, list):
        raise ProtocolError("response headers are a list of [name, value] pairs or a dict")
    checked: list[tuple[bytes, bytes]] = []
    for pair in pairs:
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            raise ProtocolError("a response header is a [name, value] pair")
        name, value = (_header_bytes(part) for part in pair)
        if not _TOKEN.match(name) or _BAD_VALUE.search(value):
            raise ProtocolError(f"invalid response header {name[:64]!r}")
        name = name.lower()
        if name == b"set-cookie" and value.lstrip().startswith(HUB_COOKIE.encode()):
            raise ProtocolError("an app may not set the hub's own cookies")
        checked.append((name, value))
    return checked


def _header_bytes(part: Any) -> bytes:
    if isinstance(part, bytes | bytearray):
        return bytes(part)
    if isinstance(part, str):
        try:
            return part.encode("latin-1")
        except UnicodeEncodeError:
            raise ProtocolError("a response header is latin-1 text") from None
    if isinstance(part, int) and not isinstance(part, bool):
        return str(part).encode()
    raise ProtocolError(f"a response header is text, not {type(part).__name__}")


# -- type: "functions" -----------------------------------------------------------


def _nested(service: Mapping[str, Any], parts: list[str]) -> Callable[..., Any] | None:
    current: Any = service
    for part in parts:
        if isinstance(current, Mapping) and part in current:
            current = current[part]
        else:
            return None
    return current if callable(current) else None


def find_function(service: Mapping[str, Any], path: str) -> tuple[Callable[..., Any] | None, str | None]:
    """The function serving ``path`` and, when it is the ``default`` one, the path it is given.

    As in Hypha: ``a/b`` is ``service["a"]["b"]``; the empty path is ``index``; else
    ``a/b/index``; else ``default``, told the path it stands in for (``function_path``).
    """
    path = path.strip("/") or "index"
    parts = path.split("/")
    found = _nested(service, parts)
    if found is None and len(parts) > 1:
        found = _nested(service, [*parts, "index"])
    if found is not None:
        return found, None
    fallback = service.get("default")
    if callable(fallback):
        return fallback, "/" if path == "index" else "/" + path
    return None, None


def function_event(
    scope: Mapping[str, Any], *, body: bytes, user: dict[str, Any], function_path: str | None
) -> dict[str, Any]:
    """What a function receives, as in Hypha: the request's scope with text where ASGI has bytes
    (``query_string``, ``raw_path``), ``headers`` as a dict, ``body`` (``None`` when empty) and
    the caller (``user``, as a call's ``context["user"]``)."""
    event = dict(scope)
    event["query_string"] = bytes(scope.get("query_string", b"")).decode("latin-1")
    event["raw_path"] = bytes(scope.get("raw_path", b"")).decode("latin-1")
    event["headers"] = {bytes(k).decode("latin-1").lower(): bytes(v).decode("latin-1") for k, v in scope["headers"]}
    event["body"] = body or None
    event["user"] = user
    if function_path is not None:
        event["function_path"] = function_path
    return event


def function_reply(result: Any, max_bytes: int) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """A function's answer (``{"status", "headers", "body"}``) as status, headers and body bytes."""
    result = plain(result)
    if not isinstance(result, dict):
        raise ProtocolError(f"a function answers a dict with status, headers and body, not {type(result).__name__}")
    status = check_status(result.get("status", 200))
    headers = check_headers(result.get("headers") or {})
    body = result.get("body")
    if body is None:
        data = b""
    elif isinstance(body, str):
        data = body.encode()
    elif isinstance(body, bytes | bytearray):
        data = bytes(body)
    else:
        raise ProtocolError(f"a function's body is text or bytes, not {type(body).__name__}")
    if len(data) > max_bytes:
        raise FrameTooLarge(f"Response body is above the limit of {max_bytes} bytes")
    return status, headers, data


def missing(workspace: str, *, recorded: bool, populated: bool, detail: str) -> str:
    """What a request for a service that is not there is told: Hypha's text for a workspace that
    neither has a record nor a client (``does not exist or is not accessible``), else ``detail``."""
    if recorded or populated or workspace == "public":
        return detail
    return f"Workspace {workspace} does not exist or is not accessible"

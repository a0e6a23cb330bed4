"""How the HTTP endpoints answer an error: one table from error classes to statuses.

Every endpoint (``/rpc``, ``/{workspace}/services/...``, ``/api/status``)
answers a failure as JSON ``{"success": false, "detail": ...}`` with the status
:data:`STATUS` gives the error's class (the first row it is an instance of).
:class:`~switchboard.errors.RequestRefused` carries a status of its own.

A provider's exception reaches the hub as hypha-rpc's ``RemoteException``,
which carries only text (see :func:`remote_error_type`); the type named there
is looked up in :data:`REMOTE_STATUS`.
"""

from __future__ import annotations

import builtins
import math
import re
from collections.abc import Callable

from hypha_rpc.rpc import RemoteException
from starlette.responses import JSONResponse

from switchboard.errors import (
    AuthError,
    BackendError,
    FrameTooLarge,
    NotFound,
    PermissionDenied,
    ProtocolError,
    RateLimited,
    RequestRefused,
)

# (class, status, detail); the first row the error is an instance of applies
STATUS: tuple[tuple[type[BaseException], int, Callable[[BaseException], str]], ...] = (
    (NotFound, 404, lambda exc: f"KeyError: {exc}"),
    (PermissionDenied, 403, lambda exc: f"PermissionError: {exc}"),
    (AuthError, 401, lambda exc: f"Authentication error: {exc}"),
    (FrameTooLarge, 413, str),
    (ProtocolError, 400, lambda exc: f"ValueError: {exc}"),
    (BackendError, 503, str),  # its message says to retry already
    (RateLimited, 429, str),
    (TimeoutError, 504, lambda exc: "TimeoutError: the service did not answer in time"),
)

# a provider's exception, by the type its text names: its fault (500) unless the caller's
REMOTE_STATUS: tuple[tuple[type[BaseException], int], ...] = (
    (PermissionError, 403),
    (TypeError, 400),  # wrong arguments
    (ValueError, 400),
    (AssertionError, 400),
)


def status_of(exc: BaseException) -> tuple[int, str]:
    """The status and detail an HTTP endpoint answers ``exc`` with."""
    if isinstance(exc, RequestRefused):
        return exc.status, exc.detail
    if isinstance(exc, RemoteException):
        return _remote_status(remote_error_type(exc)), f"RemoteException: {exc}"
    for kind, status, detail in STATUS:
        if isinstance(exc, kind):
            return status, detail(exc)
    return 500, f"{type(exc).__name__}: {exc}"


def error_response(exc: BaseException) -> JSONResponse:
    """The answer to ``exc``: its status and detail, and when to try again if it says."""
    status, detail = status_of(exc)
    response = refusal(status, detail)
    if isinstance(exc, RateLimited):
        response.headers["Retry-After"] = str(max(1, min(3600, math.ceil(exc.retry_after))))
    return response


def refusal(status: int, detail: str) -> JSONResponse:
    return JSONResponse({"success": False, "detail": detail}, status_code=status)


# "ValueError: msg" or "pkg.mod.Error: msg" at the start of a line (frames are indented)
_RAISED = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*): ", re.M)


def remote_error_type(exc: RemoteException) -> str | None:
    """The class name of the exception a provider raised, read from ``exc``'s text.

    hypha-rpc sends a provider's exception as text only: its message and
    formatted traceback (``{"_rtype": "error", "_rvalue": ..., "_rtrace": ...}``);
    the Python provider first wraps it in a plain ``Exception`` of its
    traceback, the JavaScript one sends ``String(error)`` and ``error.stack``.
    The raised type is thus the last unindented ``Name: message`` line of a
    traceback, the wrapping ``Exception: Traceback ...`` excepted. ``None`` if
    the text names none.
    """
    names = [
        m.group(1)
        for m in _RAISED.finditer(str(exc))
        if not (m.group(1) == "Exception" and str(exc).startswith("Traceback", m.end()))
    ]
    return names[-1] if names else None


def _remote_status(name: str | None) -> int:
    kind = getattr(builtins, name, None) if name else None
    if isinstance(kind, type) and issubclass(kind, BaseException):
        for cls, status in REMOTE_STATUS:
            if issubclass(kind, cls):
                return status
    return 500
